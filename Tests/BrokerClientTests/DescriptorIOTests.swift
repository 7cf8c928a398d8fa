@testable import BrokerClient
import Foundation
import SystemCalls
import XCTest

/// Bytes a provider already holds are written on the connection's own thread only when that
/// cannot block: into an empty pipe that holds them all. Otherwise nothing is written there.
final class DescriptorIOTests: XCTestCase {
    private func pipe(capacity: Int32) throws -> (readEnd: FileDescriptor, writeEnd: FileDescriptor) {
        let pipe = try FileDescriptor.makePipe(nonBlocking: false)
        try pipe.writeEnd.setPipeCapacity(capacity)
        return pipe
    }

    func testAnEmptyPipeThatHoldsAllOfItIsWrittenAtOnce() throws {
        let (readEnd, writeEnd) = try pipe(capacity: 65536)
        defer { readEnd.closeQuietly() }
        let bytes = Data((0..<65536).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        XCTAssertTrue(try DescriptorIO.writeWithoutWaiting(bytes, toPipe: writeEnd))
        writeEnd.closeQuietly()
        var received = Data()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 17, alignment: 1)
        defer { buffer.deallocate() }
        while case let n = try readEnd.readSome(into: buffer), n > 0 {
            received.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[..<n]))
        }
        XCTAssertEqual(received, bytes)
    }

    func testMoreThanThePipeHoldsIsLeftForAThreadThatMayWait() throws {
        let (readEnd, writeEnd) = try pipe(capacity: 65536)
        defer { readEnd.closeQuietly(); writeEnd.closeQuietly() }
        XCTAssertFalse(try DescriptorIO.writeWithoutWaiting(Data(count: 65537), toPipe: writeEnd))
        XCTAssertEqual(try readEnd.bytesPending(), 0, "nothing was written")
    }

    func testAPipeThatAlreadyHoldsBytesIsLeftForAThreadThatMayWait() throws {
        let (readEnd, writeEnd) = try pipe(capacity: 65536)
        defer { readEnd.closeQuietly(); writeEnd.closeQuietly() }
        try Data([1]).withUnsafeBytes { try writeEnd.writeFully($0) }
        XCTAssertFalse(try DescriptorIO.writeWithoutWaiting(Data([2, 3]), toPipe: writeEnd))
        XCTAssertEqual(try readEnd.bytesPending(), 1, "only the byte before")
    }

    func testAReaderThatLeftIsABrokenPipeNotASignal() throws {
        let (readEnd, writeEnd) = try pipe(capacity: 65536)
        defer { writeEnd.closeQuietly() }
        readEnd.closeQuietly()
        XCTAssertThrowsError(try DescriptorIO.writeWithoutWaiting(Data([1]), toPipe: writeEnd)) { error in
            XCTAssertEqual(error as? Errno, .brokenPipe)
        }
    }
}

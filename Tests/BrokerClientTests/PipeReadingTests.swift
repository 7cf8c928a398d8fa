@testable import BrokerClient
import BusKit
import Foundation
import Glibc
import SystemCalls
import XCTest

/// A data load's pipe is waited for on the connection's loop, and its first chunk read there;
/// the rest is read on a dispatch thread. No thread sits in read(2) while the pipe is empty.
final class PipeReadingTests: XCTestCase {
    /// One chunk as the reader handed it on, and whether that was on the loop's thread.
    private struct Chunk: Sendable {
        let bytes: Data
        let onLoop: Bool
    }

    private static let chunkSize = 65536

    private var loop: EventLoop!

    override func setUpWithError() throws {
        loop = try EventLoop()
        loop.start(name: "pipe-reading-test")
    }

    override func tearDown() {
        loop.stop()
        loop = nil
    }

    /// Reads `fd` as a stream load does, in a task that prefers the loop, or, `fromLoop` false,
    /// as `loadData` may, from a task that does not.
    private func read(_ fd: FileDescriptor, into chunks: Locked<[Chunk]>, fromLoop: Bool = true) -> Task<UInt64, Error> {
        let loop = loop!
        return read(fd, fromLoop: fromLoop) { bytes in chunks.withLock { $0.append(Chunk(bytes: Data(bytes), onLoop: loop.isCurrent)) } }
    }

    private func read(_ fd: FileDescriptor, fromLoop: Bool = true, chunk: @escaping @Sendable (UnsafeRawBufferPointer) throws -> Void) -> Task<UInt64, Error> {
        Self.read(fd, on: loop, fromLoop: fromLoop, chunk: chunk)
    }

    private static func read(_ fd: FileDescriptor, on loop: EventLoop, fromLoop: Bool,
                             chunk: @escaping @Sendable (UnsafeRawBufferPointer) throws -> Void) -> Task<UInt64, Error> {
        let chunkSize = chunkSize
        return Task(executorPreference: fromLoop ? loop.taskExecutor : nil) {
            try await DescriptorIO.readChunks(consuming: fd, pipeOn: loop, chunkSize: chunkSize, chunk)
        }
    }

    private static func write(_ bytes: Data, to fd: FileDescriptor) throws {
        try Kernel.withSIGPIPEBlocked {
            try bytes.withUnsafeBytes { try fd.writeFully($0) }
        }
    }

    private static func pattern(_ count: Int, seed: Int) -> Data {
        Data((0..<count).map { UInt8(truncatingIfNeeded: ($0 &+ seed) &* 157 &+ ($0 >> 9)) })
    }

    func testTheFirstChunkIsReadOnTheLoopAndTheRestOnAnotherThread() async throws {
        let pipe = try FileDescriptor.makePipe(nonBlocking: false)
        try pipe.writeEnd.setPipeCapacity(1 << 20)
        let chunks = Locked<[Chunk]>([])
        let reading = read(pipe.readEnd, into: chunks)
        let first = Self.pattern(10, seed: 1)
        let rest = Self.pattern(3 * Self.chunkSize + 123, seed: 2)
        try Self.write(first, to: pipe.writeEnd)
        let deadline = Date().addingTimeInterval(10)
        while chunks.withLock({ $0 }).isEmpty && Date() < deadline {
            try await Task.sleep(for: .milliseconds(2))
        }
        XCTAssertEqual(chunks.withLock { $0 }.count, 1)
        try Self.write(rest, to: pipe.writeEnd)
        pipe.writeEnd.closeQuietly()
        let total = try await reading.value

        let all = chunks.withLock { $0 }
        XCTAssertEqual(total, UInt64(first.count + rest.count))
        XCTAssertEqual(all.first?.bytes, first, "the first chunk is what the pipe held when it became readable")
        XCTAssertEqual(all.first?.onLoop, true)
        let onLoop = all.prefix { $0.onLoop }
        let offLoop = all.dropFirst(onLoop.count)
        XCTAssertEqual(onLoop.reduce(0) { $0 + $1.bytes.count }, Self.chunkSize, "the loop copies one chunk's worth, no more")
        XCTAssertFalse(offLoop.isEmpty)
        XCTAssertTrue(offLoop.allSatisfy { !$0.onLoop }, "once off the loop, the reading stays off it")
        XCTAssertEqual(all.reduce(Data()) { $0 + $1.bytes }, first + rest)
    }

    /// From a task that does not prefer the loop too, as `loadData` may be called.
    func testNoThreadWaitsInReadWhileThePipeIsEmpty() async throws {
        let pipe = try FileDescriptor.makePipe(nonBlocking: false)
        let chunks = Locked<[Chunk]>([])
        let reading = read(pipe.readEnd, into: chunks, fromLoop: false)
        // read(2) is system call 0 on x86-64; the descriptor is its first argument.
        let readingThePipe = "0 0x\(String(pipe.readEnd.rawValue, radix: 16)) "
        var looked = 0
        for _ in 0..<20 {
            let tasks = try FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")
            for task in tasks {
                guard let syscall = try? String(contentsOfFile: "/proc/self/task/\(task)/syscall", encoding: .utf8) else { continue }
                looked += 1
                XCTAssertFalse(syscall.hasPrefix(readingThePipe), "thread \(task) waits in read(2) on the empty pipe")
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        XCTAssertGreaterThan(looked, 20, "the threads' system calls could be seen")
        XCTAssertTrue(chunks.withLock { $0 }.isEmpty)
        let bytes = Self.pattern(4096, seed: 3)
        try Self.write(bytes, to: pipe.writeEnd)
        pipe.writeEnd.closeQuietly()
        let total = try await reading.value
        XCTAssertEqual(total, 4096)
        XCTAssertEqual(chunks.withLock { $0 }.map(\.bytes), [bytes])
        XCTAssertEqual(chunks.withLock { $0 }.map(\.onLoop), [true], "4 KiB and the end, all on the loop")
    }

    func testAPipeClosedBeforeAnyByteEndsWithNothing() async throws {
        let pipe = try FileDescriptor.makePipe(nonBlocking: false)
        let chunks = Locked<[Chunk]>([])
        let reading = read(pipe.readEnd, into: chunks)
        pipe.writeEnd.closeQuietly()
        let total = try await reading.value
        XCTAssertEqual(total, 0)
        XCTAssertTrue(chunks.withLock { $0 }.isEmpty)
    }

    func testAChunkThatFailsOnTheLoopEndsTheReadingAndClosesThePipe() async throws {
        struct Refused: Error {}
        let pipe = try FileDescriptor.makePipe(nonBlocking: false)
        defer { pipe.writeEnd.closeQuietly() }
        let reading = read(pipe.readEnd) { _ in throw Refused() }
        try Self.write(Data([7]), to: pipe.writeEnd)
        do {
            _ = try await reading.value
            XCTFail("the chunk's error did not end the reading")
        } catch {
            XCTAssertTrue(error is Refused, "\(error)")
        }
        // The read end is closed: the writer hears a broken pipe.
        XCTAssertThrowsError(try Self.write(Data([8]), to: pipe.writeEnd)) { error in
            XCTAssertEqual(error as? Errno, .brokenPipe)
        }
    }
}

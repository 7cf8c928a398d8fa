@testable import BrokerClient
import Foundation
import Glibc
import SystemCalls
import XCTest

/// A stream load's writer runs on a thread of its own, which its writes may block, and which
/// goes away when the writer is done without stranding any task that still prefers it.
final class WriterThreadTests: XCTestCase {
    /// Where a nonisolated step runs: the thread, and whether it is the writer's.
    private struct Place {
        let thread: pthread_t
        let onWriterThread: Bool
    }

    private nonisolated static func place(_ writer: WriterThread) -> Place {
        Place(thread: pthread_self(), onWriterThread: writer.isCurrent)
    }

    /// Three steps of a writer, around two suspensions, as a stream handler's loop would be.
    private nonisolated static func steps(on writer: WriterThread) async throws -> [Place] {
        var places = [place(writer)]
        await Task.yield()
        places.append(place(writer))
        try await Task.sleep(for: .milliseconds(5))
        places.append(place(writer))
        return places
    }

    /// Writes `bytes` as a stream handler would, noting the thread's kernel ID first.
    private nonisolated static func write(_ bytes: Data, with dataWriter: DataWriter, on writer: WriterThread,
                                          noting threadID: Locked<pid_t>) async throws -> Place {
        try await withTaskExecutorPreference(writer) {
            threadID.withLock { $0 = Kernel.currentThreadID() }
            try await dataWriter.write(bytes)
            return place(writer)
        }
    }

    func testAWriterRunsOnItsOwnThreadAcrossSuspensions() async throws {
        let writer = WriterThread()
        defer { writer.finish() }
        let places = try await withTaskExecutorPreference(writer) { try await Self.steps(on: writer) }
        XCTAssertEqual(places.map(\.onWriterThread), [true, true, true])
        XCTAssertEqual(Set(places.map { UInt($0.thread) }).count, 1, "one thread from start to end")
        XCTAssertFalse(writer.isCurrent, "the test's own thread is not the writer's")
    }

    func testWritesThatWaitForTheReaderBlockTheWriterThreadAndDeliverEveryByte() async throws {
        let pipe = try FileDescriptor.makePipe(nonBlocking: false)
        try pipe.writeEnd.setPipeCapacity(65536)
        let bytes = Data((0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ ($0 >> 11)) })
        let writer = WriterThread()
        defer { writer.finish() }
        let dataWriter = DataWriter(fd: pipe.writeEnd, thread: writer) { _ in }
        let writerTID = Locked<pid_t>(0)
        // Sixteen times what the pipe holds, and nobody reading yet: the write must wait.
        async let written = Self.write(bytes, with: dataWriter, on: writer, noting: writerTID)
        // The writer's own thread is the one waiting in write(2) on the pipe (syscall 1, its
        // first argument the descriptor), not a dispatch thread.
        let waitingIn = "1 0x\(String(pipe.writeEnd.rawValue, radix: 16)) "
        var blockedInWrite = false
        let deadline = Date().addingTimeInterval(10)
        while !blockedInWrite && Date() < deadline {
            let tid = writerTID.withLock { $0 }
            if tid != 0, let syscall = try? String(contentsOfFile: "/proc/self/task/\(tid)/syscall", encoding: .utf8) {
                blockedInWrite = syscall.hasPrefix(waitingIn)
            }
            if !blockedInWrite { try await Task.sleep(for: .milliseconds(5)) }
        }
        XCTAssertTrue(blockedInWrite, "the writer thread waits in write(2) for the reader")
        var received = Data()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 16, alignment: 1)
        defer { buffer.deallocate() }
        while received.count < bytes.count, case let n = try pipe.readEnd.readSome(into: buffer), n > 0 {
            received.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[..<n]))
        }
        let place = try await written
        pipe.writeEnd.closeQuietly()
        XCTAssertEqual(try pipe.readEnd.readSome(into: buffer), 0, "nothing after the bytes written")
        pipe.readEnd.closeQuietly()
        XCTAssertTrue(place.onWriterThread)
        XCTAssertEqual(received.count, bytes.count)
        XCTAssertEqual(received, bytes)
    }

    func testTheThreadLeavesOnceFinishedAndATaskThatStillPrefersItRunsElsewhere() async throws {
        let writer = WriterThread()
        let onThread = await withTaskExecutorPreference(writer) { Self.place(writer).onWriterThread }
        XCTAssertTrue(onThread)
        XCTAssertFalse(writer.hasLeft, "the thread stays until finished")
        writer.finish()
        let deadline = Date().addingTimeInterval(10)
        while !writer.hasLeft && Date() < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        XCTAssertTrue(writer.hasLeft, "the thread left")
        // A late job: it runs on a dispatch thread rather than waiting forever.
        let late = try await withTaskExecutorPreference(writer) { try await Self.steps(on: writer) }
        XCTAssertEqual(late.map(\.onWriterThread), [false, false, false])
    }
}

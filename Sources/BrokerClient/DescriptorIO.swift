import BusKit
import Dispatch
import Foundation
import SystemCalls

/// Blocking descriptor I/O, run on a dispatch thread so the event loop never waits on a peer.
/// The system calls, their errno and their EINTR retries are SystemCalls'; failures are its
/// `Errno`.
enum DescriptorIO {
    /// Reads `fd` to end of file, then closes it; for a pipe, as `readChunks` reads it.
    static func readToEnd(consuming fd: FileDescriptor, pipeOn loop: EventLoop? = nil) async throws -> Data {
        let collected = Locked(Data())
        _ = try await readChunks(consuming: fd, pipeOn: loop, chunkSize: 1 << 16) { chunk in
            collected.withLock { $0.append(contentsOf: chunk) }
        }
        return collected.withLock { $0 }
    }

    /// Writes all of `data` to `fd`, which stays open. A reader that left makes it fail with
    /// `Errno.brokenPipe`, never with SIGPIPE.
    static func writeAll(_ data: Data, to fd: FileDescriptor) async throws {
        try await offLoop { try writeAllBlocking(data, to: fd) }
    }

    /// `writeAll` on the calling thread, which it may block: only for a thread of its own.
    static func writeAllBlocking(_ data: Data, to fd: FileDescriptor) throws {
        try Kernel.withSIGPIPEBlocked {
            try data.withUnsafeBytes { try fd.writeFully($0) }
        }
    }

    /// Writes all of `data` into `pipe`, the broker's fresh pipe for one load, which stays
    /// open. When the pipe is empty and holds all of it, the write cannot block (every slot of
    /// an empty pipe is free, and this process is its only writer), so it is done here, on the
    /// calling thread: a small representation then costs no hop to a dispatch thread and back,
    /// which is most of what its first byte costs. Otherwise, or for a descriptor that is no
    /// pipe, as `writeAll`.
    static func writeAll(_ data: Data, toPipe pipe: FileDescriptor) async throws {
        if try writeWithoutWaiting(data, toPipe: pipe) { return }
        try await writeAll(data, to: pipe)
    }

    /// Writes all of `data` into `pipe` on the calling thread if that cannot block (the pipe is
    /// empty and holds all of it), and says whether it did; else writes nothing.
    static func writeWithoutWaiting(_ data: Data, toPipe pipe: FileDescriptor) throws -> Bool {
        guard let capacity = try? pipe.pipeCapacity(), data.count <= Int(capacity),
              let pending = try? pipe.bytesPending(), pending == 0 else {
            return false
        }
        try Kernel.withSIGPIPEBlocked {
            try data.withUnsafeBytes { try pipe.writeFully($0) }
        }
        return true
    }

    /// Reads `fd` to end of file in chunks, handing `chunk` each one (valid only for the
    /// call), then closes it. Returns the byte count.
    ///
    /// A pipe (`fd` of a data load) is waited for on `loop`, and its first `chunkSize` bytes
    /// are read there, each read as large as what the pipe holds: a read of a pipe the loop
    /// found readable does not wait, and a small representation then costs no hop to a
    /// dispatch thread and back, which was most of what its first byte cost the destination.
    /// The rest, and any other descriptor, is read on a dispatch thread, so the loop never
    /// copies more than one chunk of a load.
    static func readChunks(consuming fd: FileDescriptor, pipeOn loop: EventLoop? = nil, chunkSize: Int = 1 << 20,
                           _ chunk: @escaping @Sendable (UnsafeRawBufferPointer) throws -> Void) async throws -> UInt64 {
        var total: UInt64 = 0
        if let loop {
            do {
                // Preferred, the loop runs every step of this, however the caller runs.
                let head = try await withTaskExecutorPreference(loop.taskExecutor) {
                    try await readHead(of: fd, on: loop, upTo: chunkSize, chunk)
                }
                if head.ended {
                    fd.closeQuietly()
                    return head.bytes
                }
                total = head.bytes
            } catch {
                fd.closeQuietly()
                throw error
            }
        }
        return try await total + offLoop {
            defer { fd.closeQuietly() }
            return try forEachChunk(of: fd, bufferSize: chunkSize, chunk)
        }
    }

    /// `readChunks`'s part on the loop: up to `limit` bytes of the pipe `fd`, and whether its
    /// end came with them.
    private static func readHead(of fd: FileDescriptor, on loop: EventLoop, upTo limit: Int,
                                 _ chunk: @Sendable (UnsafeRawBufferPointer) throws -> Void) async throws -> (bytes: UInt64, ended: Bool) {
        let pipe = try ReadinessWatch(fd, on: loop)
        var total = 0
        while total < limit {
            await pipe.readable()
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: try readableCount(of: fd, upTo: limit - total), alignment: 1)
            defer { buffer.deallocate() }
            let count = try fd.readSome(into: buffer)
            if count == 0 { return (UInt64(total), true) }
            try chunk(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
            total += count
        }
        return (UInt64(total), false)
    }

    /// Reads what `fd` holds now, up to `limit` bytes, on the calling thread: only for a
    /// pipe the loop found readable, whose read does not wait. Empty at end of file.
    static func readAvailable(from fd: FileDescriptor, upTo limit: Int) throws -> Data {
        try readSome(from: fd, upTo: readableCount(of: fd, upTo: limit))
    }

    /// How much to read of a pipe the loop found readable: what it holds, up to `limit`.
    /// Readable and empty means end of file: a read of one byte says so.
    private static func readableCount(of fd: FileDescriptor, upTo limit: Int) throws(Errno) -> Int {
        max(1, min(try fd.bytesPending(), limit))
    }

    /// Reads up to `limit` bytes of `fd` on a dispatch thread, where the read may wait. Empty
    /// at end of file.
    static func readSome(from fd: FileDescriptor, upToWaiting limit: Int) async throws -> Data {
        try await offLoop { try readSome(from: fd, upTo: limit) }
    }

    /// One read(2) of up to `limit` bytes, into the returned `Data`'s own storage.
    private static func readSome(from fd: FileDescriptor, upTo limit: Int) throws -> Data {
        guard var memory = malloc(limit) else { throw Errno.noMemory }
        let count: Int
        do {
            count = try fd.readSome(into: UnsafeMutableRawBufferPointer(start: memory, count: limit))
        } catch {
            free(memory)
            throw error
        }
        if count < limit / 2, let smaller = realloc(memory, max(count, 1)) { memory = smaller }
        return Data(bytesNoCopy: memory, count: count, deallocator: .free)
    }

    /// Copies `fd` to end of file into `output`, then closes `fd`. Returns the byte count.
    ///
    /// A data load's `fd` is the broker's pipe, so the bytes go with splice(2): the kernel
    /// hands the pipe's pages to the file, pipe or socket, and they never pass through this
    /// process. Where `output` takes no splice (a file opened O_APPEND, a terminal), or `fd` is
    /// a handed-over file rather than a pipe, through one reused buffer instead.
    static func copy(consuming fd: FileDescriptor, to output: FileDescriptor) async throws -> UInt64 {
        try await offLoop {
            defer { fd.closeQuietly() }
            return try Kernel.withSIGPIPEBlocked {
                let spliced = try spliceAll(from: fd, to: output)
                if spliced.complete { return spliced.moved }
                return try spliced.moved + forEachChunk(of: fd, bufferSize: 1 << 20) { try output.writeFully($0) }
            }
        }
    }

    /// splice(2) from `fd` into `output` until end of file (`complete`), or until `output` or
    /// `fd` turns out to take no splice, having moved `moved` bytes by then.
    private static func spliceAll(from fd: FileDescriptor, to output: FileDescriptor) throws(Errno) -> (moved: UInt64, complete: Bool) {
        var moved: UInt64 = 0
        while true {
            let count: Int
            do {
                count = try fd.spliceWaiting(to: output, count: 1 << 20)
            } catch {
                if error == .invalidArgument { return (moved, false) }
                throw error
            }
            if count == 0 { return (moved, true) }
            moved += UInt64(count)
        }
    }

    /// Reads `fd` to end of file through one reused buffer, handing `body` each filled part.
    /// Returns the byte count.
    private static func forEachChunk(of fd: FileDescriptor, bufferSize: Int, _ body: (UnsafeRawBufferPointer) throws -> Void) throws -> UInt64 {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: bufferSize, alignment: 1)
        defer { buffer.deallocate() }
        var total: UInt64 = 0
        while case let count = try fd.readSome(into: buffer), count > 0 {
            try body(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
            total += UInt64(count)
        }
        return total
    }

    /// A serial queue of its own for each call: libdispatch gives serial queues a thread
    /// whenever they have work (they overcommit), where the global queue runs no more blocking
    /// calls at once than there are CPUs, so on two cores a third load's pipe would wait for
    /// one of the first two to finish.
    private static func offLoop<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue(label: "org.dragbroker.client.descriptor").async {
                continuation.resume(with: Result { try body() })
            }
        }
    }
}

/// A pipe watched on its loop's thread for as long as a reader waits for it there, a wait at
/// a time. The watch is level-triggered: one that fires while nobody waits (the reader has
/// not read yet) turns itself off, rather than wake the loop again and again.
final class ReadinessWatch {
    private var watch: IOWatch?
    private var waiter: CheckedContinuation<Void, Never>?
    private var isEnabled = true

    /// Call on `loop`'s thread, and let go of it there (BusKit checks both).
    init(_ fd: FileDescriptor, on loop: EventLoop) throws(BusError) {
        watch = try IOWatch(loop: loop, fd: fd.rawValue, when: .readable) { [unowned self] in fired() }
    }

    /// Suspends until the pipe holds bytes, has reached its end or failed. Call on the loop's
    /// thread, whose callbacks run only once this task has suspended.
    func readable() async {
        if !isEnabled {
            isEnabled = true
            watch?.setEnabled(true)
        }
        await withCheckedContinuation { waiter = $0 }
    }

    private func fired() {
        guard let waiter else {
            isEnabled = false
            watch?.setEnabled(false)
            return
        }
        self.waiter = nil
        waiter.resume()
    }
}

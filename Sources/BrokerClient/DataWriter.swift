import BrokerProtocol
import Foundation
import SystemCalls

/// Where a stream representation's writer puts its bytes: the pipe the broker passed.
/// Writes block only the load's own thread (the writer runs there, see `WriterThread`) or,
/// from code running elsewhere, a dispatch thread: never the caller's executor or the event loop.
public final class DataWriter: Sendable {
    private let fd: FileDescriptor
    private let thread: WriterThread?
    private let announce: @Sendable (UInt64) async -> Void

    init(fd: FileDescriptor, thread: WriterThread?, announce: @escaping @Sendable (UInt64) async -> Void) {
        self.fd = fd
        self.thread = thread
        self.announce = announce
    }

    /// Tells the destination how many bytes to expect, for its progress.
    public func setExpectedSize(_ size: UInt64) async {
        await announce(size)
    }

    /// Writes all of `data`; throws `Cancelled` if the destination went away.
    public func write(_ data: Data) async throws {
        try Task.checkCancellation()
        do {
            if let thread, thread.isCurrent {
                try DescriptorIO.writeAllBlocking(data, to: fd)
            } else {
                try await DescriptorIO.writeAll(data, to: fd)
            }
        } catch let error as Errno where error == .brokenPipe {
            throw BrokerError(.cancelled, "The destination is no longer reading")
        }
    }
}

/// A memfd holding `data`, sealed against writing, growing and shrinking: the form a file
/// representation takes when the bytes are in memory, passed without a copy.
public enum SealedMemoryFile {
    public static func make(name: String, data: Data) throws -> FileDescriptor {
        let fd = try Kernel.makeMemoryFile(name: name)
        do {
            try data.withUnsafeBytes { try fd.writeFully($0) }
            try fd.addSeals([.seal, .shrink, .grow, .write])
            try fd.rewind()
        } catch {
            fd.closeQuietly()
            throw error
        }
        return fd
    }
}

import BrokerProtocol
import CSystemd
import Foundation
import Glibc
import SystemPackage

/// Where a stream representation's writer puts its bytes: the pipe the broker passed.
/// Writes block only a dispatch thread, never the caller's executor or the event loop.
public final class DataWriter: Sendable {
    private let fd: Int32
    private let announce: @Sendable (UInt64) async -> Void

    init(fd: Int32, announce: @escaping @Sendable (UInt64) async -> Void) {
        self.fd = fd
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
            try await DescriptorIO.writeAll(data, to: fd)
        } catch let error as POSIXError where error.code == .EPIPE {
            throw BrokerError(.cancelled, "The destination is no longer reading")
        }
    }
}

/// A memfd holding `data`, sealed against writing, growing and shrinking: the form a file
/// representation takes when the bytes are in memory, passed without a copy.
public enum SealedMemoryFile {
    public static func make(name: String, data: Data) throws -> FileDescriptor {
        let fd = shim_memfd_create(name)
        guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        do {
            try data.withUnsafeBytes { raw in
                var offset = 0
                while offset < raw.count {
                    let n = Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset)
                    if n < 0 {
                        if errno == EINTR { continue }
                        throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
                    }
                    offset += n
                }
            }
            guard shim_seal_all(fd) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
            _ = lseek(fd, 0, SEEK_SET)
        } catch {
            close(fd)
            throw error
        }
        return FileDescriptor(rawValue: fd)
    }
}

import Dispatch
import Foundation
import Glibc

/// Blocking descriptor I/O, run on a dispatch thread so the event loop never waits on a peer.
enum DescriptorIO {
    /// Reads `fd` to end of file, then closes it.
    static func readToEnd(consuming fd: Int32) async throws -> Data {
        try await offLoop {
            defer { close(fd) }
            var data = Data()
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            while true {
                let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if n > 0 { data.append(buffer, count: n); continue }
                if n == 0 { return data }
                if errno == EINTR { continue }
                throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
            }
        }
    }

    /// Writes all of `data` to `fd`, then closes it (the reader then sees end of file).
    static func write(_ data: Data, consuming fd: Int32) async throws {
        try await offLoop {
            defer { close(fd) }
            try data.withUnsafeBytes { raw in
                var offset = 0
                while offset < raw.count {
                    let n = Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset)
                    if n > 0 { offset += n; continue }
                    if n < 0 && errno == EINTR { continue }
                    throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
                }
            }
        }
    }

    private static func offLoop<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(with: Result { try body() })
            }
        }
    }
}

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
            while case let n = try readSome(fd, &buffer), n > 0 {
                data.append(contentsOf: buffer[0..<n])
            }
            return data
        }
    }

    /// Writes all of `data` to `fd`, then closes it (the reader then sees end of file).
    static func write(_ data: Data, consuming fd: Int32) async throws {
        defer { close(fd) }
        try await writeAll(data, to: fd)
    }

    /// Writes all of `data` to `fd`, which stays open.
    static func writeAll(_ data: Data, to fd: Int32) async throws {
        try await offLoop {
            try withoutSIGPIPE {
                try data.withUnsafeBytes { try writeFully(fd, $0.baseAddress, $0.count) }
            }
        }
    }

    /// Reads `fd` to end of file in chunks, calling `chunk` on each (on a dispatch thread),
    /// then closes it. Returns the byte count.
    static func readChunks(consuming fd: Int32, chunkSize: Int = 1 << 20, _ chunk: @escaping @Sendable (Data) throws -> Void) async throws -> UInt64 {
        try await offLoop {
            defer { close(fd) }
            var total: UInt64 = 0
            var buffer = [UInt8](repeating: 0, count: chunkSize)
            while case let n = try readSome(fd, &buffer), n > 0 {
                total += UInt64(n)
                try chunk(Data(buffer[0..<n]))
            }
            return total
        }
    }

    /// Copies `fd` to end of file into `output` from one reused buffer, then closes `fd`.
    /// Returns the byte count.
    static func copy(consuming fd: Int32, to output: Int32) async throws -> UInt64 {
        try await offLoop {
            defer { close(fd) }
            return try withoutSIGPIPE {
                var total: UInt64 = 0
                var buffer = [UInt8](repeating: 0, count: 1 << 20)
                while case let n = try readSome(fd, &buffer), n > 0 {
                    try buffer.withUnsafeBytes { try writeFully(output, $0.baseAddress, n) }
                    total += UInt64(n)
                }
                return total
            }
        }
    }

    /// One read(2) into `buffer`, retried on EINTR; 0 at end of file.
    private static func readSome(_ fd: Int32, _ buffer: inout [UInt8]) throws -> Int {
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n >= 0 { return n }
            if errno != EINTR { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        }
    }

    /// write(2) until all `count` bytes are out, retried on EINTR.
    private static func writeFully(_ fd: Int32, _ base: UnsafeRawPointer?, _ count: Int) throws {
        var offset = 0
        while offset < count {
            let n = Glibc.write(fd, base! + offset, count - offset)
            if n > 0 { offset += n; continue }
            if n < 0 && errno == EINTR { continue }
            throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        }
    }

    /// A write to a pipe whose reader left (the broker ended the load) must fail with EPIPE,
    /// not kill the app: SIGPIPE is blocked on this thread for the write, and one raised by it
    /// is consumed before the mask is restored. The app's own signal handling is untouched.
    static func withoutSIGPIPE<T>(_ body: () throws -> T) rethrows -> T {
        var block = sigset_t()
        var previous = sigset_t()
        sigemptyset(&block)
        sigaddset(&block, SIGPIPE)
        pthread_sigmask(SIG_BLOCK, &block, &previous)
        defer {
            var pending = sigset_t()
            sigpending(&pending)
            if sigismember(&pending, SIGPIPE) == 1 {
                var zero = timespec()
                _ = sigtimedwait(&block, nil, &zero)
            }
            pthread_sigmask(SIG_SETMASK, &previous, nil)
        }
        return try body()
    }

    private static func offLoop<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(with: Result { try body() })
            }
        }
    }
}

import CSystemd
import Glibc
import SystemCalls

/// Structured entries for the systemd journal, through `sd_journal_sendv`.
public enum Journal {
    /// Whether stderr is connected to journald, as `$JOURNAL_STREAM` (device:inode) says;
    /// only then do entries go to the journal, and plain stderr lines otherwise.
    public static var isConnected: Bool {
        guard let stream = getenv("JOURNAL_STREAM").map({ String(cString: $0) }) else { return false }
        let parts = stream.split(separator: ":")
        guard parts.count == 2, let info = try? FileDescriptor.standardError.status() else { return false }
        return parts[0] == "\(info.device)" && parts[1] == "\(info.inode)"
    }

    /// Sends one entry; `fields` are journal field names (upper case) and values.
    /// Returns false when the journal did not take it.
    @discardableResult
    public static func send(_ fields: [(String, String)]) -> Bool {
        let lines = fields.map { Array("\($0.0)=\($0.1)".utf8) }
        let storage = lines.map { line -> UnsafeMutableRawBufferPointer in
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(line.count, 1), alignment: 1)
            buffer.copyBytes(from: line)
            return buffer
        }
        defer { storage.forEach { $0.deallocate() } }
        var vectors = zip(storage, lines).map { iovec(iov_base: $0.0.baseAddress, iov_len: $0.1.count) }
        return shim_journal_sendv(&vectors, Int32(vectors.count)) >= 0
    }
}

import BrokerProtocol
import SystemCalls

/// A session's 256-bit secret, as the windowing system's drag carries it: 64 lowercase hex
/// digits. Held as four words, so 10,000 live sessions cost no heap for their tokens.
struct SessionToken: Sendable {
    private let words: (UInt64, UInt64, UInt64, UInt64)

    /// The registry's key: the first word. Lookup by it is a hash probe on a secret the
    /// caller does not know; the whole token is then compared in constant time.
    var selector: UInt64 { words.0 }

    /// 256 bits from getrandom(2).
    static func random() throws(InternalError) -> SessionToken {
        do {
            return SessionToken(bytes: try Kernel.randomBytes(32))
        } catch {
            throw InternalError("Failed to read random bytes for a session token: \(error)")
        }
    }

    private init(bytes: [UInt8]) {
        func word(_ at: Int) -> UInt64 { bytes[at..<at + 8].reduce(0) { $0 << 8 | UInt64($1) } }
        words = (word(0), word(8), word(16), word(24))
    }

    /// Parses the hex form; nil for anything else, including the wrong length.
    init?(hex text: String) {
        let digits = Array(text.utf8)
        guard digits.count == 64 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            default: nil
            }
        }
        var i = 0
        while i < 64 {
            guard let hi = value(digits[i]), let lo = value(digits[i + 1]) else { return nil }
            bytes.append(hi << 4 | lo)
            i += 2
        }
        self.init(bytes: bytes)
    }

    var hex: String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(64)
        for word in [words.0, words.1, words.2, words.3] {
            for shift in stride(from: 60, through: 0, by: -4) { out.append(digits[Int(word >> UInt64(shift) & 0xf)]) }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Compares in time independent of where the first difference is.
    func matches(_ other: SessionToken) -> Bool {
        (words.0 ^ other.words.0) | (words.1 ^ other.words.1) | (words.2 ^ other.words.2) | (words.3 ^ other.words.3) == 0
    }
}

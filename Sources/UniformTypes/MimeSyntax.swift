struct MimeParameter: Hashable, Sendable {
    let name: String
    let value: String
}

struct ParsedMime: Hashable, Sendable {
    /// Lowercased; `*` only in patterns.
    let type: String
    let subtype: String
    let parameters: [MimeParameter]

    var essence: String { type + "/" + subtype }
    var canonical: String {
        ([essence] + parameters.map { $0.name + "=" + $0.value }).joined(separator: ";")
    }
}

/// The grammar shared by type identifiers and patterns, so both refuse the same garbage in
/// the same words. Reasons are phrased to follow "'<input>' is not a …: ".
enum MimeSyntax {
    struct Reason: Error {
        let text: String
        init(_ text: String) { self.text = text }
    }

    enum Input {
        case mime(ParsedMime)
        /// Lowercased, because UTIs compare case-insensitively.
        case uti(String)
    }

    // RFC 6838 section 4.2 limits.
    static let maxBytes = 255
    static let maxNameLength = 127
    // Not from any RFC: real types carry one or two; a cap keeps hostile input cheap.
    static let maxParameters = 8

    static func parse(_ raw: String, wildcards: Bool, expected: String) throws(Reason) -> Input {
        if let plain = parsePlain(raw) { return .mime(plain) }
        return try parseGenerally(raw, wildcards: wildcards, expected: expected)
    }

    /// The form nearly every real type has, read byte by byte: `type/subtype`, then at most
    /// `maxParameters` `;name=value`, with ASCII names, token values, and no space, quote or
    /// wildcard anywhere. The daemon parses the requested type and every listed one at each
    /// `Load`, and character-by-character parsing was a fifth of its time there. Whatever this
    /// does not take, every refusal included, goes to `parseGenerally`, which alone words the
    /// errors; what it does take, it reads exactly as `parseGenerally` does (a test holds the
    /// two to the same answers).
    static func parsePlain(_ raw: String) -> ParsedMime? {
        raw.utf8.withContiguousStorageIfAvailable { bytes -> ParsedMime? in
            guard bytes.count <= maxBytes else { return nil }
            var position = 0
            /// A restricted name up to `stop`, lowercased; nil unless RFC 6838 allows it whole.
            func name(until stop: UInt8) -> String? {
                let start = position
                while position < bytes.count, bytes[position] != stop {
                    guard isRestrictedNameByte(bytes[position]) else { return nil }
                    position += 1
                }
                let length = position - start
                guard length > 0, length <= maxNameLength, isAlphanumericByte(bytes[start]) else { return nil }
                return String(unsafeUninitializedCapacity: length) { out in
                    for i in 0..<length { out[i] = asciiLowercase(bytes[start + i]) }
                    return length
                }
            }
            guard let type = name(until: UInt8(ascii: "/")), position < bytes.count else { return nil }
            position += 1
            guard let subtype = name(until: UInt8(ascii: ";")) else { return nil }
            var parameters: [MimeParameter] = []
            while position < bytes.count {
                position += 1 // the ';'
                guard parameters.count < maxParameters, let parameterName = name(until: UInt8(ascii: "=")),
                      position < bytes.count else { return nil }
                position += 1
                let start = position
                while position < bytes.count, bytes[position] != UInt8(ascii: ";") {
                    guard isTokenByte(bytes[position]) else { return nil }
                    position += 1
                }
                guard position > start, !parameters.contains(where: { $0.name == parameterName }) else { return nil }
                let value = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<position]), as: UTF8.self)
                parameters.append(MimeParameter(name: parameterName, value: parameterName == "charset" ? value.lowercased() : value))
            }
            return ParsedMime(type: type, subtype: subtype, parameters: parameters)
        } ?? nil
    }

    private static func isAlphanumericByte(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z")) || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
            || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
    }

    /// RFC 6838 restricted-name-chars, as `isRestrictedNameCharacter`.
    private static func isRestrictedNameByte(_ byte: UInt8) -> Bool {
        isAlphanumericByte(byte) || restrictedNamePunctuation.utf8.contains(byte)
    }

    /// RFC 2045 token, as `isTokenCharacter`.
    private static func isTokenByte(_ byte: UInt8) -> Bool {
        byte > 0x20 && byte < 0x7F && !tokenSpecials.utf8.contains(byte)
    }

    private static func asciiLowercase(_ byte: UInt8) -> UInt8 {
        byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") ? byte + 32 : byte
    }

    static func parseGenerally(_ raw: String, wildcards: Bool, expected: String) throws(Reason) -> Input {
        let input = raw.trimmingSpaces
        if input.isEmpty { throw Reason("it is empty; " + expected) }
        for scalar in input.unicodeScalars {
            if scalar.value < 0x20 || scalar.value == 0x7F {
                throw Reason("it contains the control character U+" + hex4(scalar.value))
            }
            if !scalar.isASCII {
                throw Reason("it contains the non-ASCII character '\(scalar)'")
            }
        }
        if input.utf8.count > maxBytes {
            throw Reason("it is \(input.utf8.count) bytes long; at most \(maxBytes) are allowed")
        }
        if !input.contains("/") {
            if input == "*" && wildcards { return .mime(ParsedMime(type: "*", subtype: "*", parameters: [])) }
            if input.contains("*") { throw wildcardReason(wildcards) }
            if input.contains(".") { return .uti(input.lowercased()) }
            throw Reason(expected)
        }
        return .mime(try parseMime(input, wildcards: wildcards))
    }

    static func parseMime(_ input: String, wildcards: Bool) throws(Reason) -> ParsedMime {
        let segments = try splitParameters(Substring(input))
        let head = segments[0].trimmingSpaces
        guard let slash = head.firstIndex(of: "/") else {
            throw Reason("'\(head)' before the first ';' is not of the form type/subtype, such as image/png")
        }
        let type = head[..<slash]
        let subtype = head[head.index(after: slash)...]
        try checkName(type, role: "type", wildcards: wildcards)
        try checkName(subtype, role: "subtype", wildcards: wildcards)
        if type == "*" && subtype != "*" {
            throw Reason("a wildcard type needs a wildcard subtype, as in */*")
        }
        let rawParameters = segments.dropFirst()
        if rawParameters.count > maxParameters {
            throw Reason("it has \(rawParameters.count) parameters; at most \(maxParameters) are allowed")
        }
        var parameters: [MimeParameter] = []
        for segment in rawParameters {
            let parameter = try parseParameter(segment)
            if parameters.contains(where: { $0.name == parameter.name }) {
                throw Reason("the parameter '\(parameter.name)' is given twice")
            }
            parameters.append(parameter)
        }
        return ParsedMime(type: type.lowercased(), subtype: subtype.lowercased(), parameters: parameters)
    }

    /// Splits at `;` except inside a quoted parameter value, where `;` is legal (RFC 2045).
    private static func splitParameters(_ s: Substring) throws(Reason) -> [Substring] {
        var parts: [Substring] = []
        var start = s.startIndex
        var inQuotes = false, escaped = false
        var previous: Character = " "
        var i = s.startIndex
        while i < s.endIndex {
            let c = s[i]
            if inQuotes {
                if escaped { escaped = false } else if c == "\\" { escaped = true } else if c == "\"" { inQuotes = false }
            } else if c == "\"" && previous == "=" {
                inQuotes = true
            } else if c == ";" {
                parts.append(s[start..<i])
                start = s.index(after: i)
            }
            if c != " " { previous = c }
            i = s.index(after: i)
        }
        if inQuotes { throw Reason("a quoted parameter value is not closed") }
        parts.append(s[start...])
        return parts
    }

    private static func parseParameter(_ segment: Substring) throws(Reason) -> MimeParameter {
        let s = segment.trimmingSpaces
        if s.isEmpty { throw Reason("there is an empty parameter after ';'") }
        guard let eq = s.firstIndex(of: "=") else {
            throw Reason("the parameter '\(s)' has no value; write it as name=value")
        }
        let rawName = s[..<eq].trimmingSpaces
        try checkName(rawName, role: "parameter name", wildcards: false)
        let name = rawName.lowercased()
        var value = String(s[s.index(after: eq)...].trimmingSpaces)
        if value.isEmpty { throw Reason("the parameter '\(name)' has no value after '='") }
        if value.first == "\"" {
            value = try normalizeQuoted(value, parameter: name)
        } else if let bad = value.first(where: { !isTokenCharacter($0) }) {
            throw Reason("the value of parameter '\(name)' contains \(describe(bad)); put such values in double quotes")
        }
        // Charset names are case-insensitive (RFC 2046); lowercasing lets equal charsets compare equal.
        if name == "charset" { value = value.lowercased() }
        return MimeParameter(name: name, value: value)
    }

    /// `"utf-8"` and `utf-8` mean the same (RFC 2045), so quotes that aren't needed are dropped.
    private static func normalizeQuoted(_ value: String, parameter: String) throws(Reason) -> String {
        var content = ""
        var escaped = false
        var rest = value.dropFirst()
        while let c = rest.first {
            rest = rest.dropFirst()
            if escaped {
                content.append(c)
                escaped = false
            } else if c == "\\" {
                escaped = true
            } else if c == "\"" {
                guard rest.isEmpty else {
                    throw Reason("the value of parameter '\(parameter)' has text after its closing quote")
                }
                return !content.isEmpty && content.allSatisfy(isTokenCharacter) ? content : value
            } else {
                content.append(c)
            }
        }
        throw Reason("a quoted parameter value is not closed")
    }

    private static func checkName(_ name: Substring, role: String, wildcards: Bool) throws(Reason) {
        if name.isEmpty {
            switch role {
            case "type": throw Reason("the type before '/' is empty")
            case "subtype": throw Reason("the subtype after '/' is empty")
            default: throw Reason("a parameter has no name before '='")
            }
        }
        if role != "parameter name" && name.contains("*") {
            if wildcards && name == "*" { return }
            throw wildcardReason(wildcards)
        }
        if name.count > maxNameLength {
            throw Reason("the \(role) is \(name.count) characters long; at most \(maxNameLength) are allowed")
        }
        if name.contains(" ") {
            throw Reason("the \(role) '\(name)' contains whitespace")
        }
        if let first = name.first, !(first.isASCII && (first.isLetter || first.isNumber)) {
            throw Reason("the \(role) '\(name)' must begin with a letter or digit")
        }
        if let bad = name.first(where: { !isRestrictedNameCharacter($0) }) {
            throw Reason("the \(role) '\(name)' contains \(describe(bad)); "
                + "only letters, digits and ! # $ & - ^ _ . + are allowed")
        }
    }

    private static func wildcardReason(_ wildcards: Bool) -> Reason {
        wildcards
            ? Reason("a wildcard must stand for a whole type or subtype, as in image/* or */*")
            : Reason("'*' is a wildcard, allowed only in patterns, not in a concrete type")
    }

    /// RFC 6838 restricted-name-chars besides letters and digits, for both readings.
    private static let restrictedNamePunctuation = "!#$&-^_.+"
    /// RFC 2045 tspecials, which a token may not contain, for both readings.
    private static let tokenSpecials = "()<>@,;:\\\"/[]?="

    /// RFC 6838 restricted-name-chars.
    private static func isRestrictedNameCharacter(_ c: Character) -> Bool {
        c.isASCII && (c.isLetter || c.isNumber || restrictedNamePunctuation.contains(c))
    }

    /// RFC 2045 token: printable ASCII except space and tspecials.
    private static func isTokenCharacter(_ c: Character) -> Bool {
        guard let ascii = c.asciiValue, ascii > 0x20, ascii < 0x7F else { return false }
        return !tokenSpecials.contains(c)
    }

    private static func describe(_ c: Character) -> String {
        c == " " ? "a space" : "'\(c)'"
    }

    private static func hex4(_ value: UInt32) -> String {
        let digits = String(value, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }
}

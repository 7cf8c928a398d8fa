/// A concrete drag representation type, held as its canonical MIME string.
///
/// MIME is the native vocabulary on Linux, so it is what gets stored and compared; Apple
/// UTIs are accepted at the edge only so that code and habits carried over from iOS work.
public struct TypeIdentifier: Hashable, Sendable, CustomStringConvertible {
    /// The canonical MIME type, parameters included: `text/plain;charset=utf-8`.
    public let mime: String
    /// `type/subtype` without parameters: `text/plain`.
    public let essence: String
    // Kept parsed so conformance checks need not re-parse the string.
    let parameters: [MimeParameter]

    public init(_ raw: String) throws(TypeIdentifierError) {
        let parsed: MimeSyntax.Input
        do {
            parsed = try MimeSyntax.parse(raw, wildcards: false, expected: Self.expected)
        } catch {
            throw TypeIdentifierError(message: "'\(quoted(raw))' is not a type identifier: \(error.text)")
        }
        switch parsed {
        case .mime(let mime):
            self.init(mime)
        case .uti(let uti):
            if abstractUTIs[uti] != nil {
                throw TypeIdentifierError(
                    message: "'\(quoted(raw))' is an abstract type: use it to ask for conformance, not to offer data")
            }
            // The table is constant and a test parses every entry, so a nil here means an unknown UTI.
            guard let mime = utiAliases[uti].flatMap({ try? MimeSyntax.parseMime($0, wildcards: false) }) else {
                throw TypeIdentifierError(message: "'\(quoted(raw))' is not a type identifier: "
                    + "it is not a UTI with a known MIME type; use the MIME type itself, such as image/png")
            }
            self.init(mime)
        }
    }

    private init(_ mime: ParsedMime) {
        essence = mime.essence
        parameters = mime.parameters
        self.mime = mime.canonical
    }

    public var description: String { mime }

    static let expected = "expected a MIME type such as image/png or a UTI such as public.png"
}

public struct TypeIdentifierError: Error, Equatable, Sendable, CustomStringConvertible {
    public let message: String

    public init(message: String) {
        self.message = message
    }

    public var description: String { message }
}

/// Renders user input inside a message so that invisible characters show up as what they are.
func quoted(_ raw: String) -> String {
    var out = ""
    for scalar in raw.unicodeScalars {
        if scalar.value < 0x20 || scalar.value == 0x7F {
            out += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
        } else {
            out.unicodeScalars.append(scalar)
        }
    }
    return out
}

extension String {
    var trimmingSpaces: String { String(Substring(self).trimmingSpaces) }
}

extension Substring {
    // Only U+0020: every other whitespace character is a control character and refused.
    var trimmingSpaces: Substring {
        var s = self
        while s.first == " " { s.removeFirst() }
        while s.last == " " { s.removeLast() }
        return s
    }
}

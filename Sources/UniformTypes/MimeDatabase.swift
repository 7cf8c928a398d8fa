#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The type hierarchy from the freedesktop.org shared-mime-info database, which is what
/// every Linux desktop already uses to decide that, say, `text/x-python` is also text.
public final class MimeDatabase: Sendable {
    /// child → parents, as listed; parents are canonicalised when walked.
    private let subclasses: [String: [String]]
    /// alias → canonical.
    private let aliases: [String: String]
    /// Every type that is some type's supertype, canonical: a type outside it is nobody's, and
    /// needs no walk of the hierarchy. The daemon asks at each `Load`, for each listed type.
    private let supertypesOfAny: Set<String>

    public init(subclasses: [String: [String]], aliases: [String: String]) {
        var lowered: [String: [String]] = [:]
        for (child, parents) in subclasses {
            lowered[child.lowercased(), default: []] += parents.map { $0.lowercased() }
        }
        self.subclasses = lowered
        let aliases = Dictionary(aliases.map { ($0.key.lowercased(), $0.value.lowercased()) },
                                 uniquingKeysWith: { first, _ in first })
        self.aliases = aliases
        supertypesOfAny = Set(lowered.values.joined().map { aliases[$0] ?? $0 } + Self.implicitSupertypes)
    }

    /// The supertypes the shared-mime-info spec implies without listing them (`parents(of:)`).
    private static let implicitSupertypes = ["text/plain", "application/xml", "application/json", "application/octet-stream"]

    /// Reads `subclasses` and `aliases` from a shared-mime-info directory. A missing file
    /// means an empty table: a minimal system without the database still works, only with
    /// no inheritance beyond the implicit rules. Other read errors are thrown.
    public static func load(directory: String = "/usr/share/mime") throws -> MimeDatabase {
        var subclasses: [String: [String]] = [:]
        for (child, parent) in try pairs(in: directory + "/subclasses") {
            subclasses[child, default: []].append(parent)
        }
        var aliases: [String: String] = [:]
        for (alias, canonical) in try pairs(in: directory + "/aliases") where aliases[alias] == nil {
            aliases[alias] = canonical
        }
        return MimeDatabase(subclasses: subclasses, aliases: aliases)
    }

    /// Loaded on first use; empty if the database cannot be read, so callers never have to
    /// handle a failure that only degrades conformance to exact matches.
    public static let system: MimeDatabase =
        (try? MimeDatabase.load()) ?? MimeDatabase(subclasses: [:], aliases: [:])

    public func canonical(_ essence: String) -> String {
        canonicalOfLowercase(essence.lowercased())
    }

    /// `canonical` of an essence already lowercase, as every parsed `TypeIdentifier` and
    /// `TypePattern` holds it: `match` runs for each listed type at each `Load`.
    private func canonicalOfLowercase(_ essence: String) -> String {
        aliases[essence] ?? essence
    }

    /// Every supertype, nearest first, `application/octet-stream` last. Includes the
    /// implicit rules of the shared-mime-info spec, which the files do not spell out.
    public func supertypes(of essence: String) -> [String] {
        let start = canonical(essence)
        var seen: Set<String> = [start]
        var result: [String] = []
        var index = 0
        var queue = [start]
        while index < queue.count {
            let type = queue[index]
            index += 1
            for parent in parents(of: type) where seen.insert(parent).inserted {
                result.append(parent)
                queue.append(parent)
            }
        }
        // Appended once at the end rather than as everyone's parent, so it doesn't crowd out
        // the meaningful supertypes at the front of the list.
        let octetStream = "application/octet-stream"
        if !seen.contains(octetStream), queue.contains(where: { !$0.hasPrefix("inode/") }) {
            result.append(octetStream)
        }
        return result
    }

    private func parents(of type: String) -> [String] {
        var result = (subclasses[type] ?? []).map(canonical)
        guard let slash = type.firstIndex(of: "/") else { return result }
        let major = type[..<slash], subtype = type[type.index(after: slash)...]
        if major == "text" && type != "text/plain" { result.append("text/plain") }
        if subtype.hasSuffix("+xml") && type != "application/xml" { result.append("application/xml") }
        if subtype.hasSuffix("+json") && type != "application/json" { result.append("application/json") }
        return result.filter { $0 != "application/octet-stream" }
    }

    /// Whether a listed type answers a request: `match(_:to:)` is not nil.
    public func conforms(_ type: TypeIdentifier, to pattern: String) -> Bool {
        guard let pattern = try? TypePattern(pattern) else { return false }
        return match(type, to: pattern) != nil
    }

    /// How closely the listed type `type` answers `pattern`, or nil when it does not. This is
    /// the one rule of the product: `ConformingItems` says yes exactly when some listed type
    /// matches, `Load` serves the closest match (`select`), policy `Types=` applies to a
    /// representation its patterns match, and the client libraries pick what to load with it.
    public func match(_ type: TypeIdentifier, to pattern: TypePattern) -> TypeMatch? {
        // Parameters a request names must be in the listed type: asking for UTF-8 text is not
        // answered by text of unknown charset. Parameters it leaves out are not constrained.
        guard pattern.parameters.allSatisfy(type.parameters.contains) else { return nil }
        let essence = canonicalOfLowercase(type.essence)
        switch pattern.kind {
        case .everything:
            return .conforming
        case .majorTypes(let majors):
            // application/octet-stream is left out: every byte stream is one, so counting it
            // would make application/* match images, audio and text alike.
            let matches = ([essence] + supertypes(of: essence).filter { $0 != "application/octet-stream" })
                .contains { majors.contains(majorType($0)) }
            return matches ? .conforming : nil
        case .exact(let wanted):
            let wanted = canonicalOfLowercase(wanted)
            if wanted == essence {
                return pattern.parameters.count == type.parameters.count ? .exact : .parameters
            }
            return supertypesOfAny.contains(wanted) && supertypes(of: essence).contains(wanted) ? .conforming : nil
        }
    }

    /// Which of `listed` (an item's types, in the order the source listed them) answers
    /// `patterns` (a request, or a reader's types in its order of preference) best: the
    /// closest match first, then the earlier pattern, then the earlier listed type. Returns
    /// the listed type's position. Types that do not parse are skipped.
    public func select(among listed: [String], for patterns: [TypePattern]) -> Int? {
        select(among: listed.map { try? TypeIdentifier($0) }, for: patterns)
    }

    /// `select` among types already parsed; nil stands for one that does not parse.
    public func select(among listed: [TypeIdentifier?], for patterns: [TypePattern]) -> Int? {
        var best: (rank: (TypeMatch, Int, Int), position: Int)?
        for (position, type) in listed.enumerated() {
            guard let type else { continue }
            for (order, pattern) in patterns.enumerated() {
                guard let closeness = match(type, to: pattern) else { continue }
                let rank = (closeness, order, position)
                if best.map({ rank < $0.rank }) ?? true { best = (rank, position) }
            }
        }
        return best?.position
    }

    /// Checks a pattern from a policy file up front, so a typo is reported when the policy
    /// is loaded instead of silently matching nothing.
    public static func validatePattern(_ pattern: String) throws(TypeIdentifierError) {
        _ = try TypePattern(pattern)
    }

    private func majorType(_ essence: String) -> String {
        String(essence.prefix { $0 != "/" })
    }

    private static func pairs(in path: String) throws -> [(String, String)] {
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: path))
        } catch let error as CocoaError where error.code == .fileReadNoSuchFile {
            return []
        }
        return String(decoding: data, as: UTF8.self).split(separator: "\n").compactMap { line in
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard fields.count == 2 else { return nil }
            return (fields[0].lowercased(), fields[1].lowercased())
        }
    }
}

/// A parsed request: what a destination asks for (`ConformingItems`, `Load`, a reader's
/// types) or what a policy's `Types=` names. A MIME type with or without parameters, a
/// wildcard (`image/*`, `*/*`, `*`), or a UTI: a concrete UTI stands for its MIME type
/// (`public.png` is `image/png`), an abstract one for a family (`public.image` is `image/*`).
public struct TypePattern: Sendable {
    enum Kind: Sendable {
        case everything
        case majorTypes(Set<String>)
        case exact(String)
    }

    let kind: Kind
    /// Required in the type; parameters the pattern leaves out are not constrained.
    let parameters: [MimeParameter]

    static let expected = "expected a MIME type such as image/png, a wildcard such as image/* or */*, "
        + "or a UTI such as public.image"

    public init(_ raw: String) throws(TypeIdentifierError) {
        let parsed: MimeSyntax.Input
        do {
            parsed = try MimeSyntax.parse(raw, wildcards: true, expected: Self.expected)
        } catch {
            throw TypeIdentifierError(message: "'\(quoted(raw))' is not a type pattern: \(error.text)")
        }
        switch parsed {
        case .mime(let mime):
            self.init(mime)
        case .uti(let uti):
            if let kind = abstractUTIs[uti] {
                self.init(kind: kind, parameters: [])
            } else if let mime = utiAliases[uti].flatMap({ try? MimeSyntax.parseMime($0, wildcards: false) }) {
                self.init(mime)
            } else {
                throw TypeIdentifierError(message: "'\(quoted(raw))' is not a type pattern: "
                    + "it is not a UTI this system knows; use a MIME type or wildcard instead, such as image/*")
            }
        }
    }

    private init(kind: Kind, parameters: [MimeParameter]) {
        self.kind = kind
        self.parameters = parameters
    }

    private init(_ mime: ParsedMime) {
        let kind: Kind = mime.type == "*" ? .everything
            : mime.subtype == "*" ? .majorTypes([mime.type])
            : .exact(mime.essence)
        self.init(kind: kind, parameters: mime.parameters)
    }
}

/// How closely a listed type answers a request, closest first.
public enum TypeMatch: Int, Comparable, Sendable {
    /// The same type with the same parameters: `text/plain;charset=utf-8` for itself.
    case exact
    /// The same type, carrying parameters the request leaves out: `text/plain;charset=utf-8`
    /// for `text/plain`.
    case parameters
    /// A subtype (`text/x-python` for `text/plain`, by shared-mime-info), a wildcard's
    /// member, or an abstract UTI's.
    case conforming

    public static func < (lhs: TypeMatch, rhs: TypeMatch) -> Bool { lhs.rawValue < rhs.rawValue }
}

import Foundation

/// Reads `dragbroker.conf` and its drop-ins the way systemd reads logind.conf(5).
public enum PolicyLoader {
    public static let defaultDirectory = "/etc/dragbroker"

    /// The main file, then `dragbroker.conf.d/*.conf` in byte order of their names. All or
    /// nothing: a broken drop-in must not leave the daemon running half a policy.
    public static func load(directory: String = defaultDirectory,
                            validateTypePattern: (String) throws -> Void = { _ in }) throws(PolicyError) -> Policy {
        guard let isDirectory = kind(of: directory) else { return .default }
        guard isDirectory else { throw PolicyError(file: directory, line: 0, message: "not a directory") }
        let main = join(directory, "dragbroker.conf")
        let files = (kind(of: main) == nil ? [] : [main]) + (try dropIns(in: join(directory, "dragbroker.conf.d")))
        var reader = Reader()
        for file in files { try reader.read(file, validateTypePattern) }
        return reader.policy
    }

    /// One file on its own, for `dragctl policy check FILE`.
    public static func parse(file path: String,
                             validateTypePattern: (String) throws -> Void = { _ in }) throws(PolicyError) -> Policy {
        var reader = Reader()
        try reader.read(path, validateTypePattern)
        return reader.policy
    }

    /// Every section and the keys it accepts, in the reader's own terms, so that what documents
    /// the files can be checked against what reads them.
    public static var sections: [(name: String, keys: [String])] {
        SectionKind.allCases.map { ($0.rawValue, $0.keys) }
    }

    /// nil when nothing is there (a dangling symlink included), else whether it is a directory.
    private static func kind(of path: String) -> Bool? {
        var isDirectory: ObjCBool = false
        return FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) ? isDirectory.boolValue : nil
    }

    private static func join(_ directory: String, _ name: String) -> String {
        directory.hasSuffix("/") ? directory + name : directory + "/" + name
    }

    /// Hidden files are skipped as systemd does, so editors' and package managers' leftovers
    /// never become policy.
    private static func dropIns(in directory: String) throws(PolicyError) -> [String] {
        guard kind(of: directory) == true else { return [] }
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: directory)
        } catch {
            throw PolicyError(file: directory, line: 0, message: "cannot list directory")
        }
        return names
            .filter { $0.hasSuffix(".conf") && !$0.hasPrefix(".") }
            .sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            .map { join(directory, $0) }
            .filter { kind(of: $0) == false }
    }
}

// MARK: - Reading

private typealias Located = (text: String, location: SourceLocation)

private enum SectionKind: String, CaseIterable {
    case app = "App", team = "Team", flow = "Flow", limits = "Limits", pasteboard = "Pasteboard", audit = "Audit"

    var keys: [String] {
        switch self {
        case .app: ["Executable", "AppID", "Team", "Managed", "Sources"]
        case .team: ["Name", "Managed"]
        case .flow: ["From", "To", "Types", "LargerThan", "Channels", "Action"]
        case .limits: PolicyLimits.keys.map(\.name)
        case .pasteboard: ["ExpirationSec", "MaxExpirationSec", "ClearOffers"]
        case .audit: ["FailClosed", "RetentionDays"]
        }
    }
}

/// A repeatable section being read; it becomes an entry only once it is complete, because
/// required keys may come in any order.
private struct OpenSection {
    let kind: SectionKind
    let header: SourceLocation
    var executable, appID, name: Located?
    var team: String?
    var managed = false
    var sources: Set<AppEntry.Source>?
    var from, to: FlowEndpoint?
    var types: [String] = []
    var largerThan: UInt64?
    var channels: Set<FlowChannel> = []
    var action: FlowAction?

    func missing(_ keys: [String?]) -> PolicyError {
        PolicyError(header, "[\(kind.rawValue)] section is missing \(list(keys.compactMap { $0.map { "\($0)=" } }, "and"))")
    }
}

private struct Assignment {
    let key: String
    let value: String
    let location: SourceLocation

    func parse<T>(_ expected: String, _ parser: (String) -> T?) throws(PolicyError) -> T {
        guard let parsed = parser(value) else {
            throw PolicyError(location, "invalid value \"\(value)\" for \(key)=, expected \(expected)")
        }
        return parsed
    }

    /// An empty assignment resets to the default, as in systemd.
    func bool(default fallback: Bool) throws(PolicyError) -> Bool {
        try value.isEmpty ? fallback : parse("a boolean (yes, no, true, false, on, off, 1 or 0)", Syntax.bool)
    }
}

private struct Reader {
    var policy = Policy()
    var section: OpenSection?
    /// First location of every registered `Key=value` that must be unique.
    var firstSeen: [String: SourceLocation] = [:]

    mutating func read(_ file: String, _ validate: (String) throws -> Void) throws(PolicyError) {
        for line in try Self.logicalLines(of: file) { try apply(line.text, at: line.location, validate) }
        try closeSection()
        policy.files.append(file)
    }

    /// Joins continuations and drops comments and blank lines. A joined line is reported at
    /// its first physical line, where the administrator will look for it.
    static func logicalLines(of file: String) throws(PolicyError) -> [Located] {
        guard let data = FileManager.default.contents(atPath: file) else {
            throw PolicyError(file: file, line: 0, message: "cannot read file")
        }
        var result: [Located] = []
        var pending: Located?
        for (index, bytes) in data.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).enumerated() {
            let location = SourceLocation(file: file, line: index + 1)
            guard var line = String(validating: bytes, as: UTF8.self) else {
                throw PolicyError(location, "line is not valid UTF-8")
            }
            if index == 0, line.hasPrefix("\u{FEFF}") { line.removeFirst() }
            let trimmed = line.trimmed
            // Comment lines inside a continuation are skipped too, so a long value can be
            // annotated piece by piece.
            if trimmed.hasPrefix("#") || trimmed.hasPrefix(";") || (pending == nil && trimmed.isEmpty) { continue }
            // Trailing blanks after the backslash are invisible in an editor; they must not
            // silently end the continuation.
            var joined = String(((pending?.text ?? "") + line).trimmed)
            let start = pending?.location ?? location
            if joined.hasSuffix("\\") {
                joined.removeLast()
                pending = (joined + " ", start)
            } else {
                pending = nil
                result.append((joined, start))
            }
        }
        if let pending { result.append((String(pending.text.trimmed), pending.location)) }
        return result
    }

    mutating func apply(_ line: String, at location: SourceLocation, _ validate: (String) throws -> Void) throws(PolicyError) {
        if line.hasPrefix("[") && line.hasSuffix("]") {
            try closeSection()
            let name = String(line.dropFirst().dropLast())
            guard let kind = SectionKind(rawValue: name) else {
                let known = SectionKind.allCases.map { "[\($0.rawValue)]" }
                throw PolicyError(location, "unknown section [\(name)], expected \(list(known, "or"))")
            }
            section = OpenSection(kind: kind, header: location)
        } else if let equals = line.firstIndex(of: "="), !line.hasPrefix("["), !line[..<equals].trimmed.isEmpty {
            let assignment = Assignment(key: String(line[..<equals].trimmed),
                                        value: String(line[line.index(after: equals)...].trimmed),
                                        location: location)
            try assign(assignment, validate)
        } else {
            throw PolicyError(location, "malformed line \"\(line)\", expected [Section], Key=Value or a comment")
        }
    }

    mutating func assign(_ a: Assignment, _ validate: (String) throws -> Void) throws(PolicyError) {
        guard var s = section else {
            throw PolicyError(a.location, "key \"\(a.key)\" appears before any [Section] header")
        }
        if s.kind == .limits, let path = PolicyLimits.keys.first(where: { $0.name == a.key })?.path {
            policy.limits[keyPath: path] = try a.value.isEmpty
                ? PolicyLimits()[keyPath: path]
                : a.parse("an integer from 1 to 1000000", Syntax.integer(1...1_000_000))
            policy.settingOrigins["Limits.\(a.key)"] = a.value.isEmpty ? nil : a.location
            return
        }
        switch (s.kind, a.key) {
        case (.app, "Executable"):
            s.executable = (try a.parse(Syntax.pathExpected, Syntax.path), a.location)
        case (.app, "AppID"):
            s.appID = (try a.parse(Syntax.identifierExpected, Syntax.identifier), a.location)
        case (.app, "Sources"):
            s.sources = try a.value.isEmpty ? nil : Set(a.value.split(whereSeparator: \.isWhitespace).map { word throws(PolicyError) in
                guard let source = AppEntry.Source(rawValue: String(word)) else {
                    throw PolicyError(a.location, "invalid value \"\(word)\" in Sources=, expected flatpak, snap or systemd-unit")
                }
                return source
            })
        case (.app, "Team"):
            s.team = try a.value.isEmpty ? nil : a.parse(Syntax.identifierExpected, Syntax.identifier)
        case (.app, "Managed"), (.team, "Managed"):
            s.managed = try a.bool(default: false)
        case (.team, "Name"):
            s.name = (try a.parse(Syntax.identifierExpected, Syntax.identifier), a.location)
        case (.flow, "From"), (.flow, "To"):
            let endpoint = try a.parse("any, managed, unmanaged, app:<AppID> or team:<Team>", Syntax.endpoint)
            if a.key == "From" { s.from = endpoint } else { s.to = endpoint }
        case (.flow, "Types"):
            s.types = a.value.split(whereSeparator: \.isWhitespace).map(String.init)
            for pattern in s.types {
                do {
                    try validate(pattern)
                } catch {
                    throw PolicyError(a.location, "invalid type pattern \"\(pattern)\" in Types=: \(error)")
                }
            }
        case (.flow, "LargerThan"):
            s.largerThan = try a.value.isEmpty ? nil : a.parse("a size in bytes with an optional K, M or G suffix", Syntax.size)
        case (.flow, "Channels"):
            s.channels = try Set(a.value.split(whereSeparator: \.isWhitespace).map { word throws(PolicyError) in
                guard let channel = FlowChannel(rawValue: String(word)) else {
                    throw PolicyError(a.location, "invalid value \"\(word)\" in Channels=, expected drag or paste")
                }
                return channel
            })
        case (.pasteboard, "ExpirationSec"), (.pasteboard, "MaxExpirationSec"):
            let path: WritableKeyPath<PasteboardOptions, Int> = a.key == "ExpirationSec" ? \.expirationSec : \.maxExpirationSec
            policy.pasteboard[keyPath: path] = try a.value.isEmpty
                ? PasteboardOptions()[keyPath: path]
                : a.parse("a number of seconds from 1 to 1000000", Syntax.integer(1...1_000_000))
            policy.settingOrigins["Pasteboard.\(a.key)"] = a.value.isEmpty ? nil : a.location
        case (.pasteboard, "ClearOffers"):
            policy.pasteboard.clearOffers = try a.bool(default: PasteboardOptions().clearOffers)
            policy.settingOrigins["Pasteboard.\(a.key)"] = a.value.isEmpty ? nil : a.location
        case (.flow, "Action"):
            s.action = try a.parse("allow or deny", FlowAction.init(rawValue:))
        case (.audit, "FailClosed"):
            policy.audit.failClosed = try a.bool(default: AuditOptions().failClosed)
            policy.settingOrigins["Audit.\(a.key)"] = a.value.isEmpty ? nil : a.location
        case (.audit, "RetentionDays"):
            policy.audit.retentionDays = try a.value.isEmpty
                ? AuditOptions().retentionDays
                : a.parse("a number of days from 0 (keep forever) to 1000000", Syntax.integer(0...1_000_000))
            policy.settingOrigins["Audit.\(a.key)"] = a.value.isEmpty ? nil : a.location
        default:
            let known = s.kind.keys.map { "\($0)=" }
            throw PolicyError(a.location, "unknown key \"\(a.key)\" in [\(s.kind.rawValue)], expected \(list(known, "or"))")
        }
        section = s
    }

    mutating func closeSection() throws(PolicyError) {
        guard let s = section else { return }
        section = nil
        switch s.kind {
        case .app:
            guard let appID = s.appID else { throw s.missing(["AppID"]) }
            if let executable = s.executable { try register("Executable", executable) }
            try register("AppID", appID)
            policy.apps.append(AppEntry(executable: s.executable?.text, appID: appID.text, team: s.team,
                                        managed: s.managed, sources: s.sources, origin: s.header))
        case .team:
            guard let name = s.name else { throw s.missing(["Name"]) }
            try register("Name", name)
            policy.teams.append(TeamEntry(name: name.text, managed: s.managed, origin: s.header))
        case .flow:
            guard let from = s.from, let to = s.to, let action = s.action else {
                throw s.missing([s.from == nil ? "From" : nil, s.to == nil ? "To" : nil, s.action == nil ? "Action" : nil])
            }
            policy.flows.append(FlowRule(from: from, to: to, typePatterns: s.types, largerThan: s.largerThan,
                                         channels: s.channels, action: action, origin: s.header))
        case .limits, .pasteboard, .audit:
            break
        }
    }

    /// Two entries for one executable or app ID would make identity depend on file order.
    mutating func register(_ key: String, _ value: Located) throws(PolicyError) {
        if let first = firstSeen["\(key)=\(value.text)"] {
            throw PolicyError(value.location, "duplicate \(key)= \"\(value.text)\", first set at \(first)")
        }
        firstSeen["\(key)=\(value.text)"] = value.location
    }
}

// MARK: - Value syntax

private enum Syntax {
    static let pathExpected = "an absolute, normalized path such as /usr/bin/example"
    static let identifierExpected = "a reverse-DNS name such as com.example.Mail "
        + "(letters, digits, '-' and '_', at least two dot-separated components, at most 255 characters)"

    static func bool(_ text: String) -> Bool? {
        switch text.lowercased() {
        case "yes", "true", "on", "1": true
        case "no", "false", "off", "0": false
        default: nil
        }
    }

    /// Normalized because the daemon compares it with the kernel's canonical
    /// `/proc/PID/exe`; `/usr/bin/../bin/x` would simply never match.
    static func path(_ text: String) -> String? {
        let components = text.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
        guard text.hasPrefix("/"), text.utf8.count <= 4096, !text.contains("\0"),
              components.allSatisfy({ !$0.isEmpty && $0 != "." && $0 != ".." }) else { return nil }
        return text
    }

    static func identifier(_ text: String) -> String? {
        let components = text.split(separator: ".", omittingEmptySubsequences: false)
        let valid = text.utf8.count <= 255 && components.count >= 2 && components.allSatisfy { component in
            !component.isEmpty && component.unicodeScalars.allSatisfy {
                ("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0) || $0 == "-" || $0 == "_"
            }
        }
        return valid ? text : nil
    }

    static func endpoint(_ text: String) -> FlowEndpoint? {
        switch text {
        case "any": return .any
        case "managed": return .managed
        case "unmanaged": return .unmanaged
        default:
            if text.hasPrefix("app:") { return identifier(String(text.dropFirst(4))).map(FlowEndpoint.app) }
            if text.hasPrefix("team:") { return identifier(String(text.dropFirst(5))).map(FlowEndpoint.team) }
            return nil
        }
    }

    static func integer(_ range: ClosedRange<Int>) -> (String) -> Int? {
        { text in
            guard !text.isEmpty, text.allSatisfy({ $0.isASCII && $0.isNumber }), let value = Int(text),
                  range.contains(value) else { return nil }
            return value
        }
    }

    static let sizeSuffixes: [(suffix: String, shift: UInt64)] = [("G", 30), ("M", 20), ("K", 10)]

    static func size(_ text: String) -> UInt64? {
        let suffix = sizeSuffixes.first { text.hasSuffix($0.suffix) }
        let digits = text.dropLast(suffix == nil ? 0 : 1)
        guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }), let value = UInt64(digits) else { return nil }
        let (bytes, overflow) = value.multipliedReportingOverflow(by: 1 << (suffix?.shift ?? 0))
        return overflow ? nil : bytes
    }

    static func format(_ value: Bool) -> String { value ? "yes" : "no" }

    static func format(size: UInt64) -> String {
        guard size > 0, let unit = sizeSuffixes.first(where: { size % (1 << $0.shift) == 0 }) else { return "\(size)" }
        return "\(size >> unit.shift)\(unit.suffix)"
    }
}

/// "a, b or c", for messages that list what is accepted.
private func list(_ items: [String], _ conjunction: String) -> String {
    items.count <= 1 ? items.joined() : items.dropLast().joined(separator: ", ") + " \(conjunction) " + items.last!
}

extension StringProtocol where SubSequence == Substring {
    fileprivate var trimmed: Substring {
        guard let start = firstIndex(where: { !$0.isWhitespace }),
              let end = lastIndex(where: { !$0.isWhitespace }) else { return self[endIndex...] }
        return self[start...end]
    }
}

// MARK: - Rendering

extension Policy {
    /// The effective policy in the syntax it was read from, each entry annotated with the
    /// line that decided it, for `dragctl policy show`. Reading the output back gives the
    /// same entries and settings.
    public func render() -> String {
        var lines = ["# Effective dragbroker policy"]
        lines += files.isEmpty ? ["# No configuration files were read: built-in defaults."] : files.map { "# read \($0)" }
        for app in apps {
            lines += ["", "# from \(app.origin)", "[App]"]
            if let executable = app.executable { lines.append("Executable=\(executable)") }
            lines.append("AppID=\(app.appID)")
            // Written whenever there are any, so the reader need not know the default.
            if !app.sources.isEmpty {
                lines.append("Sources=" + AppEntry.Source.allCases.filter(app.sources.contains).map(\.rawValue).joined(separator: " "))
            }
            if let team = app.team { lines.append("Team=\(team)") }
            lines.append("Managed=\(Syntax.format(app.managed))")
        }
        for team in teams {
            lines += ["", "# from \(team.origin)", "[Team]", "Name=\(team.name)", "Managed=\(Syntax.format(team.managed))"]
        }
        for flow in flows {
            lines += ["", "# from \(flow.origin)", "[Flow]", "From=\(flow.from)", "To=\(flow.to)"]
            if !flow.typePatterns.isEmpty { lines.append("Types=\(flow.typePatterns.joined(separator: " "))") }
            if let size = flow.largerThan { lines.append("LargerThan=\(Syntax.format(size: size))") }
            if !flow.channels.isEmpty {
                lines.append("Channels=" + FlowChannel.allCases.filter(flow.channels.contains).map(\.rawValue).joined(separator: " "))
            }
            lines.append("Action=\(flow.action.rawValue)")
        }
        lines += ["", "[Limits]"]
        for (name, path) in PolicyLimits.keys {
            let value = limits[keyPath: path]
            lines += [provenance("Limits.\(name)", isDefault: value == PolicyLimits()[keyPath: path]), "\(name)=\(value)"]
        }
        let defaults = PasteboardOptions()
        lines += ["", "[Pasteboard]",
                  provenance("Pasteboard.ExpirationSec", isDefault: pasteboard.expirationSec == defaults.expirationSec),
                  "ExpirationSec=\(pasteboard.expirationSec)",
                  provenance("Pasteboard.MaxExpirationSec", isDefault: pasteboard.maxExpirationSec == defaults.maxExpirationSec),
                  "MaxExpirationSec=\(pasteboard.maxExpirationSec)",
                  provenance("Pasteboard.ClearOffers", isDefault: pasteboard.clearOffers == defaults.clearOffers),
                  "ClearOffers=\(Syntax.format(pasteboard.clearOffers))"]
        lines += ["", "[Audit]",
                  provenance("Audit.FailClosed", isDefault: audit.failClosed == AuditOptions().failClosed),
                  "FailClosed=\(Syntax.format(audit.failClosed))",
                  provenance("Audit.RetentionDays", isDefault: audit.retentionDays == AuditOptions().retentionDays),
                  "RetentionDays=\(audit.retentionDays)"]
        return lines.joined(separator: "\n") + "\n"
    }

    /// A policy built in code has values no file set; say so rather than claim a default.
    private func provenance(_ key: String, isDefault: Bool) -> String {
        if let origin = settingOrigins[key] { return "# from \(origin)" }
        return isDefault ? "# default" : "# set by the program"
    }
}

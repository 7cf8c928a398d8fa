import ArgumentParser
import BrokerPolicy
@testable import dragctl
import Foundation
import XCTest

/// The manual pages in man/ describe what the code accepts: every policy key, every daemon
/// option, every dragctl verb, in pages that groff reads without a warning.
final class ManualTests: XCTestCase {
    static let manuals = DocumentationTests.root.appendingPathComponent("man")
    static let pages = ["dragbrokerd.8", "dragbroker.conf.5", "dragbroker.7"]

    func testEveryPageParsesWithoutWarnings() throws {
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: Self.manuals.path).sorted(), Self.pages.sorted())
        for page in Self.pages {
            let groff = try runTool("/usr/bin/groff", ["-man", "-ww", "-z", "-Tutf8", Self.manuals.appendingPathComponent(page).path])
            XCTAssertEqual(groff.status, 0, page)
            XCTAssertEqual(groff.stderr, "", page)
        }
    }

    /// Each key is a tagged paragraph (`.TP`) under its section's heading, as systemd's pages
    /// list theirs.
    func testEveryPolicyKeyIsDescribedUnderItsSection() throws {
        let sections = PolicyLoader.sections
        XCTAssertEqual(sections.map(\.name), ["App", "Team", "Flow", "Limits", "Pasteboard", "Audit"])
        let page = try Roff(contentsOf: Self.manuals.appendingPathComponent("dragbroker.conf.5"))
        var missing: [String] = []
        for (name, keys) in sections {
            let described = Set(page.tags(under: "[\(name)] SECTION OPTIONS").compactMap { $0.split(separator: "=").first.map(String.init) })
            missing += keys.filter { !described.contains($0) }.map { "[\(name)] \($0)=" }
        }
        XCTAssertEqual(missing, [], "policy keys the loader accepts that man/dragbroker.conf.5 does not describe")
    }

    /// The options are read from the daemon's own parser, and must be the ones its --help
    /// lists.
    func testEveryDaemonOptionIsDescribed() throws {
        let source = try String(contentsOf: DocumentationTests.root.appendingPathComponent("Sources/dragbrokerd/main.swift"), encoding: .utf8)
        let parser = try XCTUnwrap(source.range(of: "static func parse(").map { source[$0.lowerBound...] })
        let body = String(parser[..<(parser.range(of: "\n    }\n")?.upperBound ?? parser.endIndex)])
        let labels = try NSRegularExpression(pattern: #"case ((?:"-[^"]+"(?:, )?)+):"#)
        let flags: [String] = labels.matches(in: body, range: NSRange(body.startIndex..., in: body)).flatMap { match in
            body[Range(match.range(at: 1), in: body)!].split(separator: ", ").map { String($0.dropFirst().dropLast()) }
        }

        let help = try runTool(productsDirectory.appendingPathComponent("dragbrokerd").path, ["--help"])
        XCTAssertEqual(help.status, 0)
        let listed = help.stdout.split(separator: "\n").map { $0.drop { $0 == " " } }.filter { $0.hasPrefix("-") }.flatMap { line in
            (line.range(of: "  ").map { line[..<$0.lowerBound] } ?? line).split(separator: ", ").map { String($0.prefix { $0 != " " }) }
        }
        XCTAssertEqual(flags.sorted(), listed.sorted(), "the options the parser accepts and those --help lists")

        let page = try Roff(contentsOf: Self.manuals.appendingPathComponent("dragbrokerd.8"))
        let described = Set(page.tags(under: "OPTIONS").flatMap { tag in tag.split(separator: ", ").map { String($0.prefix { $0 != " " }) } })
        XCTAssertEqual(flags.filter { !described.contains($0) }, [], "dragbrokerd options that man/dragbrokerd.8 does not describe")
    }

    /// dragctl(1) is generated from the command itself by swift-argument-parser's
    /// generate-manual, exactly as `make install` runs it.
    func testTheGeneratedDragctlPageNamesEveryVerb() throws {
        let generator = productsDirectory.appendingPathComponent("generate-manual")
        guard FileManager.default.isExecutableFile(atPath: generator.path) else {
            return XCTFail("\(generator.path) is missing: build it with 'swift build --product generate-manual' (make test does)")
        }
        let output = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-manual-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: output, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: output) }
        let generated = try runTool(generator.path, [productsDirectory.appendingPathComponent("dragctl").path, "--output-directory", output.path])
        XCTAssertEqual(generated.status, 0, generated.stderr)
        let page = try String(contentsOf: output.appendingPathComponent("dragctl.1"), encoding: .utf8)
        let items = Set(page.split(separator: "\n").filter { $0.hasPrefix(".It Em ") }.map { String($0.dropFirst(".It Em ".count)) })

        func verbs(of command: any ParsableCommand.Type) -> [String] {
            command.configuration.subcommands.flatMap { [$0._commandName] + verbs(of: $0) }
        }
        let all = verbs(of: Dragctl.self)
        XCTAssertEqual(all.filter { !items.contains($0) }, [], "dragctl verbs that the generated dragctl.1 does not list")
        XCTAssertEqual(items.subtracting(all), ["help"], "the page lists the verbs of the command, nested ones included, and help")
    }

}

/// Just enough of a man(7) page to read its headings and the tags of its tagged paragraphs as
/// a reader sees them: `.BI Key= value` reads `Key=value`, `\-\-help` reads `--help`.
struct Roff {
    let lines: [Substring]

    init(contentsOf url: URL) throws {
        lines = try String(contentsOf: url, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
    }

    /// The tags (`.TP` and `.TQ`) between the heading `.SH` `section` and the next `.SH`.
    func tags(under section: String) -> [String] {
        var inside = false
        var tags: [String] = []
        for (index, line) in lines.enumerated() {
            if line.hasPrefix(".SH ") {
                inside = Self.text(of: line) == section
            } else if inside, line == ".TP" || line == ".TQ", index + 1 < lines.count {
                tags.append(Self.text(of: lines[index + 1]))
            }
        }
        return tags
    }

    /// A line's text: a font macro's arguments run together (alternating ones without the
    /// space between), escapes for hyphens and fonts resolved.
    static func text(of line: Substring) -> String {
        var words: [String] = []
        var rest = line
        let macro = line.hasPrefix(".") ? String(line.prefix { $0 != " " }) : ""
        rest = rest.dropFirst(macro.count)
        while let start = rest.firstIndex(where: { $0 != " " }) {
            rest = rest[start...]
            if rest.hasPrefix("\""), let end = rest.dropFirst().firstIndex(of: "\"") {
                words.append(String(rest[rest.index(after: rest.startIndex)..<end]))
                rest = rest[rest.index(after: end)...]
            } else {
                let end = rest.firstIndex(of: " ") ?? rest.endIndex
                words.append(String(rest[..<end]))
                rest = rest[end...]
            }
        }
        let alternating = ["BI", "BR", "IB", "IR", "RB", "RI"].contains(macro.dropFirst())
        return words.joined(separator: alternating ? "" : " ")
            .replacingOccurrences(of: #"\\f[BIRP]"#, with: "", options: .regularExpression)
            .replacingOccurrences(of: "\\-", with: "-")
            .replacingOccurrences(of: "\\&", with: "")
            .replacingOccurrences(of: "\\|", with: "")
    }
}

/// systemd/dragbroker.catalog explains every MESSAGE_ID the daemon logs, and compiles with
/// this machine's journalctl.
final class JournalCatalogTests: XCTestCase {
    /// What `journalctl --list-catalog` shows for each, by the name of its constant in
    /// AuditJournal.
    static let subjects = [
        "transferMessageID": "Transfer of @DRAGBROKER_TYPE@ from @DRAGBROKER_SOURCE_APP@ to @DRAGBROKER_DESTINATION_APP@: @DRAGBROKER_OUTCOME@",
        "refusalMessageID": "Refused @DRAGBROKER_ACTION@ for @DRAGBROKER_APP@: @DRAGBROKER_ERROR@",
        "sessionMessageID": "Session @DRAGBROKER_SESSION@ from @DRAGBROKER_SOURCE_APP@ ended: @DRAGBROKER_OUTCOME@",
        "gapMessageID": "The transfer log is missing @DRAGBROKER_LOST@ record(s)",
    ]

    func testEveryMessageIDHasACatalogEntryWithItsSubject() throws {
        let source = try String(contentsOf: DocumentationTests.root.appendingPathComponent("Sources/dragbrokerd/Audit/AuditJournal.swift"),
                                encoding: .utf8)
        let constants = try NSRegularExpression(pattern: #"static let (\w+MessageID) = "([0-9a-f]{32})""#)
        let ids = constants.matches(in: source, range: NSRange(source.startIndex..., in: source)).map { match in
            (name: String(source[Range(match.range(at: 1), in: source)!]), id: String(source[Range(match.range(at: 2), in: source)!]))
        }
        XCTAssertEqual(ids.map(\.name).sorted(), Self.subjects.keys.sorted(), "a new MESSAGE_ID needs a catalog entry, and its subject here")

        let root = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-catalog-\(UUID().uuidString)")
        let catalogs = root.appendingPathComponent("usr/lib/systemd/catalog")
        try FileManager.default.createDirectory(at: catalogs, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        try FileManager.default.copyItem(at: DocumentationTests.root.appendingPathComponent("systemd/dragbroker.catalog"),
                                         to: catalogs.appendingPathComponent("dragbroker.catalog"))
        let update = try runTool("/usr/bin/journalctl", ["--root=\(root.path)", "--update-catalog"])
        XCTAssertEqual(update.status, 0)
        XCTAssertEqual(update.stderr, "", "journalctl's complaints about the catalog")
        let list = try runTool("/usr/bin/journalctl", ["--root=\(root.path)", "--list-catalog"])
        XCTAssertEqual(list.status, 0, list.stderr)
        let listed = list.stdout.split(separator: "\n").map(String.init).sorted()
        XCTAssertEqual(listed, ids.map { "\($0.id) dragbroker: \(Self.subjects[$0.name] ?? "?")" }.sorted())
    }
}

/// Runs a tool to its end with a plain environment; its output is small enough for the pipes.
func runTool(_ executable: String, _ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    process.environment = ["PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"]
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    let stdout = out.fileHandleForReading.readDataToEndOfFile()
    let stderr = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: stdout, as: UTF8.self), String(decoding: stderr, as: UTF8.self))
}

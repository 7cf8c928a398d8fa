import BrokerPolicy
import Foundation
import UniformTypes
import XCTest

/// What the README shows must be what the code does.
final class DocumentationTests: XCTestCase {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    func testTheREADMEPolicyExampleIsTheTestedFileAndDeniesManagedOpenIn() throws {
        let example = Self.root.appendingPathComponent("examples/dragbroker.conf")
        let text = try String(contentsOf: example, encoding: .utf8)
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let indented = text.split(separator: "\n", omittingEmptySubsequences: false)
            .map { $0.isEmpty ? "" : "    " + $0 }.joined(separator: "\n")
        XCTAssertTrue(readme.contains(indented), "README's policy example must be examples/dragbroker.conf verbatim")

        let policy = try PolicyLoader.parse(file: example.path) { try MimeDatabase.validatePattern($0) }
        let conforms: (String, String) -> Bool = { type, pattern in
            (try? TypeIdentifier(type)).map { MimeDatabase.system.conforms($0, to: pattern) } ?? false
        }
        let mail = Policy.FlowParty(appID: "com.corp.Mail", team: "com.corp", managed: true)
        let notes = Policy.FlowParty(appID: "com.corp.Notes", team: "com.corp", managed: true)
        let gimp = Policy.FlowParty(appID: "org.gimp.GIMP", team: nil, managed: false)
        let denied = policy.decide(from: mail, to: gimp, type: "image/png", size: nil, conforms: conforms)
        XCTAssertEqual(denied.action, .deny)
        XCTAssertEqual(denied.rule?.origin, SourceLocation(file: example.path, line: try lineNumber(of: "From=managed", in: example) - 1))
        XCTAssertEqual(policy.decide(from: mail, to: notes, type: "image/png", size: 1 << 20, conforms: conforms).action, .allow)
        XCTAssertEqual(policy.decide(from: gimp, to: mail, type: "image/png", size: nil, conforms: conforms).action, .allow)
        XCTAssertEqual(policy.decide(from: mail, to: notes, type: "image/png", size: 200 << 20, conforms: conforms).action, .deny)
        XCTAssertEqual(policy.byteLimit(from: mail, to: notes, type: "image/png", conforms: conforms)?.limit, 100 << 20)
        XCTAssertEqual(policy.limits.sessionsPerConnection, 8)
        XCTAssertEqual(policy.audit.retentionDays, 180)
    }
}

/// The README's D-Bus API reference is rendered from the published XML, so it cannot drift.
final class APIReferenceTests: XCTestCase {
    static func reference() throws -> String {
        let directory = DocumentationTests.root.appendingPathComponent("Sources/BrokerProtocol/Interfaces")
        var lines: [String] = []
        for name in ["org.dragbroker.Broker1.Manager", "org.dragbroker.Broker1.Session", "org.dragbroker.Provider1"] {
            let xml = try String(contentsOf: directory.appendingPathComponent("\(name).xml"), encoding: .utf8)
                .replacingOccurrences(of: "<!--[\\s\\S]*?-->", with: "", options: .regularExpression)
            lines.append("")
            lines.append("**`\(name)`**")
            lines.append("")
            let members = try NSRegularExpression(pattern: #"<(method|signal|property) name="(\w+)"([^>]*)>([\s\S]*?)</\1>"#)
            for match in members.matches(in: xml, range: NSRange(xml.startIndex..., in: xml)) {
                func group(_ i: Int) -> String { String(xml[Range(match.range(at: i), in: xml)!]) }
                let kind = group(1), member = group(2), attributes = group(3), body = group(4)
                let args = try NSRegularExpression(pattern: #"<arg type="([^"]+)" name="(\w+)"(?: direction="(in|out)")?/>"#)
                    .matches(in: body, range: NSRange(body.startIndex..., in: body))
                    .map { m -> (type: String, name: String, direction: String) in
                        func g(_ i: Int) -> String { m.range(at: i).location == NSNotFound ? "" : String(body[Range(m.range(at: i), in: body)!]) }
                        return (g(1), g(2), g(3))
                    }
                let inputs = args.filter { $0.direction != "out" }.map { "\($0.type) \($0.name)" }.joined(separator: ", ")
                let outputs = args.filter { $0.direction == "out" }.map { "\($0.type) \($0.name)" }.joined(separator: ", ")
                switch kind {
                case "method": lines.append("- method `\(member)(\(inputs))`" + (outputs.isEmpty ? "" : " → `(\(outputs))`"))
                case "signal": lines.append("- signal `\(member)(\(inputs))`")
                default:
                    let type = attributes.range(of: #"type="([^"]+)""#, options: .regularExpression).map { String(attributes[$0].dropFirst(6).dropLast()) } ?? "?"
                    lines.append("- property `\(member)` `\(type)`")
                }
            }
        }
        return lines.joined(separator: "\n")
    }

    func testTheREADMEReferenceMatchesThePublishedXML() throws {
        let readme = try String(contentsOf: DocumentationTests.root.appendingPathComponent("README.md"), encoding: .utf8)
        guard let start = readme.range(of: "<!-- api-reference-begin -->\n"), let end = readme.range(of: "\n<!-- api-reference-end -->") else {
            return XCTFail("README has no API reference block")
        }
        let expected = try Self.reference()
        let actual = String(readme[start.upperBound..<end.lowerBound])
        if actual != expected { print("--- expected reference ---\n\(expected)\n---") }
        XCTAssertEqual(actual, expected)
    }
}

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

import BrokerPolicy
import Foundation
import XCTest

final class BrokerPolicyTests: XCTestCase {
    private var directory: String!

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("BrokerPolicyTests-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        try FileManager.default.removeItem(atPath: directory)
    }

    @discardableResult
    private func write(_ name: String, _ text: String) throws -> String {
        let path = directory + "/" + name
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent,
                                                withIntermediateDirectories: true)
        try text.write(toFile: path, atomically: false, encoding: .utf8)
        return path
    }

    private var main: String { directory + "/dragbroker.conf" }
    private func dropIn(_ name: String) -> String { directory + "/dragbroker.conf.d/" + name }
    private func at(_ file: String, _ line: Int) -> SourceLocation { SourceLocation(file: file, line: line) }

    /// A stand-in for the daemon's MIME database: `type/*` covers its subtypes.
    private let conforms: (String, String) -> Bool = { type, pattern in
        pattern.hasSuffix("/*") ? type.hasPrefix(pattern.dropLast()) : type == pattern
    }

    private func loadError(_ body: () throws(PolicyError) -> Policy,
                           file: StaticString = #filePath, line: UInt = #line) -> String? {
        do {
            let policy = try body()
            XCTFail("expected an error, got \(policy)", file: file, line: line)
            return nil
        } catch {
            return error.description
        }
    }

    /// Writes `text` as the main file and checks the exact error `parse` reports.
    private func assertError(_ text: String, _ line: Int, _ message: String,
                             file: StaticString = #filePath, sourceLine: UInt = #line) throws {
        let path = try write("dragbroker.conf", text)
        let error = loadError({ () throws(PolicyError) in try PolicyLoader.parse(file: path) }, file: file, line: sourceLine)
        XCTAssertEqual(error, "\(path):\(line): \(message)", file: file, line: sourceLine)
    }

    // MARK: - A complete file

    func testFullExampleAndManagedOpenIn() throws {
        try write("dragbroker.conf", """
            # Example fleet policy
            [Team]
            Name=com.example
            Managed=yes

            [App]
            Executable=/usr/bin/example-mail
            AppID=com.example.Mail
            Team=com.example

            [App]
            Executable=/usr/bin/gnome-notes
            AppID=org.gnome.Notes

            [App]
            Executable=/opt/corp/bin/crm
            AppID=com.corp.CRM
            Managed=true

            ; Managed content never opens in unmanaged apps.
            [Flow]
            From=managed
            To=unmanaged
            Action=deny

            [Limits]
            SessionsTotal=100
            MaxStringLength=1024

            [Audit]
            FailClosed=yes
            RetentionDays=0
            """)
        let policy = try PolicyLoader.load(directory: directory)

        XCTAssertEqual(policy.files, [main])
        XCTAssertEqual(policy.teams, [TeamEntry(name: "com.example", managed: true, origin: at(main, 2))])
        XCTAssertEqual(policy.apps, [
            AppEntry(executable: "/usr/bin/example-mail", appID: "com.example.Mail", team: "com.example",
                     managed: false, origin: at(main, 6)),
            AppEntry(executable: "/usr/bin/gnome-notes", appID: "org.gnome.Notes", origin: at(main, 11)),
            AppEntry(executable: "/opt/corp/bin/crm", appID: "com.corp.CRM", managed: true, origin: at(main, 15)),
        ])
        let openIn = FlowRule(from: .managed, to: .unmanaged, action: .deny, origin: at(main, 21))
        XCTAssertEqual(policy.flows, [openIn])
        var limits = PolicyLimits()
        limits.sessionsTotal = 100
        limits.maxStringLength = 1024
        XCTAssertEqual(policy.limits, limits)
        XCTAssertEqual(policy.audit, AuditOptions(failClosed: true, retentionDays: 0))

        XCTAssertEqual(policy.app(forExecutable: "/opt/corp/bin/crm")?.appID, "com.corp.CRM")
        XCTAssertNil(policy.app(forExecutable: "/usr/bin/unknown"))
        let mailEntry = policy.app(forExecutable: "/usr/bin/example-mail")
        XCTAssertTrue(policy.isManaged(entry: mailEntry, team: "com.example"))
        XCTAssertTrue(policy.isManaged(entry: mailEntry, team: nil), "the entry knows its team")
        XCTAssertTrue(policy.isManaged(entry: nil, team: "com.example"))
        XCTAssertTrue(policy.isManaged(entry: policy.app(forExecutable: "/opt/corp/bin/crm"), team: nil))
        XCTAssertFalse(policy.isManaged(entry: policy.app(forExecutable: "/usr/bin/gnome-notes"), team: nil))
        XCTAssertNil(policy.app(id: "com.corp.CRM", from: .systemdUnit), "an entry by executable accepts no other source")
        XCTAssertNil(policy.app(id: "com.corp.CRM", from: .flatpak))

        func party(_ appID: String) -> Policy.FlowParty {
            let entry = policy.apps.first { $0.appID == appID }
            return Policy.FlowParty(appID: appID, team: entry?.team, managed: policy.isManaged(entry: entry, team: entry?.team))
        }
        let mail = party("com.example.Mail"), crm = party("com.corp.CRM"), notes = party("org.gnome.Notes")

        let denied = policy.decide(from: mail, to: notes, type: "text/plain", size: 12, conforms: conforms)
        XCTAssertEqual(denied.action, .deny)
        XCTAssertEqual(denied.rule?.origin, at(main, 21))
        XCTAssertEqual(policy.decide(from: crm, to: notes, type: "image/png", size: nil, conforms: conforms).rule, openIn)

        let managedToManaged = policy.decide(from: mail, to: crm, type: "text/plain", size: 12, conforms: conforms)
        XCTAssertEqual(managedToManaged.action, .allow)
        XCTAssertNil(managedToManaged.rule)
        let unmanagedToManaged = policy.decide(from: notes, to: mail, type: "text/plain", size: 12, conforms: conforms)
        XCTAssertEqual(unmanagedToManaged.action, .allow)
        XCTAssertNil(unmanagedToManaged.rule)
    }

    /// A rule scoped to one channel decides nothing on the other, and a later rule does.
    func testChannelsScopeARuleToDragOrPaste() throws {
        let origin = SourceLocation(file: "/etc/dragbroker/dragbroker.conf", line: 1)
        let pasteOnly = FlowRule(from: .managed, to: .unmanaged, channels: [.paste], action: .deny, origin: origin)
        let bigDrags = FlowRule(from: .any, to: .any, largerThan: 10, channels: [.drag], action: .deny, origin: origin)
        let policy = Policy(flows: [pasteOnly, bigDrags])
        let managed = Policy.FlowParty(appID: "com.corp.Mail", team: nil, managed: true)
        let other = Policy.FlowParty(appID: "org.example.Notes", team: nil, managed: false)
        XCTAssertEqual(policy.decide(from: managed, to: other, type: "text/plain", size: nil, channel: .paste, conforms: conforms).rule, pasteOnly)
        XCTAssertNil(policy.decide(from: managed, to: other, type: "text/plain", size: nil, channel: .drag, conforms: conforms).rule)
        XCTAssertEqual(policy.decide(from: other, to: managed, type: "text/plain", size: 11, channel: .drag, conforms: conforms).rule, bigDrags)
        XCTAssertEqual(policy.byteLimit(from: other, to: managed, type: "text/plain", channel: .drag, conforms: conforms)?.limit, 10)
        XCTAssertNil(policy.byteLimit(from: other, to: managed, type: "text/plain", channel: .paste, conforms: conforms))
    }

    // MARK: - Files and drop-ins

    func testDropInsApplyInByteOrderAndOverrideLimitsKeyByKey() throws {
        try write("dragbroker.conf", """
            [Limits]
            SessionsTotal=100
            ItemsPerSession=10
            MaxStringLength=999

            [Flow]
            From=app:com.example.A
            To=any
            Action=allow
            """)
        try write("dragbroker.conf.d/20-late.conf", """
            [Limits]
            ItemsPerSession=20

            [Flow]
            From=any
            To=any
            Action=deny
            """)
        try write("dragbroker.conf.d/10-early.conf", """
            [Limits]
            ItemsPerSession=5
            SessionsTotal=50
            MaxStringLength=
            """)
        try write("dragbroker.conf.d/9-last.conf", "[Limits]\nSessionsPerConnection=4\n")
        try write("dragbroker.conf.d/Z-upper-sorts-first.conf", "[Audit]\nRetentionDays=7\n")
        // None of these are drop-ins.
        try write("dragbroker.conf.d/README", "not a config file")
        try write("dragbroker.conf.d/.hidden.conf", "garbage")
        try write("dragbroker.conf.d/20-late.conf.orig", "garbage")
        try FileManager.default.createDirectory(atPath: dropIn("30-dir.conf"), withIntermediateDirectories: true)

        let policy = try PolicyLoader.load(directory: directory)
        XCTAssertEqual(policy.files, [main, dropIn("10-early.conf"), dropIn("20-late.conf"), dropIn("9-last.conf"),
                                      dropIn("Z-upper-sorts-first.conf")])
        var limits = PolicyLimits()
        limits.sessionsTotal = 50
        limits.itemsPerSession = 20
        limits.sessionsPerConnection = 4
        XCTAssertEqual(policy.limits, limits, "an empty assignment resets MaxStringLength to its default")
        XCTAssertEqual(policy.audit.retentionDays, 7)
        XCTAssertEqual(policy.flows.map(\.origin), [at(main, 6), at(dropIn("20-late.conf"), 4)])
        XCTAssertEqual(policy.flows.map(\.action), [.allow, .deny])

        let render = policy.render()
        XCTAssertTrue(render.contains("# from \(dropIn("10-early.conf")):3\nSessionsTotal=50\n"), render)
        XCTAssertTrue(render.contains("# from \(dropIn("20-late.conf")):2\nItemsPerSession=20\n"), render)
        XCTAssertTrue(render.contains("# default\nMaxStringLength=255\n"), render)
    }

    func testMissingDirectoryOrFilesMeanDefaults() throws {
        XCTAssertEqual(try PolicyLoader.load(directory: directory + "/does-not-exist"), .default)
        XCTAssertEqual(try PolicyLoader.load(directory: directory), .default)
        XCTAssertEqual(Policy.default.limits, PolicyLimits())
        XCTAssertEqual([Policy.default.limits.sessionsPerConnection, Policy.default.limits.sessionsTotal,
                        Policy.default.limits.itemsPerSession, Policy.default.limits.representationsPerItem,
                        Policy.default.limits.destinationsPerSession, Policy.default.limits.concurrentLoadsPerSession,
                        Policy.default.limits.maxStringLength], [16, 1024, 256, 32, 64, 16, 255])
        XCTAssertEqual(Policy.default.audit, AuditOptions(failClosed: false, retentionDays: 90))

        // Drop-ins are read even without a main file.
        try write("dragbroker.conf.d/50-only.conf", "[Audit]\nFailClosed=on\n")
        let policy = try PolicyLoader.load(directory: directory + "/")
        XCTAssertEqual(policy.files, [dropIn("50-only.conf")])
        XCTAssertTrue(policy.audit.failClosed)
    }

    func testABadDropInFailsTheWholeLoad() throws {
        try write("dragbroker.conf", "[Flow]\nFrom=managed\nTo=unmanaged\nAction=deny\n")
        try write("dragbroker.conf.d/10-fine.conf", "[Limits]\nSessionsTotal=10\n")
        try write("dragbroker.conf.d/20-broken.conf", "[Limits]\n\nSessionsTotal=lots\n")
        let error = loadError { () throws(PolicyError) in try PolicyLoader.load(directory: directory) }
        XCTAssertEqual(error, "\(dropIn("20-broken.conf")):3: invalid value \"lots\" for SessionsTotal=, "
                       + "expected an integer from 1 to 1000000")
    }

    func testDuplicateAppsAcrossFilesNameTheFirst() throws {
        try write("dragbroker.conf", """
            [App]
            Executable=/usr/bin/mail
            AppID=com.example.Mail
            """)
        try write("dragbroker.conf.d/50-local.conf", """
            # Someone registered it again.
            [App]
            AppID=com.example.Mail
            Executable=/usr/local/bin/mail
            """)
        let error = loadError { () throws(PolicyError) in try PolicyLoader.load(directory: directory) }
        XCTAssertEqual(error, "\(dropIn("50-local.conf")):3: duplicate AppID= \"com.example.Mail\", "
                       + "first set at \(main):3")
    }

    // MARK: - Evaluation

    func testFirstMatchingRuleWins() throws {
        try write("dragbroker.conf", """
            [Flow]
            From=app:com.example.A
            To=team:com.partner
            Action=allow

            [Flow]
            From=any
            To=team:com.partner
            Action=deny

            [Flow]
            From=team:com.example
            To=any
            Action=deny

            [Flow]
            From=any
            To=any
            Action=allow
            """)
        let policy = try PolicyLoader.load(directory: directory)
        let a = Policy.FlowParty(appID: "com.example.A", team: "com.example")
        let b = Policy.FlowParty(appID: "com.example.B", team: "com.example")
        let partner = Policy.FlowParty(appID: "com.partner.P", team: "com.partner")
        let other = Policy.FlowParty(appID: "org.other.O")

        func decide(_ from: Policy.FlowParty, _ to: Policy.FlowParty) -> String {
            let decision = policy.decide(from: from, to: to, type: "text/plain", size: nil, conforms: conforms)
            return "\(decision.action) by \(decision.rule.map { "line \($0.origin.line)" } ?? "default")"
        }
        XCTAssertEqual(decide(a, partner), "allow by line 1")
        XCTAssertEqual(decide(b, partner), "deny by line 6")
        XCTAssertEqual(decide(a, other), "deny by line 11")
        XCTAssertEqual(decide(other, a), "allow by line 16")
    }

    func testTypesAndLargerThanAndByteLimit() throws {
        try write("dragbroker.conf", """
            [Flow]
            From=any
            To=unmanaged
            Types=text/plain \\
                  text/html
            LargerThan=1M
            Action=deny

            [Flow]
            From=any
            To=unmanaged
            Types=image/*
            Action=allow

            [Flow]
            From=any
            To=unmanaged
            LargerThan=10M
            Action=deny
            """)
        let policy = try PolicyLoader.load(directory: directory)
        XCTAssertEqual(policy.flows[0].typePatterns, ["text/plain", "text/html"])
        XCTAssertEqual(policy.flows.map(\.largerThan), [1 << 20, nil, 10 << 20])

        let source = Policy.FlowParty(appID: "com.example.Source", managed: true)
        let unmanaged = Policy.FlowParty(appID: "org.other.Target")
        let managed = Policy.FlowParty(appID: "com.example.Target", managed: true)
        func decide(_ type: String, _ size: UInt64?, to: Policy.FlowParty? = nil) -> String {
            let decision = policy.decide(from: source, to: to ?? unmanaged, type: type, size: size, conforms: conforms)
            return "\(decision.action) by \(decision.rule.map { "line \($0.origin.line)" } ?? "default")"
        }
        func byteLimit(_ type: String, to: Policy.FlowParty? = nil) -> String? {
            policy.byteLimit(from: source, to: to ?? unmanaged, type: type, conforms: conforms)
                .map { "\($0.limit) by line \($0.rule.origin.line)" }
        }

        XCTAssertEqual(decide("text/html", 2 << 20), "deny by line 1")
        XCTAssertEqual(decide("text/html", 1 << 20), "allow by default", "exactly the threshold is not larger")
        XCTAssertEqual(decide("text/html", nil), "allow by default", "an unknown size cannot exceed a threshold")
        XCTAssertEqual(decide("image/png", 20 << 20), "allow by line 9")
        XCTAssertEqual(decide("application/pdf", 20 << 20), "deny by line 15")
        XCTAssertEqual(decide("application/pdf", 10 << 20), "allow by default")
        XCTAssertEqual(decide("text/html", 20 << 20, to: managed), "allow by default")

        XCTAssertEqual(byteLimit("text/plain"), "1048576 by line 1", "the smaller of the two matching thresholds")
        XCTAssertEqual(byteLimit("application/pdf"), "10485760 by line 15")
        XCTAssertNil(byteLimit("image/png"), "the unconditional allow comes first")
        XCTAssertNil(byteLimit("text/plain", to: managed))
    }

    func testByteLimitSkipsDenyRulesAnEarlierThresholdAllowHides() throws {
        try write("dragbroker.conf", """
            [Flow]
            From=any
            To=any
            LargerThan=1K
            Action=allow
            [Flow]
            From=any
            To=any
            LargerThan=5K
            Action=deny
            [Flow]
            From=any
            To=any
            LargerThan=512
            Action=deny
            """)
        let policy = try PolicyLoader.load(directory: directory)
        let a = Policy.FlowParty(appID: "com.example.A"), b = Policy.FlowParty(appID: "com.example.B")
        XCTAssertEqual(policy.decide(from: a, to: b, type: "text/plain", size: 700, conforms: conforms).rule?.origin.line, 11)
        XCTAssertEqual(policy.decide(from: a, to: b, type: "text/plain", size: 9000, conforms: conforms).rule?.action, .allow)
        let limit = policy.byteLimit(from: a, to: b, type: "text/plain", conforms: conforms)
        XCTAssertEqual(limit?.limit, 512)
        XCTAssertEqual(limit?.rule.origin.line, 11)
    }

    // MARK: - Syntax

    func testContinuationsCommentsAndWhitespace() throws {
        let path = try write("dragbroker.conf", [
            "\u{FEFF}# leading comment",
            "; semicolon comment",
            "   # an indented comment ending in a backslash does not continue \\",
            "[Flow]",
            "  From  =  app:com.example.A  ",
            "To=\\",
            "   any",
            "Types=text/plain \\",
            "  # a comment inside a continuation is skipped",
            "  text/html \\",
            "",
            "Action=deny\r",
            "[Team]\r",
            "Name=com.example\r",
        ].joined(separator: "\n"))
        let policy = try PolicyLoader.parse(file: path)
        XCTAssertEqual(policy.files, [path])
        XCTAssertEqual(policy.flows, [
            FlowRule(from: .app("com.example.A"), to: .any, typePatterns: ["text/plain", "text/html"],
                     action: .deny, origin: at(path, 4)),
        ])
        XCTAssertEqual(policy.teams, [TeamEntry(name: "com.example", origin: at(path, 13))])
    }

    func testContinuationAtEndOfFileAndErrorsReportTheFirstLine() throws {
        let path = try write("dragbroker.conf", "[Flow]\nFrom=any\nTo=any\nAction=\\\n deny\nTypes=image/png \\")
        XCTAssertEqual(try PolicyLoader.parse(file: path).flows,
                       [FlowRule(from: .any, to: .any, typePatterns: ["image/png"], action: .deny, origin: at(path, 1))])
        try assertError("[Flow]\nFrom=every\\\n  body\n", 2,
                        "invalid value \"every   body\" for From=, expected any, managed, unmanaged, app:<AppID> or team:<Team>")
    }

    // MARK: - Errors

    func testStructuralErrors() throws {
        try assertError("[Foo]\n", 1, "unknown section [Foo], expected [App], [Team], [Flow], [Limits], [Pasteboard] or [Audit]")
        try assertError("[Limits]\n[app]\n", 2, "unknown section [app], expected [App], [Team], [Flow], [Limits], [Pasteboard] or [Audit]")
        try assertError("[Flow]\nFrom=any\nChannels=drag clipboard\n", 3, "invalid value \"clipboard\" in Channels=, expected drag or paste")
        try assertError("[Pasteboard]\nExpirationSec=0\n", 2,
                        "invalid value \"0\" for ExpirationSec=, expected a number of seconds from 1 to 1000000")
        try assertError("[Pasteboard]\nClearOffers=maybe\n", 2,
                        "invalid value \"maybe\" for ClearOffers=, expected a boolean (yes, no, true, false, on, off, 1 or 0)")
        try assertError("[Pasteboard]\nExpiration=3\n", 2,
                        "unknown key \"Expiration\" in [Pasteboard], expected ExpirationSec=, MaxExpirationSec= or ClearOffers=")
        try assertError("[App]\nExecutable=/usr/bin/x\nColor=red\n", 3,
                        "unknown key \"Color\" in [App], expected Executable=, AppID=, Team=, Managed= or Sources=")
        try assertError("[Audit]\nRetention=3\n", 2,
                        "unknown key \"Retention\" in [Audit], expected FailClosed= or RetentionDays=")
        try assertError("# no section yet\n\nAppID=com.example.A\n", 3, "key \"AppID\" appears before any [Section] header")
        try assertError("[App]\njust some words\n", 2,
                        "malformed line \"just some words\", expected [Section], Key=Value or a comment")
        try assertError("[App\n", 1, "malformed line \"[App\", expected [Section], Key=Value or a comment")
        try assertError("[App]\n=value\n", 2, "malformed line \"=value\", expected [Section], Key=Value or a comment")
    }

    /// An entry says which identity sources it trusts: by executable, by the sandboxes' app
    /// ID (the default without Executable=), or by a self-chosen unit name only when listed.
    func testAnEntryAcceptsTheSourcesItNames() throws {
        let path = try write("dragbroker.conf", """
            [App]
            AppID=org.example.Flat

            [App]
            AppID=org.example.Scoped
            Sources=systemd-unit flatpak
            Team=org.example

            [App]
            Executable=/usr/bin/mail
            AppID=com.example.Mail
            Sources=snap

            [App]
            AppID=org.example.Reset
            Sources=systemd-unit
            Sources=
            """)
        let policy = try PolicyLoader.parse(file: path)
        XCTAssertEqual(policy.apps.map(\.sources), [[.flatpak, .snap], [.systemdUnit, .flatpak], [.snap], [.flatpak, .snap]])
        XCTAssertEqual(policy.app(id: "org.example.Flat", from: .flatpak)?.origin.line, 1)
        XCTAssertNil(policy.app(id: "org.example.Flat", from: .systemdUnit), "a scope name is accepted only when listed")
        XCTAssertEqual(policy.app(id: "org.example.Scoped", from: .systemdUnit)?.team, "org.example")
        XCTAssertNil(policy.app(id: "com.example.Mail", from: .systemdUnit))
        XCTAssertEqual(policy.app(id: "com.example.Mail", from: .snap)?.executable, "/usr/bin/mail")
        XCTAssertEqual(policy.app(forExecutable: "/usr/bin/mail")?.appID, "com.example.Mail")

        try assertError("[App]\nAppID=org.example.A\nSources=flatpak scope\n", 3,
                        "invalid value \"scope\" in Sources=, expected flatpak, snap or systemd-unit")
        try assertError("[App]\nAppID=org.example.A\n\n[App]\nAppID=org.example.A\nSources=systemd-unit\n", 5,
                        "duplicate AppID= \"org.example.A\", first set at \(directory!)/dragbroker.conf:2")
    }

    func testMissingRequiredKeysAreReportedAtTheHeader() throws {
        try assertError("[Flow]\nFrom=any\nTo=any\n", 1, "[Flow] section is missing Action=")
        try assertError("# x\n[Flow]\nAction=deny\n\n[Limits]\n", 2, "[Flow] section is missing From= and To=")
        try assertError("[App]\nTeam=com.example\n", 1, "[App] section is missing AppID=")
        try assertError("[App]\nExecutable=/usr/bin/x\n[App]\n", 1, "[App] section is missing AppID=")
        try assertError("[Team]\nManaged=yes\n", 1, "[Team] section is missing Name=")
    }

    func testDuplicatesInOneFile() throws {
        try assertError("""
            [App]
            Executable=/usr/bin/mail
            AppID=com.example.Mail

            [App]
            Executable=/usr/bin/mail
            AppID=com.example.Mail2
            """, 6, "duplicate Executable= \"/usr/bin/mail\", first set at \(main):2")
        try assertError("[Team]\nName=com.example\n[Team]\nName=com.example\nManaged=yes\n", 4,
                        "duplicate Name= \"com.example\", first set at \(main):2")
    }

    func testBadValuesSayWhichKeyAndWhatIsExpected() throws {
        let boolean = "expected a boolean (yes, no, true, false, on, off, 1 or 0)"
        let identifier = "expected a reverse-DNS name such as com.example.Mail (letters, digits, '-' and '_', "
            + "at least two dot-separated components, at most 255 characters)"
        let path = "expected an absolute, normalized path such as /usr/bin/example"
        let count = "expected an integer from 1 to 1000000"
        let endpoint = "expected any, managed, unmanaged, app:<AppID> or team:<Team>"
        let size = "expected a size in bytes with an optional K, M or G suffix"
        let cases: [(String, String, String)] = [
            ("App", "Managed=maybe", "invalid value \"maybe\" for Managed=, \(boolean)"),
            ("App", "AppID=Mail", "invalid value \"Mail\" for AppID=, \(identifier)"),
            ("App", "AppID=com..example", "invalid value \"com..example\" for AppID=, \(identifier)"),
            ("App", "AppID=com.exa mple", "invalid value \"com.exa mple\" for AppID=, \(identifier)"),
            ("App", "AppID=com.\(String(repeating: "a", count: 252))",
             "invalid value \"com.\(String(repeating: "a", count: 252))\" for AppID=, \(identifier)"),
            ("App", "AppID=", "invalid value \"\" for AppID=, \(identifier)"),
            ("App", "Team=example", "invalid value \"example\" for Team=, \(identifier)"),
            ("App", "Executable=bin/mail", "invalid value \"bin/mail\" for Executable=, \(path)"),
            ("App", "Executable=/usr/bin/../bin/mail", "invalid value \"/usr/bin/../bin/mail\" for Executable=, \(path)"),
            ("App", "Executable=/usr/bin/", "invalid value \"/usr/bin/\" for Executable=, \(path)"),
            ("Team", "Name=corp", "invalid value \"corp\" for Name=, \(identifier)"),
            ("Flow", "From=everyone", "invalid value \"everyone\" for From=, \(endpoint)"),
            ("Flow", "To=app:Mail", "invalid value \"app:Mail\" for To=, \(endpoint)"),
            ("Flow", "To=Any", "invalid value \"Any\" for To=, \(endpoint)"),
            ("Flow", "Action=block", "invalid value \"block\" for Action=, expected allow or deny"),
            ("Flow", "Action=deny # no inline comments", "invalid value \"deny # no inline comments\" for Action=, expected allow or deny"),
            ("Flow", "LargerThan=1T", "invalid value \"1T\" for LargerThan=, \(size)"),
            ("Flow", "LargerThan=-1", "invalid value \"-1\" for LargerThan=, \(size)"),
            ("Flow", "LargerThan=99999999999G", "invalid value \"99999999999G\" for LargerThan=, \(size)"),
            ("Limits", "SessionsTotal=0", "invalid value \"0\" for SessionsTotal=, \(count)"),
            ("Limits", "MaxStringLength=1000001", "invalid value \"1000001\" for MaxStringLength=, \(count)"),
            ("Limits", "ItemsPerSession=+5", "invalid value \"+5\" for ItemsPerSession=, \(count)"),
            ("Audit", "FailClosed=perhaps", "invalid value \"perhaps\" for FailClosed=, \(boolean)"),
            ("Audit", "RetentionDays=-1",
             "invalid value \"-1\" for RetentionDays=, expected a number of days from 0 (keep forever) to 1000000"),
        ]
        for (section, line, message) in cases {
            try assertError("[\(section)]\n# comment\n\(line)\n", 3, message)
        }
    }

    func testTypePatternValidatorErrorsBecomePolicyErrors() throws {
        struct BadPattern: Error, CustomStringConvertible {
            var description: String { "a type pattern needs a '/'" }
        }
        let path = try write("dragbroker.conf", "[Flow]\nFrom=any\nTo=any\nTypes=text/plain \\\n image\nAction=deny\n")
        let validate: (String) throws -> Void = { if !$0.contains("/") { throw BadPattern() } }
        let error = loadError { () throws(PolicyError) in try PolicyLoader.parse(file: path, validateTypePattern: validate) }
        XCTAssertEqual(error, "\(path):4: invalid type pattern \"image\" in Types=: a type pattern needs a '/'")
        XCTAssertEqual(try PolicyLoader.load(directory: directory).flows.first?.typePatterns, ["text/plain", "image"],
                       "without a validator any pattern is kept")
    }

    func testUnreadableInput() throws {
        let missing = directory + "/nope.conf"
        XCTAssertEqual(loadError { () throws(PolicyError) in try PolicyLoader.parse(file: missing) },
                       "\(missing):0: cannot read file")
        let path = directory + "/dragbroker.conf"
        try Data([0x5B, 0x41, 0x75, 0x64, 0x69, 0x74, 0x5D, 0x0A, 0x23, 0xFF, 0x0A]).write(to: URL(fileURLWithPath: path))
        XCTAssertEqual(loadError { () throws(PolicyError) in try PolicyLoader.load(directory: directory) },
                       "\(path):2: line is not valid UTF-8")
        let file = try write("plain-file", "")
        XCTAssertEqual(loadError { () throws(PolicyError) in try PolicyLoader.load(directory: file) },
                       "\(file):0: not a directory")
    }

    // MARK: - Rendering

    func testRenderShowsOriginsAndDefaults() throws {
        let path = try write("dragbroker.conf", """
            [App]
            Executable=/usr/bin/mail
            AppID=com.example.Mail
            Team=com.example

            [App]
            AppID=com.example.Notes
            Team=com.example

            [Team]
            Name=com.example
            Managed=on

            [Flow]
            From=managed
            To=unmanaged
            Types=text/* image/png
            LargerThan=2048
            Channels=paste drag
            Action=deny

            [Limits]
            SessionsTotal=64

            [Pasteboard]
            MaxExpirationSec=600

            [Audit]
            RetentionDays=30
            """)
        let policy = try PolicyLoader.load(directory: directory)
        XCTAssertEqual(policy.render(), """
            # Effective dragbroker policy
            # read \(path)

            # from \(path):1
            [App]
            Executable=/usr/bin/mail
            AppID=com.example.Mail
            Team=com.example
            Managed=no

            # from \(path):6
            [App]
            AppID=com.example.Notes
            Sources=flatpak snap
            Team=com.example
            Managed=no

            # from \(path):10
            [Team]
            Name=com.example
            Managed=yes

            # from \(path):14
            [Flow]
            From=managed
            To=unmanaged
            Types=text/* image/png
            LargerThan=2K
            Channels=drag paste
            Action=deny

            [Limits]
            # default
            SessionsPerConnection=16
            # from \(path):23
            SessionsTotal=64
            \(Self.renderedDefaultLimitsAfterSessionsTotal)

            [Pasteboard]
            # default
            ExpirationSec=86400
            # from \(path):26
            MaxExpirationSec=600
            # default
            ClearOffers=yes

            [Audit]
            # default
            FailClosed=no
            # from \(path):29
            RetentionDays=30

            """)

        // What `render()` prints reads back as the same policy.
        let rendered = try write("rendered.conf", policy.render())
        let reread = try PolicyLoader.parse(file: rendered)
        func withoutOrigin(_ apps: [AppEntry]) -> [AppEntry] {
            apps.map { AppEntry(executable: $0.executable, appID: $0.appID, team: $0.team, managed: $0.managed,
                                sources: $0.sources, origin: at(path, 1)) }
        }
        XCTAssertEqual(withoutOrigin(reread.apps), withoutOrigin(policy.apps))
        XCTAssertEqual(reread.flows.map(\.typePatterns), policy.flows.map(\.typePatterns))
        XCTAssertEqual(reread.flows.map(\.largerThan), policy.flows.map(\.largerThan))
        XCTAssertEqual(reread.flows.map(\.channels), [[.drag, .paste]])
        XCTAssertEqual(reread.pasteboard, policy.pasteboard)
        XCTAssertEqual(reread.teams.map(\.managed), [true])
        XCTAssertEqual(reread.limits, policy.limits)
        XCTAssertEqual(reread.audit, policy.audit)
    }

    func testRenderOfTheDefaultPolicy() {
        XCTAssertEqual(Policy.default.render(), """
            # Effective dragbroker policy
            # No configuration files were read: built-in defaults.

            [Limits]
            # default
            SessionsPerConnection=16
            # default
            SessionsTotal=1024
            \(Self.renderedDefaultLimitsAfterSessionsTotal)

            [Pasteboard]
            # default
            ExpirationSec=86400
            # default
            MaxExpirationSec=604800
            # default
            ClearOffers=yes

            [Audit]
            # default
            FailClosed=no
            # default
            RetentionDays=90

            """)
    }

    /// What `render()` prints for every [Limits] key after SessionsTotal= left at its default.
    static let renderedDefaultLimitsAfterSessionsTotal = """
        # default
        ItemsPerSession=256
        # default
        RepresentationsPerItem=32
        # default
        DestinationsPerSession=64
        # default
        ConcurrentLoadsPerSession=16
        # default
        SessionsPerApp=64
        # default
        SessionsPerUser=256
        # default
        LoadsPerApp=64
        # default
        LoadsPerUser=256
        # default
        LoadsTotal=4096
        # default
        MaxStringLength=255
        # default
        FirstByteTimeoutSec=30
        # default
        StallTimeoutSec=30
        # default
        DragTimeoutSec=300
        # default
        ConcludeTimeoutSec=60
        # default
        DescriptorThreadsPerApp=4
        # default
        DescriptorThreadsTotal=32
        # default
        RefusalRateLimitIntervalSec=60
        # default
        RefusalRateLimitBurst=60
        # default
        RefusalDelayMsec=100
        """
}

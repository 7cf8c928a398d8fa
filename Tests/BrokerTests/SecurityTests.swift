import BrokerProtocol
import BusKit
import Foundation
import TransferLog
import XCTest

/// Who may see what, proven with separate processes of distinct identities: copies of the
/// test peer named in the registry, a fake Flatpak, and a hand-made app scope cgroup.
final class SecurityTests: XCTestCase {
    /// The registry: the source and a teammate share team com.example; another app has
    /// its own team; "stranger-app" is not registered at all.
    static func registry(_ paths: World.Paths, extra: String = "") -> String {
        """
        # The apps of this machine, as the administrator knows them.
        [App]
        Executable=\(paths.app("source-app"))
        AppID=com.example.Source
        Team=com.example

        [App]
        Executable=\(paths.app("teammate-app"))
        AppID=com.example.Teammate
        Team=com.example

        [App]
        Executable=\(paths.app("other-app"))
        AppID=org.other.App
        Team=org.other
        \(extra)
        """
    }

    /// One item whose three representations carry the three visibilities.
    static let threeVisibilities = #"{"items":[{"name":"secret.txt","reps":[{"type":"text/x-app","visibility":"app","text":"app only"},{"type":"text/x-team","visibility":"team","text":"team only"},{"type":"text/x-all","visibility":"all","text":"for all"}]}]RESTRICTED}"#

    static let bytes = ["text/x-app": "app only", "text/x-team": "team only", "text/x-all": "for all"]

    func testVisibilityMatrix() throws {
        let world = try World { Self.registry($0) }
        // destination → the types it may see, by visibility.
        let expectations: [(app: String, visible: [String])] = [
            ("source-app", ["text/x-app", "text/x-team", "text/x-all"]),  // another process of the same app
            ("teammate-app", ["text/x-team", "text/x-all"]),
            ("other-app", ["text/x-all"]),
            ("stranger-app", ["text/x-all"]),
        ]
        for restricted in [false, true] {
            let source = try world.peer("source-app")
            for (app, visible) in expectations {
                let context = "destination \(app), restricted \(restricted)"
                let spec = Self.threeVisibilities.replacingOccurrences(of: "RESTRICTED", with: restricted ? #","restricted":true"# : "")
                let (token, path) = try source.begin(spec)
                let destination = try world.peer(app)
                if restricted && app != "source-app" {
                    // A restricted session does not exist for other apps: not to join, not to list.
                    XCTAssertEqual(destination.run("present \(token)"), err(.notFound, "No live session has this token"), context)
                    XCTAssertFalse(destination.run("sessions").contains(path.split(separator: "/").last!), context)
                    XCTAssertEqual(source.run("cancel"), "OK")
                    continue
                }
                XCTAssertEqual(destination.run("present \(token)"), "OK \(path)", context)
                let types = visible.map { "\"\($0.replacingOccurrences(of: "/", with: "\\/"))\"" }.joined(separator: ",")
                XCTAssertEqual(destination.run("items"),
                               #"OK [{"preferredHeight":0,"preferredWidth":0,"suggestedName":"secret.txt","typeIdentifiers":[\#(types)]}]"#, context)
                XCTAssertEqual(destination.run("enter copy"), "OK copy", context)
                XCTAssertEqual(destination.run("drop"), "OK copy", context)
                for type in ["text/x-app", "text/x-team", "text/x-all"] {
                    let expected = visible.contains(type)
                        ? "OK \(Self.bytes[type]!.utf8.count) \(Data(Self.bytes[type]!.utf8).base64EncodedString())"
                        : err(.notFound, "Item 0 has no representation that matches '\(type)'")
                    XCTAssertEqual(destination.run("load 0 \(type)"), expected, "\(context), \(type)")
                }
                XCTAssertEqual(destination.run("conclude"), "OK", context)
                XCTAssertTrue(source.waitFor("EVENT transferFinished"), context)
                destination.terminate()
            }
            source.terminate()
        }
    }

    func testAnItemWithNothingVisibleIsAbsent() throws {
        let world = try World { Self.registry($0) }
        let source = try world.peer("source-app")
        let (token, _) = try source.begin(#"{"items":[{"name":"private","reps":[{"type":"text/x-app","visibility":"app","text":"p"}]},{"name":"public","reps":[{"type":"text/plain","text":"hello"}]}]}"#)
        let stranger = try world.peer("stranger-app")
        _ = stranger.run("present \(token)")
        XCTAssertEqual(stranger.run("items"), #"OK [{"preferredHeight":0,"preferredWidth":0,"suggestedName":"public","typeIdentifiers":["text\/plain"]}]"#)
        _ = stranger.run("enter copy")
        _ = stranger.run("drop")
        // Item 0 as the stranger numbers them is the public one; there is no item 1 for it.
        XCTAssertEqual(stranger.run("load 0 text/plain"), "OK 5 \(Data("hello".utf8).base64EncodedString())")
        XCTAssertEqual(stranger.run("load 1 text/x-app"), err(.notFound, "No item 1: session s1 has 1 item(s)"))
        XCTAssertEqual(source.handlerCalls, ["HANDLER 1 text/plain"], "the broker asked for the real item")
    }

    func testFlatpakAndAppScopeIdentities() throws {
        let world = try World { Self.registry($0) }
        // The sandbox vouches for the ID, so its reverse-DNS prefix is its team.
        let flatpak = try world.peer("sandboxed-app", sandbox: .flatpak(appID: "com.example.Flatpak"))
        // The daemon sees the sandbox's executable through the sandbox's root, as the kernel shows it.
        let seen = world.directory.appendingPathComponent("roots/sandboxed-app").path + flatpak.executable.path
        XCTAssertEqual(flatpak.run("whoami"),
                       #"OK {"appID":"com.example.Flatpak","executable":"\#(seen.replacingOccurrences(of: "/", with: "\\/"))","managed":false,"pid":\#(flatpak.reportedPID),"sandboxed":true,"source":"flatpak","team":"com.example","uid":0}"#)

        let scope = try AppScope(unit: "app-gnome-org.example.Scoped-4242.scope")
        let scoped = try world.peer("scoped-app")
        try scope.adopt(scoped.process.processIdentifier)
        XCTAssertEqual(scoped.run("whoami"),
                       #"OK {"appID":"org.example.Scoped","executable":"\#(scoped.executable.path.replacingOccurrences(of: "/", with: "\\/"))","managed":false,"pid":\#(scoped.process.processIdentifier),"sandboxed":false,"source":"systemd-unit","uid":0}"#)

        // Team visibility reaches the Flatpak of the same team, not the unsandboxed scope app.
        let source = try world.peer("source-app")
        let (token, _) = try source.begin(#"{"items":[{"reps":[{"type":"text/x-team","visibility":"team","text":"t"},{"type":"text/x-all","text":"a"}]}]}"#)
        _ = flatpak.run("present \(token)")
        XCTAssertEqual(flatpak.run("items"), #"OK [{"preferredHeight":0,"preferredWidth":0,"suggestedName":"","typeIdentifiers":["text\/x-team","text\/x-all"]}]"#)
        _ = scoped.run("present \(token)")
        XCTAssertEqual(scoped.run("items"), #"OK [{"preferredHeight":0,"preferredWidth":0,"suggestedName":"","typeIdentifiers":["text\/x-all"]}]"#)
        scoped.terminate()
    }

    /// A scope name is self-chosen: it names an app, but gains a team or Managed= only from
    /// an entry that accepts that source (`Sources=systemd-unit`), never from an entry for a
    /// registered executable or a Flatpak that has the same app ID. A registered executable
    /// keeps its entry whatever scope a launcher starts it in.
    func testAScopeNameGainsOnlyWhatTheAdministratorGrantedToScopes() throws {
        let world = try World { paths in
            Self.registry(paths, extra: """

                [App]
                AppID=org.example.Scoped
                Sources=systemd-unit
                Team=org.example

                [App]
                Executable=\(paths.app("vault-app"))
                AppID=com.corp.Vault
                Team=com.corp
                Managed=yes

                [App]
                AppID=com.corp.Sandboxed
                Managed=yes
                """)
        }
        func whoami(_ peer: Peer) -> String { peer.run("whoami") }
        func escaped(_ path: String) -> String { path.replacingOccurrences(of: "/", with: "\\/") }

        let granted = try world.peer("granted-app")
        let scope1 = try AppScope(unit: "app-org.example.Scoped-\(getpid()).scope")
        try scope1.adopt(granted.process.processIdentifier)
        XCTAssertEqual(whoami(granted),
                       #"OK {"appID":"org.example.Scoped","executable":"\#(escaped(granted.executable.path))","managed":false,"pid":\#(granted.process.processIdentifier),"sandboxed":false,"source":"systemd-unit","team":"org.example","uid":0}"#)

        // Named like the managed vault, but the vault's entry is by executable.
        let impostor = try world.peer("impostor-app")
        let scope2 = try AppScope(unit: "app-com.corp.Vault-\(getpid()).scope")
        try scope2.adopt(impostor.process.processIdentifier)
        XCTAssertEqual(whoami(impostor),
                       #"OK {"appID":"com.corp.Vault","executable":"\#(escaped(impostor.executable.path))","managed":false,"pid":\#(impostor.process.processIdentifier),"sandboxed":false,"source":"systemd-unit","uid":0}"#)

        // Named like a managed Flatpak, whose entry accepts only the sandboxes.
        let lookalike = try world.peer("lookalike-app")
        let scope3 = try AppScope(unit: "app-com.corp.Sandboxed-\(getpid()).scope")
        try scope3.adopt(lookalike.process.processIdentifier)
        XCTAssertEqual(whoami(lookalike),
                       #"OK {"appID":"com.corp.Sandboxed","executable":"\#(escaped(lookalike.executable.path))","managed":false,"pid":\#(lookalike.process.processIdentifier),"sandboxed":false,"source":"systemd-unit","uid":0}"#)
        let sandboxed = try world.peer("sandboxed-app", sandbox: .flatpak(appID: "com.corp.Sandboxed"))
        let seen = world.directory.appendingPathComponent("roots/sandboxed-app").path + sandboxed.executable.path
        XCTAssertEqual(whoami(sandboxed),
                       #"OK {"appID":"com.corp.Sandboxed","executable":"\#(escaped(seen))","managed":true,"pid":\#(sandboxed.reportedPID),"sandboxed":true,"source":"flatpak","team":"com.corp","uid":0}"#)

        // The real vault, started by a launcher in a scope of the launcher's naming.
        let vault = try world.peer("vault-app")
        let scope4 = try AppScope(unit: "app-gnome-org.gnome.Whatever-\(getpid()).scope")
        try scope4.adopt(vault.process.processIdentifier)
        XCTAssertEqual(whoami(vault),
                       #"OK {"appID":"com.corp.Vault","executable":"\#(escaped(vault.executable.path))","managed":true,"pid":\#(vault.process.processIdentifier),"sandboxed":false,"source":"registry","team":"com.corp","uid":0}"#)

        // Team visibility follows: the granted scope app is not in the vault's team, the impostor neither.
        let (token, _) = try vault.begin(#"{"items":[{"reps":[{"type":"text/x-team","visibility":"team","text":"t"},{"type":"text/x-all","text":"a"}]}]}"#)
        _ = impostor.run("present \(token)")
        XCTAssertEqual(impostor.run("items"), #"OK [{"preferredHeight":0,"preferredWidth":0,"suggestedName":"","typeIdentifiers":["text\/x-all"]}]"#)
        // Each scope is removed once its process is gone.
        for peer in [granted, impostor, lookalike, vault] { peer.terminate() }
        withExtendedLifetime([scope1, scope2, scope3, scope4]) {}
    }

    func testRegistryAndFallbackIdentities() throws {
        let world = try World { Self.registry($0) }
        let source = try world.peer("source-app")
        XCTAssertEqual(source.run("whoami"),
                       #"OK {"appID":"com.example.Source","executable":"\#(source.executable.path.replacingOccurrences(of: "/", with: "\\/"))","managed":false,"pid":\#(source.process.processIdentifier),"sandboxed":false,"source":"registry","team":"com.example","uid":0}"#)
        let stranger = try world.peer("stranger-app")
        let path = stranger.executable.path.replacingOccurrences(of: "/", with: "\\/")
        XCTAssertEqual(stranger.run("whoami"),
                       #"OK {"appID":"\#(path)","executable":"\#(path)","managed":false,"pid":\#(stranger.process.processIdentifier),"sandboxed":false,"source":"executable","uid":0}"#)
    }

    func testCrossAppFlockingIsRefused() throws {
        let world = try World { Self.registry($0) }
        let source = try world.peer("source-app")
        let (token, path) = try source.begin(EndToEndTests.helloDrag)
        XCTAssertEqual(source.run(#"additems [{"name":"more.txt","reps":[{"type":"text/plain","text":"more"}]}]"#), "OK")
        let destination = try world.peer("other-app")
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("items"),
                       #"OK [{"preferredHeight":200,"preferredWidth":320,"suggestedName":"hello.txt","typeIdentifiers":["text\/plain","text\/html"]},{"preferredHeight":0,"preferredWidth":0,"suggestedName":"more.txt","typeIdentifiers":["text\/plain"]}]"#)

        // Another app that joined the session calling AddItems on it, over the raw wire.
        let probe = try BusProbe(address: world.bus.address)
        XCTAssertEqual(probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "PresentToken") { m throws(BusError) in
            try m.append(token)
        }.errorName, "OK")
        let result = probe.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "AddItems") { m throws(BusError) in
            try m.openContainer("a", ItemDescriptor.signature)
            try ItemDescriptor(suggestedName: "intruder", representations: [RepresentationDescriptor(typeIdentifier: "text/plain", visibility: .all)]).encode(to: m)
            try m.closeContainer()
        }
        guard case .failure(let error) = result else { return XCTFail("cross-app AddItems succeeded") }
        XCTAssertEqual(error, BrokerError(.accessDenied, "Only com.example.Source may add items to session s1: cross-app flocking is not allowed").busError)

        _ = destination.run("enter copy")
        _ = destination.run("drop")
        XCTAssertEqual(source.run(#"additems [{"reps":[{"type":"text/plain","text":"late"}]}]"#),
                       err(.wrongState, "Session s1 is dropped: items can be added only while dragging"))
        XCTAssertEqual(destination.run("load 1 text/plain"), "OK 4 \(Data("more".utf8).base64EncodedString())")
        XCTAssertEqual(source.handlerCalls, ["HANDLER 1 text/plain"])
    }

    func testMoveIsAllowedOnlyWithinTheSourceAppWhenItAllows() throws {
        let world = try World { Self.registry($0) }
        let source = try world.peer("source-app")
        let (movable, _) = try source.begin(#"{"items":[{"reps":[{"type":"text/plain","text":"m"}]}],"allowsMove":true}"#)
        let (fixed, _) = try source.begin(#"{"items":[{"reps":[{"type":"text/plain","text":"m"}]}]}"#)
        let sameApp = try world.peer("source-app")
        let teammate = try world.peer("teammate-app")
        _ = sameApp.run("present \(movable)")
        XCTAssertEqual(sameApp.run("enter move"), "OK move")
        _ = teammate.run("present \(movable)")
        XCTAssertEqual(teammate.run("enter move"), "OK copy", "a move across apps is a copy")
        _ = sameApp.run("present \(fixed)")
        XCTAssertEqual(sameApp.run("enter move"), "OK copy", "the source did not allow moves")
    }

    func testManagedOpenInDenyIsRefusedAndRecorded() throws {
        let world = try World { paths in
            Self.registry(paths, extra: """

                [App]
                Executable=\(paths.app("managed-mail"))
                AppID=com.corp.Mail
                Team=com.corp
                Managed=yes

                [App]
                Executable=\(paths.app("managed-notes"))
                AppID=com.corp.Notes
                Team=com.corp
                Managed=yes

                # Managed open-in: data never leaves managed apps for unmanaged ones.
                [Flow]
                From=managed
                To=unmanaged
                Action=deny
                """)
        }
        let mail = try world.peer("managed-mail")
        let (first, _) = try mail.begin(EndToEndTests.helloDrag)
        let unmanaged = try world.peer("other-app")
        _ = unmanaged.run("present \(first)")
        // What the policy denies does not exist for this destination, and the cursor says so
        // before the drop, as iOS's forbidden proposal does.
        XCTAssertEqual(unmanaged.run("items"), "OK []")
        XCTAssertEqual(unmanaged.run("conforming text/plain"), "OK ", "no item conforms")
        XCTAssertEqual(unmanaged.run("enter cancel"), "OK forbidden",
                       "an app that follows the page proposes cancel for nothing to take, and still learns that policy refused")
        XCTAssertEqual(unmanaged.run("update copy"), "OK forbidden")
        XCTAssertEqual(unmanaged.run("update move"), "OK forbidden")
        XCTAssertEqual(unmanaged.run("drop"), err(.wrongState, "The current proposal allows 'forbidden': a drop needs copy or move"))
        XCTAssertEqual(unmanaged.run("load 0 text/plain"), err(.wrongState, "Loads are allowed only after PerformDrop"))
        let rule = "\(world.paths.policyFile.path):\(try lineNumber(of: "[Flow]", in: world.paths.policyFile))"
        XCTAssertEqual(mail.handlerCalls, [], "a denied load never reaches the source")

        let (second, _) = try mail.begin(EndToEndTests.helloDrag)
        let notes = try world.peer("managed-notes")
        _ = notes.run("present \(second)")
        _ = notes.run("enter copy")
        _ = notes.run("drop")
        XCTAssertEqual(notes.run("load 0 text/plain"), "OK 11 \(Data("hello, drop".utf8).base64EncodedString())", "managed to managed is allowed")

        // Recorded once for this destination and session, however often it asked.
        let refusals = try world.daemon.waitForLog { log -> [RefusalRecord]? in
            let flow = try log.refusals().filter { $0.action == "PresentToken" }
            return flow.isEmpty ? nil : flow
        }
        XCTAssertEqual(refusals.count, 1)
        let refusal = try XCTUnwrap(refusals.first)
        XCTAssertEqual(refusal.app, "org.other.App")
        XCTAssertEqual(refusal.sessionID, "s1")
        XCTAssertEqual(refusal.subject, "text/plain, text/html")
        XCTAssertEqual(refusal.errorName, BrokerErrorCode.accessDenied.busName)
        XCTAssertEqual(refusal.message, "The administrator's policy hides text/plain, text/html from com.corp.Mail to org.other.App (rule at \(rule))")
        XCTAssertEqual(refusal.rule, rule)
        XCTAssertEqual(refusal.pid, Int64(unmanaged.process.processIdentifier))
    }

    func testReloadTakesEffectWithoutRestartAndBadPolicyNeverHalfApplies() throws {
        let world = try World { Self.registry($0) }
        let source = try world.peer("source-app")
        let destination = try world.peer("other-app")
        /// What Enter answers, then the load, for a fresh drag of one PNG.
        func loadResult() throws -> String {
            let (token, _) = try source.begin(#"{"items":[{"reps":[{"type":"image/png","text":"png"}]}]}"#)
            _ = destination.run("present \(token)")
            let entered = destination.run("enter copy")
            guard entered == "OK copy" else {
                _ = source.run("cancel")
                return entered
            }
            _ = destination.run("drop")
            let result = destination.run("load 0 image/png")
            _ = destination.run("conclude")
            return result
        }
        XCTAssertEqual(try loadResult(), "OK 3 \(Data("png".utf8).base64EncodedString())")

        let dropIn = world.paths.dropIn("50-no-images.conf")
        try "[Flow]\nFrom=team:com.example\nTo=any\nTypes=image/*\nAction=deny\n".write(to: dropIn, atomically: true, encoding: .utf8)
        XCTAssertEqual(destination.run("reload"), "OK")
        XCTAssertEqual(try loadResult(), "OK forbidden", "a denied type is absent, and a drop of nothing is forbidden")

        // A bad file is reported with file:line and changes nothing.
        let bad = world.paths.dropIn("60-bad.conf")
        try "[Flow]\nFrom=anyone\n".write(to: bad, atomically: true, encoding: .utf8)
        XCTAssertEqual(destination.run("reload"), err(.invalidArgument,
            "The policy was not reloaded: \(bad.path):2: invalid value \"anyone\" for From=, expected any, managed, unmanaged, app:<AppID> or team:<Team>"))
        XCTAssertEqual(try loadResult(), "OK forbidden", "the last good policy stays")

        // SIGHUP reloads too.
        try FileManager.default.removeItem(at: bad)
        try FileManager.default.removeItem(at: dropIn)
        kill(world.daemon.process.processIdentifier, SIGHUP)
        XCTAssertNotNil(world.daemon.stderr.take { $0.contains("Reloaded the policy") })
        XCTAssertEqual(try loadResult(), "OK 3 \(Data("png".utf8).base64EncodedString())")
    }

    func testMalformedPolicyStopsTheDaemonWithFileAndLine() throws {
        let paths = World.Paths(directory: FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-bad-\(UUID().uuidString)"))
        defer { try? FileManager.default.removeItem(at: paths.directory) }
        try FileManager.default.createDirectory(at: paths.policyDirectory, withIntermediateDirectories: true)
        try "[App]\nExecutable=/usr/bin/true\nAppID=com.example.True\nTeam=not a team\n".write(to: paths.policyFile, atomically: true, encoding: .utf8)
        let bus = try PrivateBus()
        XCTAssertThrowsError(try Daemon(bus: bus, stateDirectory: paths.directory.appendingPathComponent("state"), policyDirectory: paths.policyDirectory)) { error in
            XCTAssertTrue("\(error)".contains("Failed to load the policy: \(paths.policyFile.path):4: "), "\(error)")
        }
    }

    func testDragctlPolicyCheckShowAndTokensThatDie() throws {
        let world = try World { Self.registry($0) }
        let bad = world.paths.dropIn("70-bad.conf")
        try "[Limits]\nItemsPerSession=0\n".write(to: bad, atomically: true, encoding: .utf8)
        let check = try Child(executable: productsDirectory.appendingPathComponent("dragctl"),
                              arguments: ["policy", "check", world.paths.policyDirectory.path], environment: [:])
        check.process.waitUntilExit()
        XCTAssertEqual(check.process.terminationStatus, 1)
        XCTAssertEqual(check.stderr.take { _ in true }, "\(bad.path):2: invalid value \"0\" for ItemsPerSession=, expected an integer from 1 to 1000000")
        try FileManager.default.removeItem(at: bad)
        let good = try Child(executable: productsDirectory.appendingPathComponent("dragctl"),
                             arguments: ["policy", "check", world.paths.policyFile.path], environment: [:])
        good.process.waitUntilExit()
        XCTAssertEqual(good.process.terminationStatus, 0)
        XCTAssertEqual(good.stdout.take { _ in true }, "3 apps, 0 flow rules from \(world.paths.policyFile.path).")
        let missing = world.directory.appendingPathComponent("no-such-policy").path
        let typo = try Child(executable: productsDirectory.appendingPathComponent("dragctl"),
                             arguments: ["policy", "check", missing], environment: [:])
        typo.process.waitUntilExit()
        XCTAssertEqual(typo.process.terminationStatus, 1, "a path that is not there passes nothing")
        XCTAssertEqual(typo.stderr.take { _ in true }, "\(missing): no such file or directory")

        let show = try Child(executable: productsDirectory.appendingPathComponent("dragctl"),
                             arguments: ["policy", "show", "--address", world.bus.address], environment: [:])
        show.process.waitUntilExit()
        let shown = show.stdout.all { _ in true }
        let appLine = try lineNumber(of: "AppID=com.example.Teammate", in: world.paths.policyFile) - 2
        XCTAssertTrue(shown.contains("# from \(world.paths.policyFile.path):\(appLine)"), shown.joined(separator: "\n"))
        XCTAssertTrue(shown.contains("AppID=com.example.Teammate"))

        // A token dies with its session.
        let source = try world.peer("source-app")
        let destination = try world.peer("other-app")
        let (token, path) = try source.begin(EndToEndTests.helloDrag)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(source.run("cancel"), "OK")
        XCTAssertTrue(destination.waitFor("EVENT ended cancel \(BrokerErrorCode.cancelled.busName)"))
        XCTAssertEqual(destination.run("present \(token)"), err(.notFound, "No live session has this token"))
    }

    /// A restricted session is no object at all for another app, an administrator's included:
    /// not among the manager's children, no properties, no methods. An unrestricted one exists
    /// for an administrator, whose Properties calls get the refusal its methods give a non-party.
    /// The source sees both.
    func testRestrictedSessionsAreNoObjectForOtherApps() throws {
        let world = try World { Self.registry($0) }
        let source = try world.peer("source-app")
        let (_, open) = try source.begin(EndToEndTests.helloDrag)
        let (_, restricted) = try source.begin(EndToEndTests.helloDrag.replacingOccurrences(of: "]}]}", with: "]}],\"restricted\":true}"))
        let probe = try BusProbe(address: world.bus.address)
        func sourceApp(_ path: String) -> Result<Message, BusError> {
            probe.call(BrokerNames.busName, path, "org.freedesktop.DBus.Properties", "Get") { m throws(BusError) in
                try m.append(BrokerNames.sessionInterface)
                try m.append("SourceApp")
            }
        }
        guard case .failure(let openError) = sourceApp(open) else { return XCTFail("a non-party read a session's source app") }
        XCTAssertEqual(openError, BrokerError(.accessDenied, "Present the session token with PresentToken before using session s1").busError)
        guard case .failure(let error) = sourceApp(restricted) else { return XCTFail("a restricted session's source app was readable") }
        XCTAssertEqual(error, BrokerError(.notFound, "No live session at \(restricted): it ended or never existed").busError)
        let children = try probe.introspect(BrokerNames.busName, BrokerNames.managerPath + "/session")
        XCTAssertTrue(children.contains("<node name=\"s1\"/>"), children)
        XCTAssertFalse(children.contains("s2"), children)
        let call = probe.call(BrokerNames.busName, restricted, BrokerNames.sessionInterface, "GetItems")
        guard case .failure(let callError) = call else { return XCTFail("a restricted session answered another app") }
        XCTAssertEqual(callError, BrokerError(.notFound, "No live session at \(restricted): it ended or never existed").busError)
        // The source itself still reaches it.
        XCTAssertEqual(source.run("cancel"), "OK")
    }

    /// A caller that never presented the token learns nothing of the session's state from a
    /// refusal: the party is checked before the state.
    func testANonPartyIsRefusedAsSuchBeforeAnyStateIsRevealed() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let (_, path) = try source.begin(EndToEndTests.helloDrag)
        let probe = try BusProbe(address: world.bus.address)
        let notAParty = BrokerError(.accessDenied, "Present the session token with PresentToken before using session s1").busError
        let load = probe.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "Load") { m throws(BusError) in
            try m.append(UInt32(0))
            try m.append("text/plain")
        }
        guard case .failure(let loadError) = load else { return XCTFail("a stranger loaded") }
        XCTAssertEqual(loadError, notAParty)
        guard case .failure(let concludeError) = probe.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "Conclude") else {
            return XCTFail("a stranger concluded")
        }
        XCTAssertEqual(concludeError, notAParty)
    }

    /// A client cannot grow the audit log without bound by asking for what it may not have:
    /// past the burst its refusals are counted, and what is still counted when the daemon
    /// stops is summed up before it exits.
    func testRefusalsRecordedPerAppAreBounded() throws {
        let world = try World { _ in "[Limits]\nRefusalDelayMsec=1\n" }
        let source = try world.peer("source-app")
        let (_, path) = try source.begin(EndToEndTests.helloDrag)
        let probe = try BusProbe(address: world.bus.address)
        for _ in 0..<1010 {
            XCTAssertEqual(probe.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "GetItems").errorName,
                           BrokerErrorCode.accessDenied.busName)
        }
        let written = try world.daemon.waitForLog { log -> [RefusalRecord]? in
            let rows = try log.refusals(limit: 5000)
            return rows.count >= 60 ? rows : nil
        }
        XCTAssertEqual(written.count, 60, "RefusalRateLimitBurst=60 by default")
        let app = try XCTUnwrap(written.first?.app)
        world.daemon.kill(SIGTERM)
        let log = try TransferLog.openReadOnly(path: world.daemon.transferLogPath)
        let summaries = try log.refusals(limit: 5000).filter { $0.action == "RateLimited" }.map(\.message).sorted()
        XCTAssertEqual(summaries, [
            "Suppressed 950 refusals of \(app) past the first 60 in 60 s (RefusalRateLimitBurst=60 per RefusalRateLimitIntervalSec=60)",
            "Suppressed 950 refusals of the unsandboxed apps of uid \(getuid()) past the first 60 in 60 s (RefusalRateLimitBurst=60 per RefusalRateLimitIntervalSec=60)",
        ])
    }

    func testIdentityCannotBeClaimed() throws {
        let world = try World { Self.registry($0) }
        // A stranger names itself after a registered app, and asks for options that do not exist.
        let impostor = try world.peer("impostor")
        let before = impostor.run("whoami")
        XCTAssertEqual(impostor.run(#"begin {"items":[{"name":"com.example.Source","reps":[{"type":"text/plain","text":"x"}]}]}"#).prefix(3), "OK ")
        let probe = try BusProbe(address: world.bus.address)
        let spoof = probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "BeginSession") { m throws(BusError) in
            try m.openContainer("a", ItemDescriptor.signature)
            try ItemDescriptor(representations: [RepresentationDescriptor(typeIdentifier: "text/plain", visibility: .all)]).encode(to: m)
            try m.closeContainer()
            try m.openContainer("a", "{sv}")
            try m.openContainer("e", "sv")
            try m.append("AppID")
            try m.openContainer("v", "b")
            try m.append(true)
            try m.closeContainer()
            try m.closeContainer()
            try m.closeContainer()
            try m.append(objectPath: "/org/dragbroker/Provider1/p1")
        }
        guard case .failure(let error) = spoof else { return XCTFail("an AppID option was accepted") }
        XCTAssertEqual(error, BrokerError(.invalidArgument, "Unknown session option 'AppID': expected RestrictedToApp or AllowsMove").busError)
        XCTAssertEqual(impostor.run("whoami"), before)
        XCTAssertFalse(before.contains("com.example"), before)
    }

    func testTypesAreCanonicalAndConformanceAnswersBeforeTheDrop() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let (token, _) = try source.begin(#"{"items":[{"name":"a.png","reps":[{"type":"public.png","text":"png"}]},{"name":"b.py","reps":[{"type":"text/x-python","text":"print()"}]},{"name":"c.svg","reps":[{"type":"image/svg+xml","text":"<svg/>"}]}]}"#)
        let destination = try world.peer("destination-app")
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("conforming image/*"), "OK 0,2")
        XCTAssertEqual(destination.run("conforming public.image"), "OK 0,2")
        // shared-mime-info makes application/xml a text/plain, so SVG is text too.
        XCTAssertEqual(destination.run("conforming text/plain"), "OK 1,2")
        XCTAssertEqual(destination.run("conforming public.text"), "OK 1,2")
        XCTAssertEqual(destination.run("conforming application/xml"), "OK 2")
        XCTAssertEqual(destination.run("conforming audio/*"), "OK ")
        XCTAssertEqual(destination.run("conforming not a type"), err(.invalidArgument, "'not a type' is not a type pattern: expected a MIME type such as image/png, a wildcard such as image/* or */*, or a UTI such as public.image"))
        _ = destination.run("enter copy")
        _ = destination.run("drop")
        XCTAssertEqual(destination.run("load 0 public.png"), "OK 3 \(Data("png".utf8).base64EncodedString())", "a UTI names the same type")
        XCTAssertEqual(source.handlerCalls, ["HANDLER 0 public.png"])

        let other = try world.peer("other-app")
        XCTAssertEqual(other.run(#"begin {"items":[{"reps":[{"type":"image","text":"x"}]}]}"#),
                       err(.invalidArgument, "Item 0: 'image' is not a type identifier: expected a MIME type such as image/png or a UTI such as public.png"))
    }

    func testSuggestedNamesAreSanitised() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let long = String(repeating: "é", count: 200)
        let (token, _) = try source.begin(#"{"items":[{"name":"../../etc/passwd\u0007\u202e.txt","reps":[{"type":"text/plain","text":"x"}]},{"name":"\#(long)","reps":[{"type":"text/plain","text":"x"}]}]}"#)
        let destination = try world.peer("destination-app")
        _ = destination.run("present \(token)")
        let expectedLong = String(repeating: "é", count: 127)  // 254 bytes: the most that fits in 255
        XCTAssertEqual(destination.run("items"),
                       #"OK [{"preferredHeight":0,"preferredWidth":0,"suggestedName":".._.._etc_passwd.txt","typeIdentifiers":["text\/plain"]},{"preferredHeight":0,"preferredWidth":0,"suggestedName":"\#(expectedLong)","typeIdentifiers":["text\/plain"]}]"#)
    }
}

/// The 1-based line of the first line equal to `text`: rules are reported by file and line.
func lineNumber(of text: String, in file: URL) throws -> Int {
    let lines = try String(contentsOf: file, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
    guard let index = lines.firstIndex(where: { $0.trimmingCharacters(in: .whitespaces) == text }) else {
        throw HarnessError("no line '\(text)' in \(file.path)")
    }
    return index + 1
}

/// A hand-made XDG app scope: a cgroup named like the ones desktop launchers create.
final class AppScope {
    let path: String

    init(unit: String) throws {
        let mounts = try String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)
        // The unified hierarchy if mounted, else systemd's named v1 hierarchy.
        let fields = mounts.split(separator: "\n").map { $0.split(separator: " ").map(String.init) }
        let unified = fields.first { $0.contains("cgroup2") }.map { $0[4] }
        let named = fields.first { $0.last?.contains("name=systemd") == true }.map { $0[4] }
        guard let base = unified ?? named else { throw HarnessError("no cgroup hierarchy to make an app scope in") }
        path = "\(base)/\(unit)"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    func adopt(_ pid: pid_t) throws {
        try "\(pid)\n".write(toFile: "\(path)/cgroup.procs", atomically: false, encoding: .utf8)
    }

    deinit {
        // Emptied when its processes exit; retry briefly, since the kernel reaps them asynchronously.
        for _ in 0..<50 {
            if rmdir(path) == 0 { break }
            usleep(20_000)
        }
    }
}

import BrokerProtocol
import Foundation
import TransferLog
import XCTest

/// Copy and paste with a real keyboard and a real clipboard: the Swift demo windows (GTK 4
/// through BrokerGTK) copy with Ctrl+C and paste with Ctrl+V, and xclip or wl-clipboard reads
/// the clipboard as an app that does not speak the protocol.
final class ClipboardTests: XCTestCase {
    func testX11SwiftCopyPastesIntoSwiftAndOnlyTheCaptionGoesInTheClear() throws { try swiftToSwift(.x11) }
    func testWaylandSwiftCopyPastesIntoSwiftAndOnlyTheCaptionGoesInTheClear() throws { try swiftToSwift(.wayland) }
    func testX11SwiftCopyPastesIntoPythonGtk3() throws { try swiftToPython(.x11) }
    func testWaylandSwiftCopyPastesIntoPythonGtk3() throws { try swiftToPython(.wayland) }
    func testX11ATextWidgetPastesAnEntryThroughTheBrokerAndClearTextItself() throws { try textWidget(.x11) }
    func testWaylandATextWidgetPastesAnEntryThroughTheBrokerAndClearTextItself() throws { try textWidget(.wayland) }
    func testX11AManagedAppsCopyPutsNothingInTheClear() throws { try managedCopy(.x11) }
    func testWaylandAManagedAppsCopyPutsNothingInTheClear() throws { try managedCopy(.wayland) }
    func testX11ACopyElsewhereEndsTheEntry() throws { try copyElsewhere(.x11) }
    func testWaylandACopyElsewhereEndsTheEntry() throws { try copyElsewhere(.wayland) }

    static let caption = "Sunset over the harbour"

    // MARK: Scenarios

    func swiftToSwift(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend)
        let received = world.directory.appendingPathComponent("received")
        let source = try DesktopInteropTests.swiftSource(world, desktop)
        let target = try DesktopInteropTests.swiftTarget(world, desktop, received)
        try desktop.type("ctrl+c", in: source.title)
        let offered = try Self.waitForOffer(on: desktop)
        XCTAssertTrue(offered.contains("text/plain;charset=utf-8"), offered.joined(separator: " "))
        XCTAssertFalse(offered.contains("image/png"), "the team-only PNG never goes in the clear: \(offered)")
        XCTAssertEqual(try Self.clearText(on: desktop), Self.caption, "an app that does not speak the protocol pastes the caption")
        XCTAssertEqual(source.stdout.all { $0.hasPrefix("source: ") && $0.contains("PNG") }, [], "nothing rendered before a paste")

        try desktop.type("ctrl+v", in: target.title)
        XCTAssert(target.waitFor("target: concluded the copy"), "\(target.stdout.text)\n\(desktop.screenshot(named: "paste-\(backend)"))")
        XCTAssertEqual(target.stdout.all { $0.hasPrefix("target: ") && !$0.hasPrefix("target: loading [") }, [
            "target: incoming item 0 as image/png",
            "target: received \(DesktopInteropTests.demoPNG.bytes) bytes (89 50 4e 47 0d 0a 1a 0a …), saved to \(received.path)/sunset.png",
            "target: concluded the copy",
        ])
        XCTAssertEqual(try sha256(of: received.appendingPathComponent("sunset.png")), DesktopInteropTests.demoPNG.sha256)
        XCTAssert(source.waitFor("source: org.dragbroker.demo.Target pasted the copy"), source.stdout.text)
        XCTAssert(source.waitFor("source: paste load 1 delivered \(DesktopInteropTests.demoPNG.bytes) bytes"), source.stdout.text)

        // One copy, pasted again: another paste, another record.
        try desktop.type("ctrl+v", in: target.title)
        XCTAssert(eventually(timeout: 20) { target.stdout.all { $0 == "target: concluded the copy" }.count == 2 }, target.stdout.text)
        let pastes = try world.daemon.waitForLog { log -> [SessionRecord]? in
            let pastes = try log.sessions().filter { $0.kind == "paste" }
            return pastes.count < 2 ? nil : pastes.sorted { $0.sessionID < $1.sessionID }
        }
        XCTAssertEqual(pastes.map(\.sessionID), ["s1_1", "s1_2"])
        XCTAssertEqual(Set(pastes.map(\.destinationApp)), ["org.dragbroker.demo.Target"])
        let loads = try world.daemon.waitForLog { log -> [LoadRecord]? in
            let loads = try log.loads()
            return loads.count < 2 ? nil : loads
        }
        XCTAssertEqual(Set(loads.map { "\($0.typeIdentifier) \($0.bytes) \($0.outcome)" }), ["image/png \(DesktopInteropTests.demoPNG.bytes) completed"])
    }

    /// The Python GTK 3 paste target, written from the protocol page alone: the caption, which
    /// any app may see, arrives byte for byte; the team-only PNG does not exist for it, so it
    /// does not paste at all when it wants an image.
    func swiftToPython(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend)
        let source = try DesktopInteropTests.swiftSource(world, desktop)
        let out = world.directory.appendingPathComponent("pasted.txt")
        let text = try DesktopApp("gtk3_paste_target.py", title: "gtk3-target", arguments: ["--out", out.path], on: desktop, bus: world.bus)
        try desktop.type("ctrl+c", in: source.title)
        _ = try Self.waitForOffer(on: desktop)
        try desktop.type("ctrl+v", in: text.title)
        XCTAssert(text.waitFor("PASTED 23 bytes"), "\(text.stdout.text)\(text.stderr.text)\n\(desktop.screenshot(named: "python-paste"))")
        XCTAssertEqual(try String(contentsOf: out, encoding: .utf8), Self.caption)
        let paste = try world.daemon.waitForLog { log in try log.sessions().first { $0.kind == "paste" } }
        XCTAssertEqual([paste.sessionID, paste.destinationApp, paste.outcome], ["s1_1", DesktopInteropTests.python, "completed"])
        let load = try world.daemon.waitForLog { log in try log.loads().first }
        XCTAssertEqual([load.typeIdentifier, "\(load.bytes)"], ["text/plain;charset=utf-8", "23"])
        text.terminate()

        let images = try DesktopApp("gtk3_paste_target.py", title: "gtk3-target", arguments: ["--out", out.path, "--accept", "image/png"],
                                    on: desktop, bus: world.bus)
        try desktop.type("ctrl+v", in: images.title)
        XCTAssert(images.waitFor("NOTHING-CONFORMS image/png"), images.stdout.text + images.stderr.text)
        XCTAssertEqual(try world.daemon.waitForLog { log in try log.sessions().filter { $0.kind == "paste" }.count }, 1, "no second paste")
    }

    /// The route for a text widget, whose own Ctrl+V GTK binds: with an entry on the clipboard
    /// the broker pastes it (recorded); with clear text only, GTK's own paste takes it (never
    /// seen by the broker).
    func textWidget(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend)
        let source = try DesktopInteropTests.swiftSource(world, desktop)
        let text = try DesktopApp(executable: productsDirectory.appendingPathComponent("dragbroker-demo-target"), title: "swift-target",
                                  arguments: ["--title", "swift-target", "--size", "200", "--text", world.directory.path],
                                  ready: "target: waiting for a paste (Ctrl+V) into the text", at: (300, 50), on: desktop, bus: world.bus)
        try desktop.type("ctrl+c", in: source.title)
        _ = try Self.waitForOffer(on: desktop)
        try desktop.type("ctrl+v", in: text.title)
        XCTAssert(text.waitFor("target: pasted through the broker: \(Self.caption)"), text.stdout.text)
        XCTAssert(text.waitFor("target: the text is now: \(Self.caption)"), text.stdout.text)
        XCTAssert(text.waitFor("target: concluded the copy"), text.stdout.text)

        let copier = try Self.copyInTheClear("plain words", on: desktop)
        defer { copier.terminate() }
        XCTAssert(source.waitFor("source: the copy left the pasteboard: The source withdrew the pasteboard entry"), source.stdout.text)
        try desktop.type("ctrl+v", in: text.title)
        XCTAssert(text.waitFor("target: the text is now: \(Self.caption)plain words"), text.stdout.text)
        XCTAssertEqual(text.stdout.all { $0.hasPrefix("target: pasted through the broker") }.count, 1, "GTK's own paste took the clear text")
        let pastes = try world.daemon.waitForLog { log -> [SessionRecord]? in
            let sessions = try log.sessions()
            return sessions.contains { $0.kind == "copy" } ? sessions.filter { $0.kind == "paste" } : nil
        }
        XCTAssertEqual(pastes.map(\.sessionID), ["s1_1"], "the clear paste is not the broker's to record")
    }

    /// A managed app's copy: its team pastes the picture through the broker, and an app that
    /// does not speak the protocol gets nothing of it, not even the caption, because a flow rule
    /// keeps the managed apps' data from unmanaged ones on the clipboard.
    func managedCopy(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend, extra: """
            [Team]
            Name=org.dragbroker.demo
            Managed=yes

            [Flow]
            From=managed
            To=unmanaged
            Channels=paste
            Action=deny
            """)
        let received = world.directory.appendingPathComponent("received")
        let source = try DesktopInteropTests.swiftSource(world, desktop)
        let target = try DesktopInteropTests.swiftTarget(world, desktop, received)
        try desktop.type("ctrl+c", in: source.title)
        let offered = try Self.waitForOffer(on: desktop)
        XCTAssertFalse(offered.contains { $0.hasPrefix("text/") || $0 == "UTF8_STRING" || $0 == "STRING" }, offered.joined(separator: " "))
        XCTAssertEqual((try? Self.clearText(on: desktop)) ?? "", "", "no text in the clear")
        try desktop.type("ctrl+v", in: target.title)
        XCTAssert(target.waitFor("target: concluded the copy"), "\(target.stdout.text)\n\(desktop.screenshot(named: "managed-paste-\(backend)"))")
        XCTAssertEqual(try sha256(of: received.appendingPathComponent("sunset.png")), DesktopInteropTests.demoPNG.sha256)
    }

    /// Another app takes the clipboard: the source's toolkit says so, and the entry is
    /// withdrawn; its token, which the other app could have kept, gives NotFound.
    func copyElsewhere(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend)
        let source = try DesktopInteropTests.swiftSource(world, desktop)
        try desktop.type("ctrl+c", in: source.title)
        _ = try Self.waitForOffer(on: desktop)
        let token = try Self.read(BrokerNames.pasteboardTokenType, on: desktop)
        XCTAssertEqual(token.count, 64)
        let other = try world.peer("other-app")
        XCTAssertEqual(other.run("present \(token)"), "OK \(BrokerNames.sessionPath(id: "s1"))")
        let copier = try Self.copyInTheClear("something else", on: desktop)
        defer { copier.terminate() }
        XCTAssert(source.waitFor("source: the copy left the pasteboard: The source withdrew the pasteboard entry"), source.stdout.text)
        XCTAssertTrue(other.waitFor("EVENT ended copy \(BrokerErrorCode.cancelled.busName)"))
        XCTAssertEqual(other.run("present \(token)"), err(.notFound, "No live session has this token"))
        let entry = try world.daemon.waitForLog { log in try log.sessions().first { $0.sessionID == "s1" } }
        XCTAssertEqual([entry.kind, entry.outcome], ["copy", "cancelled"])
    }

    // MARK: The world and the clipboard

    static func world(_ backend: Desktop.Backend, extra: String = "") throws -> (World, Desktop) {
        let world = try World { _ in
            [("org.dragbroker.demo.Source", productsDirectory.appendingPathComponent("dragbroker-demo-source").path),
             ("org.dragbroker.demo.Target", productsDirectory.appendingPathComponent("dragbroker-demo-target").path)]
                .map { "[App]\nExecutable=\($0.1)\nAppID=\($0.0)\nTeam=org.dragbroker.demo\n\n" }.joined() + extra
        }
        return (world, try Desktop(backend, scratch: world.directory))
    }

    /// The clipboard's types once it offers a pasteboard entry's token.
    static func waitForOffer(on desktop: Desktop) throws -> [String] {
        var offered: [String] = []
        let found = eventually {
            offered = (try? types(on: desktop)) ?? []
            return offered.contains(BrokerNames.pasteboardTokenType)
        }
        guard found else { throw HarnessError("the clipboard never offered \(BrokerNames.pasteboardTokenType): \(offered)") }
        return offered
    }

    static func types(on desktop: Desktop) throws -> [String] {
        let listed = switch desktop.backend {
        case .x11: try Desktop.run("/usr/bin/xclip", ["-selection", "clipboard", "-o", "-t", "TARGETS"], environment: desktop.environment)
        case .wayland: try Desktop.run("/usr/bin/wl-paste", ["--list-types"], environment: desktop.environment)
        }
        return listed.split(separator: "\n").map(String.init)
    }

    /// What a terminal pastes: the clipboard's text, in the clear.
    static func clearText(on desktop: Desktop) throws -> String {
        switch desktop.backend {
        case .x11: try Desktop.run("/usr/bin/xclip", ["-selection", "clipboard", "-o"], environment: desktop.environment)
        case .wayland: try Desktop.run("/usr/bin/wl-paste", ["--no-newline", "--type", "text"], environment: desktop.environment)
        }
    }

    static func read(_ type: String, on desktop: Desktop) throws -> String {
        switch desktop.backend {
        case .x11: try Desktop.run("/usr/bin/xclip", ["-selection", "clipboard", "-o", "-t", type], environment: desktop.environment)
        case .wayland: try Desktop.run("/usr/bin/wl-paste", ["--no-newline", "--type", type], environment: desktop.environment)
        }
    }

    /// Another app copies text, outside the broker, and serves it until `terminate()`: kept in
    /// the foreground, so the test owns its lifetime.
    static func copyInTheClear(_ text: String, on desktop: Desktop) throws -> Child {
        let (executable, arguments) = switch desktop.backend {
        case .x11: ("/usr/bin/xclip", ["-selection", "clipboard", "-quiet", "-i"])
        case .wayland: ("/usr/bin/wl-copy", ["--foreground"])
        }
        let copier = try Child(executable: URL(fileURLWithPath: executable), arguments: arguments, environment: desktop.environment)
        copier.send(text)
        copier.closeInput()
        return copier
    }
}

import BrokerProtocol
import BusKit
import Foundation
import TransferLog
import XCTest

/// Qt on the same footing as GTK: a PyQt5 target and source written from
/// docs/desktop-drag-protocol.md (Tests/desktop/qt_*.py), and a C++ Qt 5 target on
/// qdbusxml2cpp's proxies (examples/qt5-cpp-target), dragging with a real pointer on Xvfb and
/// on headless sway, against the GTK 3 apps and the Swift demo windows.
final class QtDragTests: XCTestCase {
    typealias Steps = DesktopDragTests

    // MARK: X11

    func testX11QtSourceToGtk3Target() throws { try pair(.x11, source: .qt, target: .gtk3) }
    func testX11Gtk3SourceToQtTarget() throws { try pair(.x11, source: .gtk3, target: .qt) }
    func testX11SwiftSourceToQtTarget() throws { try swiftSourceToQtTarget(.x11) }
    func testX11QtSourceToSwiftTargetFailsInTheToolkitsAndCancelsCleanly() throws { try qtSourceToSwiftTargetOnX11() }
    func testX11Gtk3SourceToCppQtTarget() throws { try gtk3SourceToCppTarget(.x11) }
    func testX11ABystandersEnterDoesNotBreakTheDropOnAQtTarget() throws { try bystanderDuringARealDrag(.x11) }

    // MARK: Wayland

    func testWaylandQtSourceToGtk3Target() throws { try pair(.wayland, source: .qt, target: .gtk3) }
    func testWaylandGtk3SourceToQtTarget() throws { try pair(.wayland, source: .gtk3, target: .qt) }
    func testWaylandSwiftSourceToQtTarget() throws { try swiftSourceToQtTarget(.wayland) }
    func testWaylandQtSourceToSwiftTarget() throws { try qtSourceToSwiftTargetOnWayland() }
    func testWaylandGtk3SourceToCppQtTarget() throws { try gtk3SourceToCppTarget(.wayland) }
    func testWaylandABystandersEnterDoesNotBreakTheDropOnAQtTarget() throws { try bystanderDuringARealDrag(.wayland) }

    // MARK: The apps

    enum Toolkit: String {
        case gtk3, qt

        func source(items: String, on desktop: Desktop, bus: PrivateBus) throws -> DesktopApp {
            try DesktopApp("\(rawValue)_source.py", title: "\(rawValue)-source", arguments: ["--items", items], on: desktop, bus: bus)
        }

        func target(accepting types: [String], on desktop: Desktop, bus: PrivateBus) throws -> DesktopApp {
            try DesktopApp("\(rawValue)_target.py", title: "\(rawValue)-target", arguments: types.flatMap { ["--accept", $0] },
                           on: desktop, bus: bus)
        }
    }

    static let targetWords: Set<String> = ["PRESENTED", "ITEMS", "STATUS", "DROPPED", "LOADED", "CONCLUDED", "REFUSED"]
    static func session(_ number: Int) -> String { "/org/dragbroker/Broker1/session/s\(number)" }

    /// What a target written to the page prints for a drop of one item it loads as `type`.
    static func dropped(session number: Int, as type: String, bytes: Int, digest: String) -> [String] {
        ["PRESENTED \(session(number))", "ITEMS 0:\(type)", "STATUS copy", "DROPPED copy", "LOADED 0 \(type) \(bytes) \(digest)", "CONCLUDED"]
    }

    /// Lines an app printed since the last call, by first word.
    final class Transcript {
        let app: DesktopApp
        let words: Set<String>
        private var seen = 0

        init(_ app: DesktopApp, _ words: Set<String>) {
            self.app = app
            self.words = words
        }

        func next() -> [String] {
            let lines = app.lines(words)
            defer { seen = lines.count }
            return Array(lines.dropFirst(seen))
        }

        /// Waits for `line` among the lines `next` has not returned yet.
        func waitFor(_ line: String, timeout: TimeInterval = 20) -> Bool {
            let deadline = Date().addingTimeInterval(timeout)
            while Date() < deadline {
                if app.lines(words).dropFirst(seen).contains(line) { return true }
                usleep(20_000)
            }
            return false
        }
    }

    /// Denies `types` to every destination, from now on.
    static func deny(_ types: String, in world: World) throws {
        try "[Flow]\nFrom=any\nTo=any\nTypes=\(types)\nAction=deny\n"
            .write(to: world.paths.dropIn("50-deny.conf"), atomically: true, encoding: .utf8)
        kill(world.daemon.process.processIdentifier, SIGHUP)
        guard world.daemon.stderr.take(where: { $0.contains("Reloaded the policy") }) != nil else {
            throw HarnessError("the daemon did not reload its policy: \(world.daemon.stderr.text)")
        }
    }

    // MARK: Scenarios

    /// Four drags between one source and one target: exact bytes, a quick release (in and
    /// released within 50 ms) with exact bytes, a release over empty space that cancels, and
    /// `forbidden` while hovering under a deny rule.
    func pair(_ backend: Desktop.Backend, source sourceKit: Toolkit, target targetKit: Toolkit) throws {
        let world = try World()
        let desktop = try Desktop(backend, scratch: world.directory)
        let note = world.directory.appendingPathComponent("note.txt")
        let text = "\(sourceKit.rawValue) to \(targetKit.rawValue) on \(backend.rawValue): "
            + String(repeating: "Ünïcödé ✓ ", count: 4000)
        try Data(text.utf8).write(to: note)
        let bytes = Data(text.utf8).count, digest = try sha256(of: note)
        let items = #"[{"name":"note.txt","reps":[{"type":"text/plain;charset=utf-8","file":"\#(note.path)"}]}]"#
        let source = try sourceKit.source(items: items, on: desktop, bus: world.bus)
        let target = try targetKit.target(accepting: ["text/plain"], on: desktop, bus: world.bus)
        let sourceLines = Transcript(source, Steps.sourceSteps), targetLines = Transcript(target, Self.targetWords)
        let shot = "\(sourceKit.rawValue)-to-\(targetKit.rawValue)"

        for (number, quick) in [(1, false), (2, true)] {
            try quick ? desktop.quickDrag(from: .source, to: .target, entered: { targetLines.waitFor("PRESENTED \(Self.session(number))") })
                : desktop.drag(from: .source, to: .target)
            XCTAssert(sourceLines.waitFor("TRANSFER-FINISHED"), "\(source.stdout.text)\n\(desktop.screenshot(named: shot))")
            XCTAssert(targetLines.waitFor("CONCLUDED"), target.stdout.text)
            XCTAssertEqual(targetLines.next(), Self.dropped(session: number, as: "text/plain", bytes: bytes, digest: digest),
                           quick ? "quick release" : "drag")
            XCTAssertEqual(sourceLines.next(), [
                "BEGAN \(Self.session(number))",
                "WILL-END copy",
                "PROVIDE 0 text/plain;charset=utf-8 \(bytes)",
                "ENDED copy -",
                "TRANSFER-FINISHED",
            ], quick ? "quick release" : "drag")
        }

        // Any peer can call the source's exported provider, even naming a session it began: it
        // serves the broker alone.
        let probe = try BusProbe(address: world.bus.address)
        let (stranger, leaked) = try probe.provideAsStranger(try probe.uniqueName(ofProcess: source.process.processIdentifier),
                                                             path: "/org/dragbroker/Provider1/\(sourceKit.rawValue)",
                                                             session: Self.session(1), item: 0, type: "text/plain;charset=utf-8")
        XCTAssertEqual(stranger.failure, BrokerError(.accessDenied, "Only dragbrokerd may request data from this provider").busError)
        XCTAssertEqual(leaked, Data(), "not one byte for a stranger")

        try desktop.drag(from: .source, to: .nothing)
        XCTAssert(sourceLines.waitFor("ENDED cancel \(Steps.cancelled)"), "\(source.stdout.text)\n\(desktop.screenshot(named: shot + "-nothing"))")
        XCTAssertEqual(sourceLines.next(), ["BEGAN \(Self.session(3))", "CANCELLED", "ENDED cancel \(Steps.cancelled)"])
        XCTAssertEqual(targetLines.next(), [], "the pointer never passed over the target")

        // Under a deny rule the target, doing what the page says, shows forbidden while hovering.
        try Self.deny("text/*", in: world)
        try desktop.press(at: .source)
        try desktop.move(to: .target)
        XCTAssert(targetLines.waitFor("STATUS forbidden"), "\(target.stdout.text)\n\(desktop.screenshot(named: shot + "-forbidden"))")
        try desktop.release()
        XCTAssert(sourceLines.waitFor("ENDED cancel \(Steps.cancelled)"), source.stdout.text)
        XCTAssertEqual(sourceLines.next(), ["BEGAN \(Self.session(4))", "CANCELLED", "ENDED cancel \(Steps.cancelled)"])
        XCTAssertEqual(targetLines.next(), ["PRESENTED \(Self.session(4))", "ITEMS -", "STATUS forbidden"])

        let sessions = try world.daemon.waitForLog { log in try log.sessions().count == 4 ? log.sessions() : nil }
        XCTAssertEqual(sessions.map { "\($0.sessionID) \($0.outcome)" }.sorted(), ["s1 completed", "s2 completed", "s3 cancelled", "s4 cancelled"])
        let loads = try TransferLog.openReadOnly(path: world.daemon.transferLogPath).loads()
        XCTAssertEqual(loads.map { "\($0.sessionID) \($0.typeIdentifier) \($0.bytes) \($0.outcome)" }.sorted(),
                       ["s1 text/plain;charset=utf-8 \(bytes) completed", "s2 text/plain;charset=utf-8 \(bytes) completed"])
    }

    func swiftSourceToQtTarget(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try DesktopInteropTests.world(backend)
        let source = try DesktopInteropTests.swiftSource(world, desktop)
        let target = try Toolkit.qt.target(accepting: ["image/png"], on: desktop, bus: world.bus)
        let sourceLines = Transcript(source, ["source:"]), targetLines = Transcript(target, Self.targetWords)
        for (number, quick) in [(1, false), (2, true)] {
            try quick ? desktop.quickDrag(from: .source, to: .target, entered: { targetLines.waitFor("PRESENTED \(Self.session(number))") })
                : desktop.drag(from: .source, to: .target)
            XCTAssert(targetLines.waitFor("CONCLUDED"), "\(target.stdout.text)\n\(desktop.screenshot(named: "swift-to-qt"))")
            XCTAssertEqual(targetLines.next(), Self.dropped(session: number, as: "image/png", bytes: DesktopInteropTests.demoPNG.bytes,
                                                            digest: DesktopInteropTests.demoPNG.sha256), quick ? "quick release" : "drag")
            XCTAssert(sourceLines.waitFor("source: every transfer finished"), source.stdout.text)
            _ = sourceLines.next()
        }

        try desktop.drag(from: .source, to: .nothing)
        let cancelled = "source: the session ended with cancel: \(Steps.cancelled): The source cancelled the drag"
        XCTAssert(sourceLines.waitFor(cancelled), "\(source.stdout.text)\n\(desktop.screenshot(named: "swift-to-qt-nothing"))")
        XCTAssertEqual(targetLines.next(), [], "the pointer never passed over the target")

        // The picture denied, what is left is text the target does not take: it proposes
        // cancel, and the broker's forbidden says policy is why.
        try Self.deny("image/*", in: world)
        try desktop.press(at: .source)
        try desktop.move(to: .target)
        XCTAssert(targetLines.waitFor("STATUS forbidden"), "\(target.stdout.text)\n\(desktop.screenshot(named: "swift-to-qt-forbidden"))")
        try desktop.release()
        XCTAssertEqual(targetLines.next(), ["PRESENTED \(Self.session(4))", "ITEMS -", "STATUS forbidden"])
        let sessions = try world.daemon.waitForLog { log in try log.sessions().count == 4 ? log.sessions() : nil }
        XCTAssertEqual(sessions.map { "\($0.sessionID) \($0.outcome)" }.sorted(), ["s1 completed", "s2 completed", "s3 cancelled", "s4 cancelled"])
    }

    /// On Wayland the pair works: the four drags of `pair`, with the Swift demo target.
    func qtSourceToSwiftTargetOnWayland() throws {
        let (world, desktop) = try DesktopInteropTests.world(.wayland)
        let picture = world.directory.appendingPathComponent("harbour.png")
        try Desktop.run("/usr/bin/convert", ["-size", "160x120", "gradient:navy-orange", "png:\(picture.path)"], environment: ["PATH": "/usr/bin:/bin"])
        let size = try XCTUnwrap(FileManager.default.attributesOfItem(atPath: picture.path)[.size] as? Int)
        let source = try Toolkit.qt.source(items: #"[{"name":"harbour.png","reps":[{"type":"image/png","file":"\#(picture.path)"}]}]"#,
                                           on: desktop, bus: world.bus)
        let received = world.directory.appendingPathComponent("received")
        let target = try DesktopInteropTests.swiftTarget(world, desktop, received)
        let sourceLines = Transcript(source, Steps.sourceSteps), targetLines = Transcript(target, ["target:"])
        for quick in [false, true] {
            // Released once the target is in the drag, as the other quick releases are: a
            // release before the compositor has started the source's drag drops nothing at all.
            try quick ? desktop.quickDrag(from: .source, to: .target, entered: { targetLines.waitFor("target: the broker allows copy") })
                : desktop.drag(from: .source, to: .target)
            XCTAssert(targetLines.waitFor("target: concluded the copy"), "\(target.stdout.text)\n\(desktop.screenshot(named: "qt-to-swift"))")
            XCTAssertEqual(targetLines.next().filter { $0.hasPrefix("target: received") },
                           ["target: received \(size) bytes (89 50 4e 47 0d 0a 1a 0a …), saved to \(received.path)/harbour.png"],
                           quick ? "quick release" : "drag")
            XCTAssertEqual(try sha256(of: received.appendingPathComponent("harbour.png")), try sha256(of: picture))
            XCTAssert(sourceLines.waitFor("TRANSFER-FINISHED"), source.stdout.text)
            _ = sourceLines.next()
        }

        try desktop.drag(from: .source, to: .nothing)
        XCTAssert(sourceLines.waitFor("ENDED cancel \(Steps.cancelled)"), "\(source.stdout.text)\n\(desktop.screenshot(named: "qt-to-swift-nothing"))")
        XCTAssertEqual(sourceLines.next(), ["BEGAN \(Self.session(3))", "CANCELLED", "ENDED cancel \(Steps.cancelled)"])

        try Self.deny("image/*", in: world)
        try desktop.press(at: .source)
        try desktop.move(to: .target)
        let refused = "target: the administrator's policy refuses this drop: the drop is refused"
        XCTAssert(targetLines.waitFor(refused), "\(target.stdout.text)\n\(desktop.screenshot(named: "qt-to-swift-forbidden"))")
        try desktop.release()
        XCTAssert(sourceLines.waitFor("ENDED cancel \(Steps.cancelled)"), source.stdout.text)
        XCTAssertEqual(targetLines.next(), [refused])
        let sessions = try world.daemon.waitForLog { log in try log.sessions().count == 4 ? log.sessions() : nil }
        XCTAssertEqual(sessions.map { "\($0.sessionID) \($0.outcome)" }.sorted(), ["s1 completed", "s2 completed", "s3 cancelled", "s4 cancelled"])
        let loads = try TransferLog.openReadOnly(path: world.daemon.transferLogPath).loads()
        XCTAssertEqual(loads.map { "\($0.sessionID) \($0.typeIdentifier) \($0.bytes) \($0.outcome)" }.sorted(),
                       ["s1 image/png \(size) completed", "s2 image/png \(size) completed"])
    }

    /// GTK 4.8 converts XdndSelection with CurrentTime and Qt 5.15 answers only conversions
    /// stamped with the XdndPosition time, so the GTK 4 target never reads the token. The
    /// broker's part is a clean refusal: the drop is refused, the source cancels, the token dies.
    func qtSourceToSwiftTargetOnX11() throws {
        let (world, desktop) = try DesktopInteropTests.world(.x11)
        let source = try Toolkit.qt.source(items: #"[{"name":"a.png","reps":[{"type":"image/png","text":"not read"}]}]"#,
                                           on: desktop, bus: world.bus)
        let target = try DesktopInteropTests.swiftTarget(world, desktop, world.directory.appendingPathComponent("received"))
        try desktop.drag(from: .source, to: .target)
        XCTAssert(source.waitFor("ENDED cancel \(Steps.cancelled)"), "\(source.stdout.text)\n\(desktop.screenshot(named: "qt-to-swift-x11"))")
        XCTAssertEqual(Transcript(source, Steps.sourceSteps.union(["EXEC"])).next(),
                       ["BEGAN \(Self.session(1))", "EXEC ignore", "CANCELLED", "ENDED cancel \(Steps.cancelled)"])
        XCTAssertEqual(target.stdout.all { $0.hasPrefix("target: ") && $0 != "target: waiting for a drop or a paste (Ctrl+V)" }, [], "the target never had a session")
        let token = try XCTUnwrap(source.lines(["TOKEN"]).first).dropFirst("TOKEN ".count)
        let probe = try BusProbe(address: world.bus.address)
        let presented = probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "PresentToken") { m throws(BusError) in
            try m.append(String(token))
        }
        guard case .failure(let error) = presented else { return XCTFail("a cancelled session's token was accepted") }
        XCTAssertEqual(error, BrokerError(.notFound, "No live session has this token").busError)
        let record = try world.daemon.waitForLog { try $0.sessions().first }
        XCTAssertEqual([record.sessionID, record.outcome, record.errorName], ["s1", "cancelled", Steps.cancelled])
    }

    func gtk3SourceToCppTarget(_ backend: Desktop.Backend) throws {
        let world = try World()
        let desktop = try Desktop(backend, scratch: world.directory)
        let picture = world.directory.appendingPathComponent("picture.bin")
        try DesktopDragTests.noise(count: 250_000).write(to: picture)
        let items = #"[{"name":"picture.png","reps":[{"type":"image/png","file":"\#(picture.path)"}]}]"#
        let source = try Toolkit.gtk3.source(items: items, on: desktop, bus: world.bus)
        let target = try DesktopApp(executable: try Self.cppTarget(), title: "cpp-target",
                                    arguments: ["--title", "cpp-target", "--accept", "public.image"], ready: "READY",
                                    at: (300, 50), on: desktop, bus: world.bus)
        try desktop.drag(from: .source, to: .target)
        XCTAssert(target.waitFor("CONCLUDED"), "\(target.stdout.text)\n\(desktop.screenshot(named: "gtk3-to-cpp"))")
        XCTAssertEqual(target.lines(Self.targetWords), Self.dropped(session: 1, as: "public.image", bytes: 250_000, digest: try sha256(of: picture)))
        XCTAssert(source.waitFor("TRANSFER-FINISHED"), source.stdout.text)
        let load = try world.daemon.waitForLog { try $0.loads().first }
        XCTAssertEqual([load.typeIdentifier, "\(load.bytes)", load.outcome], ["image/png", "250000", "completed"])
    }

    /// While the pointer is over the Qt target, a bystander that read the token presents it and
    /// calls Enter, then Exit and Enter again: the drop on the target still succeeds, bytes exact.
    func bystanderDuringARealDrag(_ backend: Desktop.Backend) throws {
        let world = try World()
        let desktop = try Desktop(backend, scratch: world.directory)
        let text = "for the real destination only"
        let source = try Toolkit.gtk3.source(items: #"[{"name":"n.txt","reps":[{"type":"text/plain","text":"\#(text)"}]}]"#,
                                             on: desktop, bus: world.bus)
        let target = try Toolkit.qt.target(accepting: ["text/plain"], on: desktop, bus: world.bus)
        let bystander = try world.peer("bystander-app")
        try desktop.press(at: .source)
        try desktop.move(to: .target)
        XCTAssert(target.waitFor("STATUS copy"), "\(target.stdout.text)\n\(desktop.screenshot(named: "bystander"))")
        // Any X client could have read it from XdndSelection; the source prints it.
        let token = try XCTUnwrap(source.lines(["TOKEN"]).first).dropFirst("TOKEN ".count)
        XCTAssertEqual(bystander.run("present \(token)"), "OK \(Self.session(1))")
        XCTAssertEqual(bystander.run("enter copy"), "OK copy")
        XCTAssertEqual(bystander.run("exit"), "OK")
        XCTAssertEqual(bystander.run("enter copy"), "OK copy")
        try desktop.move(to: ScreenPoint(x: ScreenPoint.target.x + 20, y: ScreenPoint.target.y), steps: 2)
        try desktop.release()
        XCTAssert(target.waitFor("CONCLUDED"), "\(target.stdout.text)\n\(desktop.screenshot(named: "bystander-drop"))")
        XCTAssertEqual(target.lines(Self.targetWords), Self.dropped(session: 1, as: "text/plain", bytes: text.utf8.count,
                                                                    digest: try Self.digest(of: text)))
        XCTAssert(source.waitFor("TRANSFER-FINISHED"), source.stdout.text)
        // The drop and its one load are the target's; the bystander's calls left no trace but its presence.
        let session = try world.daemon.waitForLog { try $0.sessions().first }
        let loads = try TransferLog.openReadOnly(path: world.daemon.transferLogPath).loads()
        XCTAssertEqual([session.outcome, session.destinationApp], ["completed", "/usr/bin/python3.11"])
        XCTAssertEqual(loads.map { "\($0.destinationApp) \($0.bytes) \($0.outcome)" }, ["/usr/bin/python3.11 \(text.utf8.count) completed"])
    }

    static func digest(of text: String) throws -> String {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-digest-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: file) }
        try Data(text.utf8).write(to: file)
        return try sha256(of: file)
    }

    /// examples/qt5-cpp-target, built once per test run with its own Makefile.
    static func cppTarget() throws -> URL {
        try cppTargetBuild.get()
    }

    private static let cppTargetBuild = Result { try buildExample("qt5-cpp-target", product: "qt5-target") }
}

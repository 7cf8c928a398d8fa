import BrokerProtocol
import BusKit
import Foundation
import TransferLog
import XCTest

/// Real drags between real windows with a real pointer, through dragbrokerd: Python GTK 3 apps
/// written from docs/desktop-drag-protocol.md alone, on Xvfb driven by xdotool and on headless
/// sway driven by a virtual pointer (Tests/desktop). The toolkit drag carries only the token;
/// whatever else a side prints it learnt from the broker.
final class DesktopDragTests: XCTestCase {
    static let cancelled = "org.dragbroker.Broker1.Error.Cancelled"
    /// The first word of every line in which an app reports the protocol's steps.
    static let sourceSteps: Set<String> = ["BEGAN", "WILL-END", "PROVIDE", "CANCELLED", "ENDED", "TRANSFER-FINISHED", "ERROR"]
    static let targetSteps: Set<String> = ["PRESENTED", "ITEMS", "STATUS", "EXIT", "DROPPED", "LOADED", "CONCLUDED", "REFUSED", "ERROR"]
    static let session1 = "/org/dragbroker/Broker1/session/s1"

    // MARK: X11

    func testX11ExactBytesBetweenGtk3Apps() throws { try exactBytesBetweenGtk3Apps(.x11) }
    func testX11DragReleasedOverNothingIsCancelled() throws { try dragReleasedOverNothingIsCancelled(.x11) }
    func testX11FlowDeniedTargetShowsForbiddenAndLoadsNothing() throws { try flowDeniedTargetShowsForbidden(.x11) }
    func testX11NonProtocolTargetGetsNothing() throws { try nonProtocolTargetGetsNothing(.x11) }

    // MARK: Wayland

    func testWaylandExactBytesBetweenGtk3Apps() throws { try exactBytesBetweenGtk3Apps(.wayland) }
    func testWaylandDragReleasedOverNothingIsCancelled() throws { try dragReleasedOverNothingIsCancelled(.wayland) }
    func testWaylandFlowDeniedTargetShowsForbiddenAndLoadsNothing() throws { try flowDeniedTargetShowsForbidden(.wayland) }
    func testWaylandNonProtocolTargetGetsNothing() throws { try nonProtocolTargetGetsNothing(.wayland) }

    // MARK: Scenarios

    func exactBytesBetweenGtk3Apps(_ backend: Desktop.Backend) throws {
        let world = try World()
        let desktop = try Desktop(backend, scratch: world.directory)
        let picture = world.directory.appendingPathComponent("picture.bin")
        try Self.noise(count: 300_000).write(to: picture)
        let text = "Grüße aus dem Fenster, über den Broker"
        let textFile = world.directory.appendingPathComponent("note.txt")
        try Data(text.utf8).write(to: textFile)
        let items = """
            [{"name":"picture.png","width":640,"height":480,"reps":[{"type":"image/png","file":"\(picture.path)"}]},
             {"name":"note.txt","reps":[{"type":"text/plain;charset=utf-8","text":"\(text)"}]}]
            """
        let source = try DesktopApp("gtk3_source.py", title: "gtk3-source", arguments: ["--items", items], on: desktop, bus: world.bus)
        let target = try DesktopApp("gtk3_target.py", title: "gtk3-target", arguments: ["--accept", "image/png", "--accept", "text/plain"],
                                    on: desktop, bus: world.bus)

        try desktop.drag(from: .source, to: .target)
        try expect(source, "TRANSFER-FINISHED", on: desktop)
        XCTAssert(target.waitFor("CONCLUDED"), target.stdout.text)

        let textBytes = Data(text.utf8).count
        XCTAssertEqual(target.lines(Self.targetSteps), [
            "PRESENTED \(Self.session1)",
            "ITEMS 0:image/png,1:text/plain",
            "STATUS copy",
            "DROPPED copy",
            "LOADED 0 image/png 300000 \(try sha256(of: picture))",
            "LOADED 1 text/plain \(textBytes) \(try sha256(of: textFile))",
            "CONCLUDED",
        ])
        XCTAssertEqual(source.lines(Self.sourceSteps), [
            "BEGAN \(Self.session1)",
            "WILL-END copy",
            "PROVIDE 0 image/png 300000",
            "PROVIDE 1 text/plain;charset=utf-8 \(textBytes)",
            "ENDED copy -",
            "TRANSFER-FINISHED",
        ])
        let record = try world.daemon.waitForLog { try $0.sessions().first }
        XCTAssertEqual([record.outcome, record.operation, record.sourceApp, record.destinationApp], ["completed", "copy", "/usr/bin/python3.11", "/usr/bin/python3.11"])
        let loads = try world.daemon.waitForLog { log in try log.loads(sessionID: "s1").count == 2 ? log.loads(sessionID: "s1") : nil }
        XCTAssertEqual(Set(loads.map { "\($0.typeIdentifier) \($0.bytes) \($0.outcome)" }),
                       ["image/png 300000 completed", "text/plain;charset=utf-8 \(textBytes) completed"])
    }

    func dragReleasedOverNothingIsCancelled(_ backend: Desktop.Backend) throws {
        let world = try World()
        let desktop = try Desktop(backend, scratch: world.directory)
        let source = try DesktopApp("gtk3_source.py", title: "gtk3-source",
                                    arguments: ["--items", #"[{"name":"note.txt","reps":[{"type":"text/plain","text":"going nowhere"}]}]"#],
                                    on: desktop, bus: world.bus)
        // A protocol target is on screen, but the pointer never passes over it.
        let target = try DesktopApp("gtk3_target.py", title: "gtk3-target", arguments: ["--accept", "text/plain"], on: desktop, bus: world.bus)

        try desktop.drag(from: .source, to: .nothing)
        try expect(source, "ENDED cancel \(Self.cancelled)", on: desktop)
        XCTAssertEqual(source.lines(Self.sourceSteps), ["BEGAN \(Self.session1)", "CANCELLED", "ENDED cancel \(Self.cancelled)"])
        XCTAssertEqual(source.lines(["DRAG-FAILED"]), [Self.releasedOverNothing(backend)])
        XCTAssertEqual(target.lines(Self.targetSteps), [])

        let record = try world.daemon.waitForLog { try $0.sessions().first }
        XCTAssertEqual([record.sessionID, record.outcome, record.errorName, record.destinationApp], ["s1", "cancelled", Self.cancelled, nil])
        // The token died with its session.
        let token = try XCTUnwrap(source.lines(["TOKEN"]).first).dropFirst("TOKEN ".count)
        XCTAssertEqual(token.count, 64)
        let probe = try BusProbe(address: world.bus.address)
        let presented = probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "PresentToken") { m throws(BusError) in
            try m.append(String(token))
        }
        guard case .failure(let error) = presented else { return XCTFail("a cancelled session's token was accepted") }
        XCTAssertEqual(error, BrokerError(.notFound, "No live session has this token").busError)
    }

    func flowDeniedTargetShowsForbidden(_ backend: Desktop.Backend) throws {
        // Both apps run as /usr/bin/python3.11: only their app scopes tell them apart.
        let world = try World { _ in
            """
            [Flow]
            From=app:com.example.Gtk3Source
            To=app:com.example.Gtk3Target
            Types=image/*
            Action=deny
            """
        }
        let desktop = try Desktop(backend, scratch: world.directory)
        let sourceScope = try AppScope(unit: "app-com.example.Gtk3Source-\(getpid()).scope")
        let targetScope = try AppScope(unit: "app-com.example.Gtk3Target-\(getpid()).scope")
        let source = try DesktopApp("gtk3_source.py", title: "gtk3-source",
                                    arguments: ["--items", #"[{"name":"picture.png","reps":[{"type":"image/png","text":"not for that app"}]}]"#],
                                    on: desktop, bus: world.bus, scope: sourceScope)
        let target = try DesktopApp("gtk3_target.py", title: "gtk3-target", arguments: ["--accept", "image/png"],
                                    on: desktop, bus: world.bus, scope: targetScope)

        try desktop.drag(from: .source, to: .target)
        try expect(source, "ENDED cancel \(Self.cancelled)", on: desktop)
        // The broker hid the picture, so the target sees no item at all and, as the page says,
        // proposes cancel; the broker answers forbidden, because policy is why: the toolkit
        // refuses the drop, and the released drag fails.
        XCTAssertEqual(target.lines(Self.targetSteps), ["PRESENTED \(Self.session1)", "ITEMS -", "STATUS forbidden"])
        XCTAssertEqual(source.lines(Self.sourceSteps), ["BEGAN \(Self.session1)", "CANCELLED", "ENDED cancel \(Self.cancelled)"])
        XCTAssertEqual(source.lines(["DRAG-FAILED"]), [Self.releasedOverNothing(backend)])

        let record = try world.daemon.waitForLog { try $0.sessions().first }
        XCTAssertEqual([record.outcome, record.sourceApp, record.destinationApp], ["cancelled", "com.example.Gtk3Source", nil])
        XCTAssertEqual(try TransferLog.openReadOnly(path: world.daemon.transferLogPath).loads(sessionID: "s1"), [])
        let refusal = try world.daemon.waitForLog { try $0.refusals().first }
        let rule = "\(world.paths.policyFile.path):1"
        XCTAssertEqual([refusal.app, refusal.action, refusal.sessionID, refusal.subject, refusal.errorName, refusal.message, refusal.rule],
                       ["com.example.Gtk3Target", "PresentToken", "s1", "image/png", "org.dragbroker.Broker1.Error.AccessDenied",
                        "The administrator's policy hides image/png from com.example.Gtk3Source to com.example.Gtk3Target (rule at \(rule))",
                        rule])

        // Out of their scopes before the scopes go.
        source.terminate()
        target.terminate()
        withExtendedLifetime((sourceScope, targetScope)) {}
    }

    func nonProtocolTargetGetsNothing(_ backend: Desktop.Backend) throws {
        let world = try World()
        let desktop = try Desktop(backend, scratch: world.directory)
        let source = try DesktopApp("gtk3_source.py", title: "gtk3-source",
                                    arguments: ["--items", #"[{"name":"note.txt","reps":[{"type":"text/plain","text":"only through the broker"}]}]"#],
                                    on: desktop, bus: world.bus)
        let plain = try DesktopApp("plain_target.py", title: "plain-target", arguments: [], on: desktop, bus: nil)

        try desktop.drag(from: .source, to: .plainTarget)
        try expect(source, "ENDED cancel \(Self.cancelled)", on: desktop)
        // It saw the offer, the token type alone, which it does not take: nothing to receive.
        XCTAssertEqual(plain.lines(["OFFER", "RECEIVED"]), [Self.plainOffer(backend)])
        XCTAssertEqual(source.lines(Self.sourceSteps), ["BEGAN \(Self.session1)", "CANCELLED", "ENDED cancel \(Self.cancelled)"])
        let record = try world.daemon.waitForLog { try $0.sessions().first }
        XCTAssertEqual([record.outcome, record.errorName, record.destinationApp], ["cancelled", Self.cancelled, nil])
        XCTAssertEqual(try TransferLog.openReadOnly(path: world.daemon.transferLogPath).loads(), [])
    }

    // MARK: Support

    /// How GTK 3 reports a drag released where nothing takes it.
    static func releasedOverNothing(_ backend: Desktop.Backend) -> String {
        switch backend {
        case .x11: "DRAG-FAILED no-target"
        // GTK 3 on Wayland reports the compositor's cancellation of the drag as an error.
        case .wayland: "DRAG-FAILED error"
        }
    }

    /// The types a non-protocol target sees in the broker's drag.
    static func plainOffer(_ backend: Desktop.Backend) -> String {
        switch backend {
        case .x11: "OFFER application/vnd.dragbroker.token.v1"
        // GTK 3 on Wayland offers a DELETE type of its own beside the drag's.
        case .wayland: "OFFER DELETE,application/vnd.dragbroker.token.v1"
        }
    }

    /// Waits for a line, and on failure leaves a screenshot of the desktop for a person to see.
    func expect(_ app: DesktopApp, _ line: String, on desktop: Desktop, file: StaticString = #filePath, lineNumber: UInt = #line) throws {
        if !app.waitFor(line) {
            let shot = desktop.screenshot(named: name.filter { $0.isLetter || $0.isNumber })
            XCTFail("\(app.title) never printed \(line); it printed:\n\(app.stdout.text)\n\(app.stderr.text)\nscreenshot: \(shot)",
                    file: file, line: lineNumber)
            throw HarnessError("the drag did not finish")
        }
    }

    /// Bytes no text encoding or compression would mistake for anything: a fixed xorshift stream.
    static func noise(count: Int) -> Data {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        var bytes = [UInt8](repeating: 0, count: count)
        for index in bytes.indices {
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            bytes[index] = UInt8(truncatingIfNeeded: state >> 24)
        }
        return Data(bytes)
    }
}

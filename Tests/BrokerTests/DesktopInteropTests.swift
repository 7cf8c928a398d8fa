import BrokerProtocol
import Foundation
import TransferLog
import XCTest

/// Real pointer drags across toolkits and languages, on X11 and on Wayland: the Swift demo
/// windows (GTK 4 through BrokerGTK), the Python GTK 3 apps and the C GTK 4 target, the last
/// two written from docs/desktop-drag-protocol.md and the XML alone.
final class DesktopInteropTests: XCTestCase {
    /// The demo source's 640x480 gradient PNG: the same bytes on every run.
    static let demoPNG = (bytes: 922_218, sha256: "f431761b5f37cc6c789c52319a7a3475678fb5c8dd9d34d084626607b8a4ed01")
    static let python = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/usr/bin/python3"))
        .map { "/usr/bin/" + $0 } ?? "/usr/bin/python3"

    func testX11SwiftToSwift() throws { try swiftToSwift(.x11) }
    func testWaylandSwiftToSwift() throws { try swiftToSwift(.wayland) }
    func testX11SwiftToPythonGtk3() throws { try swiftToPython(.x11) }
    func testWaylandSwiftToPythonGtk3() throws { try swiftToPython(.wayland) }
    func testX11SwiftToCGtk4() throws { try swiftToC(.x11) }
    func testWaylandSwiftToCGtk4() throws { try swiftToC(.wayland) }
    func testX11PythonGtk3ToSwift() throws { try pythonToSwift(.x11) }
    func testWaylandPythonGtk3ToSwift() throws { try pythonToSwift(.wayland) }
    func testX11SwiftDragReleasedOverNothingIsCancelled() throws { try swiftReleasedOverNothing(.x11) }
    func testWaylandSwiftDragReleasedOverNothingIsCancelled() throws { try swiftReleasedOverNothing(.wayland) }
    func testX11SwiftTargetShowsAFlowDeniedDropAsRefused() throws { try swiftTargetFlowDenied(.x11) }

    // MARK: Scenarios

    func swiftToSwift(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend)
        let received = world.directory.appendingPathComponent("received")
        let source = try Self.swiftSource(world, desktop)
        let target = try Self.swiftTarget(world, desktop, received)
        try desktop.drag(from: .source, to: .target)
        XCTAssert(target.waitFor("target: concluded the copy"), "\(target.stdout.text)\n\(desktop.screenshot(named: "swift-to-swift"))")

        XCTAssertEqual(target.stdout.all { $0.hasPrefix("target: ") && !$0.hasPrefix("target: loading") }, [
            "target: the broker allows copy",
            "target: incoming item 0 as image/png",
            "target: received \(Self.demoPNG.bytes) bytes (89 50 4e 47 0d 0a 1a 0a …), saved to \(received.path)/sunset.png",
            "target: concluded the copy",
        ])
        // Each placeholder's progress ends full.
        XCTAssertEqual(target.stdout.all { $0.hasPrefix("target: loading") }.last,
                       "target: loading [####################] \(Self.demoPNG.bytes) of \(Self.demoPNG.bytes) bytes")
        XCTAssertEqual(try sha256(of: received.appendingPathComponent("sunset.png")), Self.demoPNG.sha256)
        XCTAssert(source.waitFor("source: every transfer finished"), source.stdout.text)
        let load = try world.daemon.waitForLog { try $0.loads().first }
        XCTAssertEqual([load.typeIdentifier, "\(load.bytes)", load.outcome, load.destinationApp],
                       ["image/png", "\(Self.demoPNG.bytes)", "completed", "org.dragbroker.demo.Target"])
    }

    func swiftToPython(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend)
        let source = try Self.swiftSource(world, desktop)
        let target = try DesktopApp("gtk3_target.py", title: "gtk3-target", arguments: ["--accept", "image/png"], on: desktop, bus: world.bus)
        try desktop.drag(from: .source, to: .target)
        XCTAssert(target.waitFor("CONCLUDED"), "\(target.stdout.text)\n\(desktop.screenshot(named: "swift-to-python"))")
        XCTAssertEqual(target.lines(DesktopDragTests.targetSteps), [
            "PRESENTED \(DesktopDragTests.session1)",
            "ITEMS 0:image/png",
            "STATUS copy",
            "DROPPED copy",
            "LOADED 0 image/png \(Self.demoPNG.bytes) \(Self.demoPNG.sha256)",
            "CONCLUDED",
        ])
        XCTAssert(source.waitFor("source: every transfer finished"), source.stdout.text)
    }

    func swiftToC(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend)
        let source = try Self.swiftSource(world, desktop)
        let target = try DesktopApp(executable: try Self.cTarget(), title: "c-target",
                                    arguments: ["--title", "c-target", "--accept", "image/png"], ready: "READY",
                                    at: (300, 50), on: desktop, bus: world.bus)
        try desktop.drag(from: .source, to: .target)
        XCTAssert(target.waitFor("CONCLUDED"), "\(target.stdout.text)\n\(desktop.screenshot(named: "swift-to-c"))")
        XCTAssertEqual(target.lines(["STATUS", "DROPPED", "LOADED", "LOAD-FAILED", "CONCLUDED", "REFUSED"]), [
            "STATUS copy",
            "DROPPED copy",
            "LOADED 0 image/png \(Self.demoPNG.bytes) \(Self.demoPNG.sha256)",
            "CONCLUDED",
        ])
        XCTAssert(source.waitFor("source: every transfer finished"), source.stdout.text)
    }

    func pythonToSwift(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend)
        let picture = world.directory.appendingPathComponent("harbour.png")
        try Desktop.run("/usr/bin/convert", ["-size", "160x120", "gradient:orange-navy", "png:\(picture.path)"], environment: ["PATH": "/usr/bin:/bin"])
        let size = try XCTUnwrap(FileManager.default.attributesOfItem(atPath: picture.path)[.size] as? Int)
        let items = #"[{"name":"harbour.png","reps":[{"type":"image/png","file":"\#(picture.path)"}]}]"#
        let source = try DesktopApp("gtk3_source.py", title: "gtk3-source", arguments: ["--items", items], on: desktop, bus: world.bus)
        let received = world.directory.appendingPathComponent("received")
        let target = try Self.swiftTarget(world, desktop, received)
        try desktop.drag(from: .source, to: .target)
        XCTAssert(target.waitFor("target: concluded the copy"), "\(target.stdout.text)\n\(desktop.screenshot(named: "python-to-swift"))")
        XCTAssertEqual(target.stdout.all { $0.hasPrefix("target: received") },
                       ["target: received \(size) bytes (89 50 4e 47 0d 0a 1a 0a …), saved to \(received.path)/harbour.png"])
        XCTAssertEqual(try sha256(of: received.appendingPathComponent("harbour.png")), try sha256(of: picture))
        XCTAssert(source.waitFor("TRANSFER-FINISHED"), source.stdout.text)
    }

    func swiftReleasedOverNothing(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend)
        let source = try Self.swiftSource(world, desktop)
        try desktop.drag(from: .source, to: .nothing)
        let ended = "source: the session ended with cancel: org.dragbroker.Broker1.Error.Cancelled: The source cancelled the drag"
        XCTAssert(source.waitFor(ended), "\(source.stdout.text)\n\(desktop.screenshot(named: "swift-released-over-nothing"))")
        let record = try world.daemon.waitForLog { try $0.sessions().first }
        XCTAssertEqual([record.outcome, record.errorName], ["cancelled", BrokerErrorCode.cancelled.busName])
    }

    func swiftTargetFlowDenied(_ backend: Desktop.Backend) throws {
        let (world, desktop) = try Self.world(backend, flow: """
            [Flow]
            From=app:org.dragbroker.demo.Source
            To=app:org.dragbroker.demo.Target
            Types=image/*
            Action=deny
            """)
        let source = try Self.swiftSource(world, desktop)
        let target = try Self.swiftTarget(world, desktop, world.directory.appendingPathComponent("received"))
        try desktop.drag(from: .source, to: .target)
        XCTAssert(source.waitFor("source: the session ended with cancel: org.dragbroker.Broker1.Error.Cancelled: The source cancelled the drag"),
                  "\(source.stdout.text)\n\(desktop.screenshot(named: "swift-flow-denied"))")
        XCTAssertEqual(target.stdout.all { $0.hasPrefix("target: ") }, [
            "target: the administrator's policy refuses this drop: the drop is refused",
        ])
        let record = try world.daemon.waitForLog { try $0.sessions().first }
        XCTAssertEqual(record.outcome, "cancelled")
        XCTAssertEqual(try TransferLog.openReadOnly(path: world.daemon.transferLogPath).loads(), [], "nothing was loaded")
    }

    // MARK: The apps

    /// The demo apps, the Python apps and the C target in one team, so the PNG the source
    /// shows only to its team reaches each of them.
    static func world(_ backend: Desktop.Backend, flow: String = "") throws -> (World, Desktop) {
        let cTarget = try cTarget().path
        let world = try World { _ in
            [("org.dragbroker.demo.Source", productsDirectory.appendingPathComponent("dragbroker-demo-source").path),
             ("org.dragbroker.demo.Target", productsDirectory.appendingPathComponent("dragbroker-demo-target").path),
             ("org.example.PythonApps", python),
             ("org.example.GtkCTarget", cTarget)]
                .map { "[App]\nExecutable=\($0.1)\nAppID=\($0.0)\nTeam=org.dragbroker.demo\n\n" }.joined() + flow
        }
        return (world, try Desktop(backend, scratch: world.directory))
    }

    static func swiftSource(_ world: World, _ desktop: Desktop) throws -> DesktopApp {
        try DesktopApp(executable: productsDirectory.appendingPathComponent("dragbroker-demo-source"), title: "swift-source",
                       arguments: ["--title", "swift-source", "--size", "200"], ready: "source: showing sunset.png; drag the picture, or copy it with Ctrl+C",
                       at: (20, 50), on: desktop, bus: world.bus)
    }

    static func swiftTarget(_ world: World, _ desktop: Desktop, _ received: URL) throws -> DesktopApp {
        try DesktopApp(executable: productsDirectory.appendingPathComponent("dragbroker-demo-target"), title: "swift-target",
                       arguments: ["--title", "swift-target", "--size", "200", received.path], ready: "target: waiting for a drop or a paste (Ctrl+V)",
                       at: (300, 50), on: desktop, bus: world.bus)
    }

    /// examples/gtk4-c-target, built once per test run with its own Makefile.
    static func cTarget() throws -> URL {
        try cTargetBuild.get()
    }

    private static let cTargetBuild = Result { try buildExample("gtk4-c-target", product: "gtk4-target") }
}

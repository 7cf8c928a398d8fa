import BrokerProtocol
import Foundation
import XCTest

/// The published XML and README are enough for a client in another language: dbus-python
/// drives a complete drag, source and destination, against the real daemon.
final class PythonClientTests: XCTestCase {
    func testPythonDrivesACompleteDrag() throws {
        let world = try World()
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("python/full_drag.py")
        let python = try Child(executable: URL(fileURLWithPath: "/usr/bin/python3"), arguments: [script.path, world.bus.address],
                               environment: ["PATH": "/usr/bin:/bin"])
        python.process.waitUntilExit()
        XCTAssertEqual(python.process.terminationStatus, 0, python.stderr.text)
        let lines = python.stdout.all { _ in true }
        // The two processes interleave; each one's own lines are in order.
        // Progress reports depend on timing; everything else is exact.
        XCTAssertEqual(lines.filter { $0.hasPrefix("source:") && !$0.hasPrefix("source: LoadProgress") }, [
            "source: began /org/dragbroker/Broker1/session/s1",
            "source: WillEnd copy",
            "source: provide item 0 as text/plain;charset=utf-8",
            "source: LoadFinished 1 19",
            "source: Ended copy",
            "source: TransferFinished",
        ])
        XCTAssertEqual(lines.filter { $0.hasPrefix("destination:") }, [
            "destination: item greeting.txt 640x480 types ['text/plain;charset=utf-8']",
            "destination: enter copy -> copy",
            "destination: drop -> copy",
            "destination: data load 1 got 'Grüße from Python'",
            "destination: concluded",
        ])
        let load = try world.daemon.waitForLog { try $0.loads().first }
        XCTAssertEqual(load.bytes, Int64("Grüße from Python".utf8.count))
        XCTAssertEqual(load.outcome, "completed")
    }
}

/// A GDBus source keeps its call's write end open after replying, as GTK apps (GDBus's fd
/// list) and Qt apps (delayed replies) do: the reply, not end of file, ends the data.
final class HeldWriteEndTests: XCTestCase {
    func testTheProvidersReplyEndsTheDataWhileItsBusLibraryHoldsTheWriteEnd() throws {
        // Short deadlines, so a load waiting for end of file would fail with Timeout quickly.
        let world = try World { _ in "[Limits]\nFirstByteTimeoutSec=3\nStallTimeoutSec=3\n" }
        let tests = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        let script = tests.appendingPathComponent("python/gio_provider.py")
        let xml = ProtocolTests.interfacesDirectory.appendingPathComponent("org.dragbroker.Provider1.xml")
        // Less than a pipe holds, and more than both pipes hold while the destination reads.
        for (session, size) in [(1, 5000), (2, 3 << 20)] {
            let python = try Child(executable: URL(fileURLWithPath: "/usr/bin/python3"),
                                   arguments: [script.path, world.bus.address, xml.path, String(size)],
                                   environment: ["PATH": "/usr/bin:/bin"])
            python.process.waitUntilExit()
            XCTAssertEqual(python.process.terminationStatus, 0, python.stderr.text)
            let lines = python.stdout.all { _ in true }
            XCTAssertEqual(lines.filter { $0.hasPrefix("source:") && !$0.hasPrefix("source: LoadProgress") }, [
                "source: began /org/dragbroker/Broker1/session/s\(session)",
                "source: WillEnd copy",
                "source: provided \(size) bytes, write end still held",
                "source: LoadFinished 1 \(size)",
                "source: Ended copy",
                "source: TransferFinished",
            ])
            XCTAssertEqual(lines.filter { $0.hasPrefix("destination:") }, [
                "destination: enter copy -> copy",
                "destination: drop -> copy",
                "destination: data load 1 got \(size) bytes, exact: True",
                "destination: concluded",
            ])
        }
        let loads = try world.daemon.waitForLog { log in try log.loads().count == 2 ? log.loads() : nil }
        XCTAssertEqual(loads.map(\.outcome), ["completed", "completed"])
        XCTAssertEqual(loads.map(\.bytes).sorted(), [5000, 3 << 20])
    }
}

/// Every unsandboxed Python program is the interpreter's executable to the daemon; the app
/// scope a desktop launcher (or `systemd-run --user --scope --unit=app-<ID>-….scope`) puts it
/// in is what makes it an app of its own.
final class InterpretedAppTests: XCTestCase {
    func program(_ world: World, scope: AppScope?) throws -> Child {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("python/interpreted_app.py")
        let python = try Child(executable: URL(fileURLWithPath: "/usr/bin/python3"), arguments: [script.path, world.bus.address],
                               environment: ["PATH": "/usr/bin:/bin"])
        try scope?.adopt(python.process.processIdentifier)
        python.send("go")
        return python
    }

    func answer(_ program: Child, to line: String) -> String {
        program.send(line)
        return program.stdout.take { !$0.isEmpty } ?? "no answer: \(program.stderr.text)"
    }

    func testTwoPythonProgramsAreOneAppUnlessEachHasItsOwnScope() throws {
        let world = try World()
        let interpreter = try FileManager.default.destinationOfSymbolicLink(atPath: "/usr/bin/python3")
        let plainA = try program(world, scope: nil)
        let plainB = try program(world, scope: nil)
        XCTAssertEqual(plainA.stdout.take { $0.hasPrefix("app ") }, "app /usr/bin/\(interpreter) from executable")
        XCTAssertEqual(plainB.stdout.take { $0.hasPrefix("app ") }, "app /usr/bin/\(interpreter) from executable")
        let shared = answer(plainA, to: "begin")
        XCTAssertTrue(shared.hasPrefix("token "), shared)
        XCTAssertEqual(answer(plainB, to: "present \(shared.dropFirst(6))"), "presented /org/dragbroker/Broker1/session/s1",
                       "one interpreter, one app: a session restricted to its app is the other's too")

        let fooScope = try AppScope(unit: "app-com.example.Foo-\(getpid()).scope")
        let barScope = try AppScope(unit: "app-gnome-com.example.Bar-\(getpid()).scope")
        let foo = try program(world, scope: fooScope)
        let bar = try program(world, scope: barScope)
        XCTAssertEqual(foo.stdout.take { $0.hasPrefix("app ") }, "app com.example.Foo from systemd-unit")
        XCTAssertEqual(bar.stdout.take { $0.hasPrefix("app ") }, "app com.example.Bar from systemd-unit")
        let own = answer(foo, to: "begin")
        XCTAssertTrue(own.hasPrefix("token "), own)
        XCTAssertEqual(answer(bar, to: "present \(own.dropFirst(6))"),
                       "error \(BrokerErrorCode.notFound.busName) No live session has this token")
        XCTAssertEqual(answer(plainA, to: "present \(own.dropFirst(6))"),
                       "error \(BrokerErrorCode.notFound.busName) No live session has this token")
        for program in [plainA, plainB, foo, bar] { program.terminate() }
    }

    /// Flocking happens in the source's app: another connection of that app may add items
    /// once it has presented the token, and not before.
    func testAnotherConnectionOfTheSourcesAppAddsItemsOnlyAsAParty() throws {
        let world = try World()
        let source = try program(world, scope: nil)
        let sameApp = try program(world, scope: nil)
        XCTAssertNotNil(source.stdout.take { $0.hasPrefix("app ") })
        XCTAssertNotNil(sameApp.stdout.take { $0.hasPrefix("app ") })
        let token = String(answer(source, to: "begin").dropFirst(6))
        let path = "/org/dragbroker/Broker1/session/s1"
        XCTAssertEqual(answer(sameApp, to: "additems \(path)"),
                       "error \(BrokerErrorCode.accessDenied.busName) Present the session token with PresentToken before using session s1")
        XCTAssertEqual(answer(sameApp, to: "present \(token)"), "presented \(path)")
        XCTAssertEqual(answer(sameApp, to: "additems \(path)"), "added")
        XCTAssertEqual(answer(source, to: "additems \(path)"), "added")
        for program in [source, sameApp] { program.terminate() }
    }
}

import BrokerProtocol
import BusKit
import Foundation
import TransferLog
import XCTest

/// Faults of the world around the daemon: it must never sit alive but useless, and the audit
/// trail must say what happened.
final class FaultTests: XCTestCase {
    /// Waits for a process to exit; nil if it is still running at the deadline.
    func exitStatus(of child: Child, within seconds: TimeInterval) -> Int32? {
        let deadline = Date().addingTimeInterval(seconds)
        while child.process.isRunning && Date() < deadline { usleep(10_000) }
        return child.process.isRunning ? nil : child.process.terminationStatus
    }

    /// A dropped drag whose data load is under way: bytes moved, then the source stalls at
    /// 131072, so the load is still in flight whenever the fault comes.
    static func loadInFlight(_ peer: (String) throws -> Peer) throws -> (source: Peer, destination: Peer) {
        let source = try peer("source-app")
        let destination = try peer("destination-app")
        let (token, _) = try source.begin(#"{"items":[{"name":"x","reps":[{"type":"application/x-stalls","size":1048576,"chunk":65536,"stallAfter":131072}]}]}"#)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        destination.send("loadprogress 0 application/x-stalls")
        XCTAssertNotNil(destination.stdout.take { $0.hasPrefix("PROGRESS ") }, destination.stdout.text)
        return (source, destination)
    }

    func testLosingTheBusEndsTheDaemonWithFailureAndRecordsWhatWasInFlightAsInterrupted() throws {
        let world = try World()
        let (source, destination) = try Self.loadInFlight { try world.peer($0) }
        usleep(200_000)

        world.bus.kill()
        XCTAssertEqual(exitStatus(of: world.daemon, within: 1), 1, "a daemon without a bus exits with failure within a second, so systemd restarts it")
        XCTAssertNotNil(world.daemon.stderr.take {
            $0.contains("Lost the connection to the bus: recording 1 session(s) in flight as interrupted and exiting")
        }, world.daemon.stderr.text)
        // Said once: not again for each party the ended session can no longer be told about.
        _ = world.daemon.stderr.take(timeout: 10) { _ in false }  // returns at the end of its output
        XCTAssertEqual(world.daemon.stderr.all { $0.contains("Failed to emit") || $0.contains("Failed to send") }, [])
        XCTAssertEqual(world.daemon.stderr.all { $0.contains("Transport endpoint is not connected") }, [])

        let log = try TransferLog.openReadOnly(path: world.daemon.transferLogPath)
        let sessions = try log.sessions()
        XCTAssertEqual(sessions.map(\.outcome), ["interrupted"])
        XCTAssertEqual(sessions.map(\.errorName), [BrokerErrorCode.disconnected.busName])
        let loads = try log.loads()
        XCTAssertEqual(loads.map(\.outcome), ["interrupted"])
        XCTAssertEqual(loads.map(\.bytes), [131072])
        withExtendedLifetime((source, destination)) {}
    }

    func testTheClientLibraryReportsDisconnectedWhenTheDaemonDies() throws {
        let world = try World()
        let (source, destination) = try Self.loadInFlight { try world.peer($0) }
        let daemonName = try XCTUnwrap(((try BusProbe(address: world.bus.address)
            .call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetNameOwner") { m throws(BusError) in
                try m.append(BrokerNames.busName)
            }).get()).readString())

        world.daemon.kill(SIGKILL)
        let why = "dragbrokerd went away: its connection \(daemonName) left the bus"
        XCTAssertNotNil(destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") } .flatMap { $0 == err(.disconnected, why) ? $0 : nil },
                        "the pending load fails with Disconnected: \(destination.stdout.text)")
        XCTAssertTrue(destination.waitFor("EVENT ended cancel \(BrokerErrorCode.disconnected.busName)"), destination.stdout.text)
        XCTAssertTrue(destination.waitFor("WHY \(why)"))
        XCTAssertTrue(source.waitFor("EVENT ended cancel \(BrokerErrorCode.disconnected.busName)"), source.stdout.text)
        XCTAssertTrue(source.waitFor("WHY \(why)"))
        XCTAssertEqual(source.run("whoami"), err(.disconnected, why), "a call after the broker left")
    }
}

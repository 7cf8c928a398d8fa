import BrokerProtocol
import Foundation
import XCTest

/// The bus loop never waits on SQLite: retention deletes, which may wait seconds for a lock
/// another writer holds, run on the log's own queue while the daemon keeps answering.
final class LoopLivenessTests: XCTestCase {
    /// Holds the log's write lock (`BEGIN IMMEDIATE`) until told to let go.
    static let lockHolder = """
        import sqlite3, sys
        db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
        db.execute("BEGIN IMMEDIATE")
        print("LOCKED", flush=True)
        sys.stdin.readline()
        db.execute("COMMIT")
        print("RELEASED", flush=True)
        """

    func testRetentionWaitingForALockedLogDoesNotStopTheBus() throws {
        let world = try World { _ in "[Audit]\nRetentionDays=1\n" }
        let peer = try world.peer("operator-app")
        XCTAssertTrue(peer.run("whoami").hasPrefix("OK "))
        let lock = try Child(executable: URL(fileURLWithPath: "/usr/bin/python3"),
                             arguments: ["-c", Self.lockHolder, world.daemon.transferLogPath], environment: ["PATH": "/usr/bin:/bin"])
        defer { lock.terminate() }
        XCTAssertNotNil(lock.stdout.take { $0 == "LOCKED" }, lock.stderr.text)

        // A reload applies the retention. SQLite waits up to 5 s for the lock: had the loop
        // waited with it, neither answer below could arrive while the lock is held.
        XCTAssertEqual(peer.run("reload", timeout: 3), "OK")
        XCTAssertTrue(peer.run("whoami", timeout: 3).hasPrefix("OK "))
        let (token, _) = try peer.begin(EndToEndTests.helloDrag)
        XCTAssertEqual(token.count, 64)
        XCTAssertEqual(world.daemon.stderr.all { $0.contains("Failed to apply the log's retention") }, [],
                       "the delete is still waiting for the lock, off the loop")

        lock.send("")
        XCTAssertNotNil(lock.stdout.take { $0 == "RELEASED" })
        XCTAssertEqual(peer.run("cancel"), "OK")
    }
}

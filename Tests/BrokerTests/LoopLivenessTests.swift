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

/// The daemon's own failures are its own: answered as `Failed`, logged, never recorded as the
/// caller's refusal nor answered as its `InvalidArgument`.
final class InternalFailureTests: XCTestCase {
    /// Runs prlimit(1) on the daemon's descriptor limit; returns what it prints.
    @discardableResult
    static func prlimit(_ pid: pid_t, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/prlimit")
        process.arguments = ["--pid", "\(pid)"] + arguments
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw HarnessError("prlimit \(arguments) failed") }
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static func lowestFreeDescriptor(of pid: pid_t) throws -> Int {
        let open = Set(try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").compactMap(Int.init))
        return (0...).first { !open.contains($0) }!
    }

    func testAPipeTheDaemonCannotCreateIsItsFailureNotTheCallersRefusal() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(EndToEndTests.helloDrag)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        let pid = world.daemon.process.processIdentifier
        let soft = try Self.prlimit(pid, ["--nofile", "--raw", "--noheadings", "--output=SOFT"])
        // The next descriptor the daemon creates fails with EMFILE.
        try Self.prlimit(pid, ["--nofile=\(try Self.lowestFreeDescriptor(of: pid)):"])
        let answer = destination.run("load 0 text/plain")
        try Self.prlimit(pid, ["--nofile=\(soft):"])
        XCTAssertEqual(answer, err(.failed, "dragbrokerd failed to serve Load: Failed to create a pipe: Too many open files"))
        XCTAssertNotNil(world.daemon.stderr.take { $0.contains("Failed to serve Load for \(destination.uniqueName): Failed to create a pipe") })

        // The next load works, and the only refusal on record is one the caller earned.
        XCTAssertEqual(destination.run("load 0 text/html"), "OK 18 \(Data("<p>hello, drop</p>".utf8).base64EncodedString())")
        XCTAssertEqual(destination.run("load 0 image/png"), err(.notFound, "Item 0 has no representation that matches 'image/png'"))
        let refusals = try world.daemon.waitForLog { log -> [String]? in
            let names = try log.refusals(limit: 10).map(\.errorName)
            return names.isEmpty ? nil : names
        }
        XCTAssertEqual(refusals, [BrokerErrorCode.notFound.busName])
    }
}

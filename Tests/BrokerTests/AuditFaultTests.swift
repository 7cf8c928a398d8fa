import BrokerProtocol
import Foundation
import TransferLog
import XCTest

/// A bus and a daemon whose state directory may be a small tmpfs of its own, which the
/// test fills as a disk fills and frees again. The daemon can be killed and restarted on
/// the same state.
final class AuditWorld {
    let directory: URL
    let bus: PrivateBus
    let stateDirectory: URL
    let policyDirectory: URL
    private let arguments: [String]
    private(set) var daemon: Daemon
    private var mounted = false

    /// Where a small state directory lives: tmpfs allocates a page for every fault, ext4 only
    /// when a block is written, so a hole mapped there can still meet a full disk later.
    enum SmallFileSystem { case tmpfs, ext4 }

    convenience init(policy: String? = nil, smallFileSystem: Bool = false, arguments: [String] = []) throws {
        try self.init(policy: policy, small: smallFileSystem ? .tmpfs : nil, arguments: arguments)
    }

    init(policy: String? = nil, small: SmallFileSystem?, arguments: [String] = []) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-audit-\(UUID().uuidString)")
        stateDirectory = directory.appendingPathComponent("state")
        policyDirectory = directory.appendingPathComponent("policy")
        self.arguments = arguments
        try FileManager.default.createDirectory(at: policyDirectory.appendingPathComponent("dragbroker.conf.d"),
                                                withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: stateDirectory, withIntermediateDirectories: true)
        if let policy {
            try policy.write(to: policyDirectory.appendingPathComponent("dragbroker.conf"), atomically: true, encoding: .utf8)
        }
        switch small {
        case .tmpfs?:
            try Self.run("/bin/mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", stateDirectory.path)
            mounted = true
        case .ext4?:
            let image = directory.appendingPathComponent("state.ext4")
            XCTAssertTrue(FileManager.default.createFile(atPath: image.path, contents: nil))
            XCTAssertEqual(truncate(image.path, 8 << 20), 0)
            try Self.run("/sbin/mkfs.ext4", "-q", "-F", "-m", "0", "-E", "root_owner=0:0", image.path)
            try Self.run("/bin/mount", "-o", "loop", image.path, stateDirectory.path)
            XCTAssertEqual(chmod(stateDirectory.path, 0o700), 0)
            mounted = true
        case nil:
            break
        }
        bus = try PrivateBus()
        daemon = try Daemon(bus: bus, stateDirectory: stateDirectory, policyDirectory: policyDirectory, arguments: arguments)
    }

    /// Stops the daemon with `signal` (SIGKILL: no chance to record anything) and starts a
    /// new one on the same state directory.
    func restartDaemon(after signal: Int32) throws {
        daemon.kill(signal)
        daemon = try Daemon(bus: bus, stateDirectory: stateDirectory, policyDirectory: policyDirectory, arguments: arguments)
    }

    /// Stops the daemon with `signal`, for the test to change its state on disk before
    /// `startDaemon`.
    func stopDaemon(_ signal: Int32 = SIGTERM) {
        daemon.kill(signal)
    }

    func startDaemon() throws {
        daemon = try Daemon(bus: bus, stateDirectory: stateDirectory, policyDirectory: policyDirectory, arguments: arguments)
    }

    /// Starts a daemon that must refuse the state on disk, and waits for it to exit: its exit
    /// status (nil when a signal ended it) and the line that says why.
    func refusedStart(saying text: String) throws -> (status: Int32?, line: String?, stderr: String) {
        let refused = try Daemon(bus: bus, stateDirectory: stateDirectory, policyDirectory: policyDirectory, arguments: arguments,
                                 waitUntilServing: false)
        let line = refused.stderr.take { $0.contains(text) }
        // One that serves instead of refusing must fail the test, not hang it.
        let deadline = Date().addingTimeInterval(20)
        while refused.process.isRunning, Date() < deadline { usleep(20_000) }
        if refused.process.isRunning { refused.kill(SIGKILL) }
        let status = refused.process.terminationReason == .exit ? refused.process.terminationStatus : nil
        return (status, line, refused.stderr.text)
    }

    func peer(_ app: String) throws -> Peer {
        try Peer(app: app, in: directory, bus: bus)
    }

    private var filler: URL { stateDirectory.appendingPathComponent("filler") }

    /// Takes every free block of the state directory's file system.
    func fill() throws {
        let descriptor = open(filler.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw HarnessError("cannot create \(filler.path)") }
        defer { close(descriptor) }
        let block = [UInt8](repeating: 0, count: 4096)
        while write(descriptor, block, block.count) > 0 {}
        guard errno == ENOSPC else { throw HarnessError("filling stopped with errno \(errno), not ENOSPC") }
    }

    func free() throws {
        try FileManager.default.removeItem(at: filler)
    }

    static func run(_ arguments: String...) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: arguments[0])
        process.arguments = Array(arguments.dropFirst())
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw HarnessError("\(arguments.joined(separator: " ")) failed") }
    }

    deinit {
        daemon.terminate()
        if mounted { try? Self.run("/bin/umount", "--lazy", stateDirectory.path) }
        try? FileManager.default.removeItem(at: directory)
    }
}

/// Drags for tests of the audit trail, and what they check in its files.
protocol AuditDrags: XCTestCase {}

extension AuditDrags {
    /// Begins a drag of one text item and drops it on `destination`; returns the session's ID.
    @discardableResult
    func drop(_ text: String, from source: Peer, on destination: Peer) throws -> String {
        let (token, path) = try source.begin(#"{"items":[{"name":"x","reps":[{"type":"text/plain","text":"\#(text)"}]}]}"#)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        return String(path.split(separator: "/").last!)
    }

    func loaded(_ text: String) -> String {
        "OK \(text.utf8.count) \(Data(text.utf8).base64EncodedString())"
    }

    /// A whole drag: dropped, loaded, concluded.
    func drag(_ text: String, from source: Peer, to destination: Peer) throws {
        try drop(text, from: source, on: destination)
        XCTAssertEqual(destination.run("load 0 text/plain"), loaded(text))
        XCTAssertEqual(destination.run("conclude"), "OK")
    }

    func integrityCheck(_ world: AuditWorld) throws -> [String] {
        try integrityCheck(world.daemon)
    }

    func integrityCheck(_ daemon: Daemon) throws -> [String] {
        let sqlite = try Child(executable: URL(fileURLWithPath: "/usr/bin/sqlite3"),
                               arguments: [daemon.transferLogPath, "PRAGMA integrity_check;"], environment: [:])
        sqlite.process.waitUntilExit()
        usleep(20_000)
        return sqlite.stdout.all { _ in true }
    }

    func lines(_ child: Child, containing text: String) -> Int {
        child.stderr.all { $0.contains(text) }.count
    }
}

/// The audit trail through the faults an administrator fears: the daemon killed mid-transfer,
/// a full disk under either FailClosed= setting, and more unwritten records than the daemon
/// may keep. Real processes, a real private bus, real SQLite files, a real full file system.
final class AuditFaultTests: XCTestCase, AuditDrags {
    static let failClosedMessage =
        "The transfer log cannot record transfers right now, and the policy refuses transfers it cannot audit (FailClosed=yes)"

    // MARK: A crash

    /// kill -9 mid-transfer: the load was on record from its start, with its bytes so far
    /// checkpointed, and the next daemon closes it (and its session) as interrupted at that
    /// checkpoint, says so, and serves drags on the same, intact log.
    func testADaemonKilledMidTransferLeavesItOnRecordAndTheNextOneClosesItAsInterrupted() throws {
        let world = try AuditWorld()
        let (source, destination) = try FaultTests.loadInFlight(world.peer)
        // 131072 bytes move, then the source stalls: the last checkpoint holds all of them.
        let checkpointed = try world.daemon.waitForLog { log -> LoadRecord? in
            try log.loads(includingOpen: true).first { $0.outcome == "open" && $0.bytes == 131_072 }
        }
        XCTAssertEqual(checkpointed.sessionID, "s1")
        XCTAssertEqual(checkpointed.loadID, 1)
        XCTAssertGreaterThan(checkpointed.endedAt, checkpointed.startedAt, "the checkpoint's time")
        XCTAssertEqual(try TransferLog.openReadOnly(path: world.daemon.transferLogPath).sessions(includingOpen: true).map(\.outcome), ["open"])
        XCTAssertEqual(try TransferLog.openReadOnly(path: world.daemon.transferLogPath).sessions(), [], "by default, only what ended")

        try world.restartDaemon(after: SIGKILL)
        XCTAssertNotNil(world.daemon.stderr.take {
            $0.contains("Recorded 1 session(s) and 1 load(s) left open by an unclean exit as interrupted, "
                        + "each ending at its last checkpoint (2) or, with none, at its start (0)")
        }, world.daemon.stderr.text)

        let log = try TransferLog.openReadOnly(path: world.daemon.transferLogPath)
        let loads = try log.loads()
        XCTAssertEqual(loads.count, 1)
        XCTAssertEqual(loads[0].outcome, "interrupted")
        XCTAssertEqual(loads[0].errorName, BrokerErrorCode.disconnected.busName)
        XCTAssertEqual(loads[0].bytes, 131_072)
        XCTAssertEqual(loads[0].startedAt, checkpointed.startedAt)
        XCTAssertEqual(loads[0].endedAt, checkpointed.endedAt, "it ends at its last checkpoint")
        let sessions = try log.sessions()
        XCTAssertEqual(sessions.map(\.sessionID), ["s1"])
        XCTAssertEqual(sessions[0].outcome, "interrupted")
        XCTAssertEqual(sessions[0].errorName, BrokerErrorCode.disconnected.busName)
        XCTAssertEqual(sessions[0].destinationApp, destination.executable.path, "recorded at the drop")
        XCTAssertEqual(sessions[0].operation, "copy", "recorded at the drop")
        XCTAssertEqual(sessions[0].endedAt, checkpointed.endedAt, "a session lives as long as its load")
        XCTAssertEqual(try integrityCheck(world), ["ok"])

        // The restarted daemon serves drags, numbering on past the block of IDs the killed one
        // had reserved: whatever it handed out, none comes back.
        let newSource = try world.peer("new-source")
        let newDestination = try world.peer("new-destination")
        XCTAssertEqual(try drop("after", from: newSource, on: newDestination), "s1025")
        XCTAssertEqual(newDestination.run("load 0 text/plain"), loaded("after"))
        XCTAssertEqual(newDestination.run("conclude"), "OK")
        let completed = try world.daemon.waitForLog { try $0.sessions().first { $0.sessionID == "s1025" && $0.outcome == "completed" } }
        XCTAssertEqual(completed.destinationApp, newDestination.executable.path)
        XCTAssertEqual(try log.loads(sessionID: "s1025").map(\.outcome), ["completed"])
        XCTAssertEqual(try log.loads(sessionID: "s1").map(\.outcome), ["interrupted"], "closed once, for good")
        withExtendedLifetime((source, destination)) {}
    }

    /// kill -9 within the first second of a load, before any checkpoint reached SQLite: the
    /// in-flight ledger beside the log had it from before its first byte, with every byte
    /// moved, and the next daemon records it from there.
    func testALoadKilledBeforeItsFirstCheckpointIsRecordedFromTheLedger() throws {
        let world = try AuditWorld()
        let (source, destination) = try FaultTests.loadInFlight(world.peer)
        usleep(200_000)

        try world.restartDaemon(after: SIGKILL)
        XCTAssertNotNil(world.daemon.stderr.take { $0.contains("Recorded 1 session(s) and 1 load(s) left open by an unclean exit as interrupted") },
                        world.daemon.stderr.text)
        let log = try TransferLog.openReadOnly(path: world.daemon.transferLogPath)
        let loads = try log.loads()
        XCTAssertEqual(loads.map(\.outcome), ["interrupted"])
        XCTAssertEqual(loads.map(\.bytes), [131_072])
        XCTAssertEqual(loads.map(\.typeIdentifier), ["application/x-stalls"])
        XCTAssertEqual(loads.map(\.destinationApp), [destination.executable.path])
        XCTAssertEqual(loads.map(\.loadID), [1])
        XCTAssertEqual(try log.sessions().map(\.outcome), ["interrupted"])
        XCTAssertEqual(try integrityCheck(world), ["ok"])
        withExtendedLifetime(source) {}
    }

    /// One daemon per state directory: a second one would take the first one's running loads
    /// for leftovers of a crash.
    func testASecondDaemonOnTheSameStateDirectoryRefusesToStart() throws {
        let world = try AuditWorld()
        XCTAssertThrowsError(try Daemon(bus: world.bus, stateDirectory: world.stateDirectory, policyDirectory: world.policyDirectory)) { error in
            XCTAssertTrue("\(error)".contains("Failed to open the in-flight ledger: another dragbrokerd is using the state directory ("
                                                + world.stateDirectory.appendingPathComponent("transfers.inflight").path + " is locked)"), "\(error)")
        }
    }

    // MARK: A full disk

    /// FailClosed=no on a full disk: drags go on, their records wait in memory, and when space
    /// returns every one of them is written. The journal hears once that writes fail and once
    /// that they work again.
    func testOnAFullDiskEveryDragIsKeptAndWrittenWhenSpaceReturns() throws {
        let world = try AuditWorld(smallFileSystem: true)
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        try drag("before", from: source, to: destination)
        _ = try world.daemon.waitForLog { try $0.sessions().first { $0.outcome == "completed" } }

        try world.fill()
        for text in ["full-1", "full-2", "full-3"] { try drag(text, from: source, to: destination) }
        try world.free()

        let sessions = try world.daemon.waitForLog { log -> [SessionRecord]? in
            let sessions = try log.sessions()
            return sessions.count == 4 && sessions.allSatisfy({ $0.outcome == "completed" }) ? sessions : nil
        }
        XCTAssertEqual(sessions.map(\.sessionID), ["s4", "s3", "s2", "s1"])
        let log = try TransferLog.openReadOnly(path: world.daemon.transferLogPath)
        let loads = try world.daemon.waitForLog { log -> [LoadRecord]? in
            let loads = try log.loads()
            return loads.count == 4 && loads.allSatisfy({ $0.outcome == "completed" }) ? loads : nil
        }
        XCTAssertEqual(loads.map(\.bytes), [6, 6, 6, 6])
        XCTAssertEqual(loads.map(\.sessionID), ["s4", "s3", "s2", "s1"])
        XCTAssertEqual(try log.gaps(), [])
        XCTAssertNotNil(world.daemon.stderr.take { $0.contains("The transfer log is writable again") }, world.daemon.stderr.text)
        XCTAssertEqual(lines(world.daemon, containing: "Failed to write the transfer log: "), 1, world.daemon.stderr.text)
        XCTAssertEqual(lines(world.daemon, containing: "The transfer log is writable again"), 0, "told once")
        XCTAssertEqual(lines(world.daemon, containing: "Recorded a gap"), 0)
        XCTAssertEqual(try integrityCheck(world), ["ok"])
    }

    /// FailClosed=yes on a full disk: a load whose start record cannot commit is refused with
    /// the fail-closed error before the source is asked, so no byte moves unrecorded; the
    /// refusals and the sessions are written when space returns, and the very next load works.
    func testFailClosedOnAFullDiskRefusesEveryLoadThenTheNextOneWorks() throws {
        let world = try AuditWorld(policy: "[Audit]\nFailClosed=yes\n", smallFileSystem: true)
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        try drag("before", from: source, to: destination)
        _ = try world.daemon.waitForLog { try $0.sessions().first { $0.outcome == "completed" } }

        try world.fill()
        try drop("during", from: source, on: destination)
        XCTAssertEqual(destination.run("load 0 text/plain"), err(.failed, Self.failClosedMessage))
        XCTAssertEqual(destination.run("load 0 text/plain"), err(.failed, Self.failClosedMessage))
        XCTAssertEqual(source.handlerCalls.count, 1, "no refused load reached the source")
        try world.free()
        XCTAssertEqual(destination.run("load 0 text/plain"), loaded("during"), "the first load once space returns")
        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertEqual(source.handlerCalls.count, 2)

        let sessions = try world.daemon.waitForLog { log -> [SessionRecord]? in
            let sessions = try log.sessions()
            return sessions.count == 2 && sessions.allSatisfy({ $0.outcome == "completed" }) ? sessions : nil
        }
        XCTAssertEqual(sessions.map(\.sessionID), ["s2", "s1"])
        let log = try TransferLog.openReadOnly(path: world.daemon.transferLogPath)
        let loads = try world.daemon.waitForLog { log -> [LoadRecord]? in
            let loads = try log.loads()
            return loads.count == 2 && loads.allSatisfy({ $0.outcome == "completed" }) ? loads : nil
        }
        XCTAssertEqual(loads.map(\.sessionID), ["s2", "s1"], "every load that moved bytes, and only those")
        XCTAssertEqual(loads.map(\.loadID), [3, 1], "loads 1 and 2 of s2 were refused")
        let refusals = try world.daemon.waitForLog { log -> [RefusalRecord]? in
            let refusals = try log.refusals()
            return refusals.count == 2 ? refusals : nil
        }
        XCTAssertEqual(refusals.map(\.action), ["Load", "Load"])
        XCTAssertEqual(refusals.map(\.sessionID), ["s2", "s2"])
        XCTAssertEqual(refusals.map(\.subject), ["text/plain", "text/plain"])
        XCTAssertEqual(refusals.map(\.errorName), [BrokerErrorCode.failed.busName, BrokerErrorCode.failed.busName])
        XCTAssertEqual(refusals.map(\.message), [Self.failClosedMessage, Self.failClosedMessage])
        XCTAssertEqual(try log.gaps(), [])
        XCTAssertEqual(try integrityCheck(world), ["ok"])
    }

    // MARK: Beyond the bound

    /// With room for five unwritten records, a full disk keeps the first drag's five and counts
    /// the second drag's five as lost; when space returns the count is written as a gap, and
    /// `dragctl log` and `dragctl stats` say the log is incomplete.
    func testRecordsBeyondTheBoundAreCountedAsAGapThatDragctlShows() throws {
        let world = try AuditWorld(smallFileSystem: true, arguments: ["--audit-queue-limit", "5"])
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        try world.fill()
        // Each drag is five records: its session begun, dropped and ended, its load started and ended.
        try drag("kept", from: source, to: destination)
        try drag("lost", from: source, to: destination)
        XCTAssertEqual(lines(world.daemon, containing: "The transfer log's queue of unwritten records is full (5)"), 1)
        try world.free()

        let gap = try world.daemon.waitForLog { try $0.gaps().first }
        XCTAssertEqual(gap.lost, 5)
        XCTAssertEqual(gap.reason, "the queue of records waiting to be written was full (5 records)")
        XCTAssertLessThanOrEqual(gap.firstLostAt, gap.lastLostAt)
        XCTAssertLessThanOrEqual(gap.lastLostAt, gap.recordedAt)
        let log = try TransferLog.openReadOnly(path: world.daemon.transferLogPath)
        XCTAssertEqual(try log.sessions().map(\.sessionID), ["s1"])
        XCTAssertEqual(try log.sessions().map(\.outcome), ["completed"])
        XCTAssertEqual(try log.loads().map(\.sessionID), ["s1"])
        XCTAssertEqual(try log.lostRecords(), 5)
        XCTAssertNotNil(world.daemon.stderr.take {
            $0.contains("Recorded a gap in the transfer log: 5 record(s) lost: the queue of records waiting to be written was full (5 records)")
        }, world.daemon.stderr.text)

        func dragctl(_ arguments: [String]) throws -> [String] {
            let child = try Child(executable: productsDirectory.appendingPathComponent("dragctl"),
                                  arguments: arguments + ["--state-directory", world.stateDirectory.path], environment: ["TZ": "UTC"])
            child.process.waitUntilExit()
            usleep(20_000)
            XCTAssertEqual(child.process.terminationStatus, 0, child.stderr.text)
            return child.stdout.all { _ in true }
        }
        let warning = "Warning: the transfer log is missing 5 records that dragbrokerd could not write (1 gap, the last at "
        let stats = try dragctl(["stats", "--no-pager"])
        XCTAssertTrue(stats[0].hasPrefix(warning), stats.joined(separator: "\n"))
        XCTAssertTrue(stats[0].hasSuffix("); dragctl stats lists them."), stats[0])
        XCTAssertTrue(stats.contains { $0.hasPrefix("GAP FIRST LOST") }, stats.joined(separator: "\n"))
        XCTAssertTrue(stats.contains {
            $0.hasPrefix("1   ") && $0.hasSuffix(" 5    the queue of records waiting to be written was full (5 records)")
        }, stats.joined(separator: "\n"))
        XCTAssertEqual(stats.last { !$0.isEmpty }, "1 gap listed, 5 records lost.")
        let logText = try dragctl(["log", "--no-pager"])
        XCTAssertTrue(logText[0].hasPrefix(warning), logText.joined(separator: "\n"))

        struct Report: Decodable {
            var lostRecords: Int64
            var gaps: [Gap]
            struct Gap: Decodable { var lost: Int64; var reason: String }
        }
        for command in ["stats", "log"] {
            let report = try JSONDecoder().decode(Report.self, from: Data(try dragctl([command, "--json=short"]).joined().utf8))
            XCTAssertEqual(report.lostRecords, 5, command)
            XCTAssertEqual(report.gaps.map(\.lost), [5], command)
            XCTAssertEqual(report.gaps.map(\.reason), ["the queue of records waiting to be written was full (5 records)"], command)
        }
    }
}

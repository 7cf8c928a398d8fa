import BrokerProtocol
import Foundation
import TransferLog
import XCTest

/// The worst a crash, a damaged disk or an older or newer version can leave in the state
/// directory: the daemon never traps on it, never writes into what it cannot read, and says
/// what it did, with an exit status of its own when an administrator has to act first.
/// Real daemons on real files (tmpfs for a full disk); each case failed before the ledger had
/// a header, before IDs were reserved on disk and before a newer schema was refused.
final class DamagedStateTests: XCTestCase, AuditDrags {
    static let stateUnusable: Int32 = 65

    // MARK: Session numbers

    /// Twenty digits, which SQLite reads as its largest integer, once trapped the daemon at
    /// every start (an overflow at `highest + 1`); no daemon hands such an ID out, so it is
    /// ignored, with a warning, and numbering goes on from the log's real highest.
    func testASessionIDPastAnyTheDaemonHandsOutIsIgnoredNotATrap() throws {
        let world = try AuditWorld()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        try drag("first", from: source, to: destination)
        world.stopDaemon()
        try sqlite(world, """
            INSERT INTO session (sessionID, sourceApp, itemCount, operation, outcome, startedAt, endedAt)
            VALUES ('s99999999999999999999', 'org.example.Forged', 1, 'copy', 'completed', 0, 0);
            """)
        try world.startDaemon()
        XCTAssertNotNil(world.daemon.stderr.take {
            $0.contains("Ignoring 1 session ID(s) in the transfer log past s9007199254740991, which dragbrokerd never hands out")
        }, world.daemon.stderr.text)
        XCTAssertEqual(try drop("second", from: try world.peer("new-source"), on: try world.peer("new-destination")), "s2")
    }

    /// A ledger header whose last handed-out number is past any a daemon hands out is ignored,
    /// said, and taken for neither the reservation nor a loss: numbering goes on after the log.
    func testALastHandedOutNumberOutOfRangeIsIgnoredNotTakenForALoss() throws {
        let world = try AuditWorld()
        try drag("one", from: try world.peer("source-app"), to: try world.peer("destination-app"))
        _ = try world.daemon.waitForLog { try $0.sessions().first }
        // Killed, so the reservation (s1024) lies past the log's highest (s1).
        world.stopDaemon(SIGKILL)
        let handle = try FileHandle(forWritingTo: ledgerURL(world))
        try handle.seek(toOffset: 32)  // the header's last session number handed out
        try handle.write(contentsOf: Data(repeating: 0xFF, count: 8))
        try handle.close()
        try world.startDaemon()
        XCTAssertNotNil(world.daemon.stderr.take {
            $0.contains("Ignoring the last handed out session number in \(ledgerURL(world).path), 18446744073709551615, which is past any dragbrokerd hands out")
        }, world.daemon.stderr.text)
        XCTAssertEqual(try drop("two", from: try world.peer("new-source"), on: try world.peer("new-destination")), "s1025")
        XCTAssertEqual(lines(world.daemon, containing: "The transfer log has no record of"), 0, world.daemon.stderr.text)
    }

    /// Retention that prunes every row once made numbering start again at s1; the numbers
    /// handed out are kept beside the log, so the next one follows them.
    func testRetentionThatPrunesEveryRecordDoesNotRestartNumbering() throws {
        let world = try AuditWorld(policy: "[Audit]\nRetentionDays=1\n")
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        try drag("one", from: source, to: destination)
        try drag("two", from: source, to: destination)
        world.stopDaemon()
        let threeDaysAgo = Int64((Date().timeIntervalSince1970 - 3 * 86_400) * 1_000_000)
        try sqlite(world, "UPDATE session SET startedAt = \(threeDaysAgo), endedAt = \(threeDaysAgo); UPDATE load SET startedAt = \(threeDaysAgo), endedAt = \(threeDaysAgo);")
        try world.startDaemon()
        XCTAssertNotNil(world.daemon.stderr.take { $0.contains("Removed 4 transfer log record(s) older than 1 days") }, world.daemon.stderr.text)
        // The next start finds an empty log.
        world.stopDaemon()
        try world.startDaemon()
        XCTAssertEqual(try drop("three", from: try world.peer("new-source"), on: try world.peer("new-destination")), "s3")
    }

    /// A daemon that never idles out still applies retention: once the interval has passed
    /// since it last ran (a day, here a second), the next session to come or go runs it.
    func testRetentionRunsAgainWhileTheDaemonServes() throws {
        let world = try AuditWorld(policy: "[Audit]\nRetentionDays=1\n", arguments: ["--retention-interval", "1"])
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        try drag("one", from: source, to: destination)
        try drag("two", from: source, to: destination)
        _ = try world.daemon.waitForLog { try $0.loads().count == 2 ? true : nil }
        let threeDaysAgo = Int64((Date().timeIntervalSince1970 - 3 * 86_400) * 1_000_000)
        try sqlite(world, "UPDATE session SET startedAt = \(threeDaysAgo), endedAt = \(threeDaysAgo); UPDATE load SET startedAt = \(threeDaysAgo), endedAt = \(threeDaysAgo);")
        usleep(1_100_000)
        try drag("three", from: source, to: destination)
        XCTAssertNotNil(world.daemon.stderr.take(timeout: 10) { $0.contains("Removed 4 transfer log record(s) older than 1 days") },
                        world.daemon.stderr.text)
        let sessions = try world.daemon.waitForLog { log -> [SessionRecord]? in
            let sessions = try log.sessions()
            return sessions.count == 1 ? sessions : nil
        }
        XCTAssertEqual(sessions.map(\.sessionID), ["s3"])
    }

    /// kill -9, then a write-ahead log damaged at its first frame: SQLite's recovery drops every
    /// frame from there, and with them every session of the run. The next daemon says how many
    /// sessions the log lost, records them as a gap, and hands none of their IDs out again.
    func testADamagedWriteAheadLogIsReportedAsLostSessionsAndNoIDComesBack() throws {
        let world = try AuditWorld()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        for text in ["one", "two", "three"] { try drag(text, from: source, to: destination) }
        _ = try world.daemon.waitForLog { try $0.sessions().count == 3 ? true : nil }
        world.stopDaemon(SIGKILL)
        let wal = world.stateDirectory.appendingPathComponent("transfers.sqlite-wal")
        let handle = try FileHandle(forWritingTo: wal)
        try handle.seek(toOffset: 32)  // the first frame's header: its salts and checksums
        try handle.write(contentsOf: Data(repeating: 0xA5, count: 24))
        try handle.close()

        try world.startDaemon()
        XCTAssertNotNil(world.daemon.stderr.take {
            $0.contains("The transfer log has no record of 3 session(s) after s0, up to s3: the log lost 3 session(s), s1 to s3, which were handed out but not on disk")
        }, world.daemon.stderr.text)
        XCTAssertEqual(try drop("after", from: try world.peer("new-source"), on: try world.peer("new-destination")), "s1025",
                       "past the block the killed daemon had reserved")
        let gap = try world.daemon.waitForLog { try $0.gaps().first }
        XCTAssertEqual(gap.lost, 3)
        XCTAssertTrue(gap.reason.hasPrefix("the log lost 3 session(s), s1 to s3"), gap.reason)
        XCTAssertEqual(try integrityCheck(world), ["ok"])
    }

    // MARK: The in-flight ledger

    /// The ledger dragbroker wrote before it had a header is moved to this version's format,
    /// keeping its slots: the load a killed daemon left in it is recorded as interrupted.
    func testAHeaderlessLedgerIsMigratedAndTheLoadInItRecorded() throws {
        let world = try AuditWorld()
        world.stopDaemon()
        // A minute ago: older records would fall to the default retention.
        let started = Int64(Date().timeIntervalSince1970 - 60) * 1_000_000
        var old = legacySlot(state: 1, session: "s7", started: started, updated: started + 500_000, bytes: 42)
        old += [UInt8](repeating: 0, count: 63 * 2048)
        try Data(old).write(to: ledgerURL(world))

        try world.startDaemon()
        XCTAssertNotNil(world.daemon.stderr.take { $0.contains("Moved the in-flight ledger \(ledgerURL(world).path) to this version's format, keeping its slots") },
                        world.daemon.stderr.text)
        XCTAssertNotNil(world.daemon.stderr.take { $0.contains("Recorded 1 session(s) and 1 load(s) left open by an unclean exit as interrupted") },
                        world.daemon.stderr.text)
        let log = try TransferLog.openReadOnly(path: world.daemon.transferLogPath)
        let load = try XCTUnwrap(try log.loads(sessionID: "s7").first)
        XCTAssertEqual(load.outcome, "interrupted")
        XCTAssertEqual(load.bytes, 42)
        XCTAssertEqual(load.sourceApp, "org.example.Old")
        XCTAssertEqual(MicrosecondTimestamp.microseconds(load.endedAt), started + 500_000)
        XCTAssertEqual(try Array(Data(contentsOf: ledgerURL(world)).prefix(16)), Array("dragbroker-ldgr\n".utf8))
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        XCTAssertEqual(try drop("after", from: source, on: destination), "s8")
    }

    /// A slot whose times are near Int64.max once trapped the daemon at every start
    /// ("Double value cannot be converted to Int64"): it is cleared, and said so.
    func testALedgerSlotWithTimesOutOfRangeIsClearedNotATrap() throws {
        let world = try AuditWorld()
        world.stopDaemon()
        var old = legacySlot(state: 2, session: "s3", started: .max - 1, updated: .max - 1, bytes: 9)
        old += [UInt8](repeating: 0, count: 63 * 2048)
        try Data(old).write(to: ledgerURL(world))
        try world.startDaemon()
        XCTAssertNotNil(world.daemon.stderr.take { $0.contains("Cleared 1 slot(s) of the in-flight ledger \(ledgerURL(world).path) whose contents were out of range") },
                        world.daemon.stderr.text)
        XCTAssertEqual(try TransferLog.openReadOnly(path: world.daemon.transferLogPath).loads(includingOpen: true), [])
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        try drag("after", from: source, to: destination)
    }

    /// Random bytes are no ledger: kept aside as they are, for whoever wants to look, and a
    /// new ledger takes their place.
    func testALedgerOfRandomBytesIsKeptAsideAndReplaced() throws {
        let world = try AuditWorld()
        world.stopDaemon()
        let noise = Data((0..<(2 * 131_072)).map { _ in UInt8.random(in: 3...255) })
        try noise.write(to: ledgerURL(world))
        try world.startDaemon()
        XCTAssertNotNil(world.daemon.stderr.take {
            $0.contains("The in-flight ledger \(ledgerURL(world).path) could not be trusted (it has no ledger header, and not every slot holds a known state): kept it as transfers.inflight.damaged and started a new one; 0 load(s)")
        }, world.daemon.stderr.text)
        XCTAssertEqual(try Data(contentsOf: world.stateDirectory.appendingPathComponent("transfers.inflight.damaged")), noise)
        XCTAssertEqual(try Array(Data(contentsOf: ledgerURL(world)).prefix(16)), Array("dragbroker-ldgr\n".utf8))
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        try drag("after", from: source, to: destination)
    }

    /// A ledger from a newer version may hold loads this one cannot read: refused, untouched,
    /// with the exit status that tells systemd not to restart.
    func testALedgerFromANewerVersionIsRefusedWithItsOwnExitStatus() throws {
        let world = try AuditWorld()
        world.stopDaemon()
        var header = Array("dragbroker-ldgr\n".utf8) + [2, 0, 0, 0]
        header += [UInt8](repeating: 0, count: 4096 - header.count)
        try Data(header).write(to: ledgerURL(world))
        let refused = try world.refusedStart(saying: "Failed to open the in-flight ledger")
        XCTAssertEqual(refused.status, Self.stateUnusable, refused.stderr)
        XCTAssertTrue(refused.line?.contains("was written by a newer version of dragbroker (ledger version 2, this one knows 1)") == true, refused.line ?? refused.stderr)
        XCTAssertTrue(refused.line?.contains("will not start until it is fixed (exit status 65, which its unit does not restart on)") == true, refused.line ?? "")
        XCTAssertEqual(try Data(contentsOf: ledgerURL(world)), Data(header))
    }

    /// A ledger with holes on a full file system once faulted the daemon at start (SIGBUS from
    /// reading a mapped hole): each block is allocated before it is mapped, so a full disk is
    /// an error, said, and the daemon exits to be restarted when space returns.
    func testASparseLedgerOnAFullFileSystemIsAnErrorNotSIGBUS() throws {
        let world = try AuditWorld(smallFileSystem: true)
        world.stopDaemon()
        XCTAssertEqual(truncate(ledgerURL(world).path, off_t(4096 + 8 * 131_072)), 0)
        try world.fill()
        let refused = try world.refusedStart(saying: "Failed to open the in-flight ledger")
        XCTAssertEqual(refused.status, 1, refused.stderr)
        XCTAssertEqual(refused.line.map { String($0[$0.range(of: "Failed")!.lowerBound...]) },
                       "Failed to open the in-flight ledger: cannot allocate and map \(ledgerURL(world).path): No space left on device")
        try world.free()
        try world.startDaemon()
    }

    /// Holes found at start are allocated then, so a disk that fills afterwards cannot fault a
    /// store into them (SIGBUS at run time, before): the loads go on, and their records wait
    /// in memory until space returns. On ext4, where a mapped hole gets its block only when
    /// first written.
    func testASparseLedgerOnAFileSystemThatFillsLaterIsNoSIGBUS() throws {
        let world = try AuditWorld(small: .ext4)
        world.stopDaemon()
        XCTAssertEqual(truncate(ledgerURL(world).path, off_t(4096 + 4 * 131_072)), 0)
        try world.startDaemon()
        try world.fill()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        for text in ["one", "two", "three"] { try drag(text, from: source, to: destination) }
        try world.free()
        let loads = try world.daemon.waitForLog { log -> [LoadRecord]? in
            let loads = try log.loads()
            return loads.count == 3 ? loads : nil
        }
        XCTAssertEqual(loads.map(\.outcome), ["completed", "completed", "completed"])
        XCTAssertTrue(world.daemon.process.isRunning)
    }

    /// The same with a headerless ledger: it is migrated, its free chunks dropped, and on a full
    /// disk even that fails cleanly.
    func testASparseHeaderlessLedgerOnAFullFileSystemIsAnErrorNotSIGBUS() throws {
        let world = try AuditWorld(smallFileSystem: true)
        world.stopDaemon()
        try FileManager.default.removeItem(at: ledgerURL(world))
        XCTAssertTrue(FileManager.default.createFile(atPath: ledgerURL(world).path, contents: nil))
        XCTAssertEqual(truncate(ledgerURL(world).path, off_t(8 * 131_072)), 0)
        try world.fill()
        let refused = try world.refusedStart(saying: "Failed to open the in-flight ledger")
        XCTAssertEqual(refused.status, 1, refused.stderr)
        XCTAssertTrue(refused.line?.hasSuffix("Failed to open the in-flight ledger: cannot rewrite \(ledgerURL(world).path): No space left on device") == true,
                      refused.line ?? refused.stderr)
        try world.free()
        try world.startDaemon()
        XCTAssertEqual(try FileManager.default.attributesOfItem(atPath: ledgerURL(world).path)[.size] as? Int, 4096,
                       "the migrated ledger keeps no empty chunk")
    }

    // MARK: The transfer log

    /// A log a newer version migrated (here with a NOT NULL column every insert of this version
    /// would fail) is refused, naming the migration, and not a byte of it is written.
    func testALogFromANewerSchemaIsRefusedNamingTheMigrationAndNeverWritten() throws {
        let world = try AuditWorld()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        try drag("before", from: source, to: destination)
        world.stopDaemon()
        try sqlite(world, """
            ALTER TABLE load ADD COLUMN carriedBy TEXT NOT NULL DEFAULT 'x';
            INSERT INTO grdb_migrations (identifier) VALUES ('v9-carried-by');
            PRAGMA wal_checkpoint(TRUNCATE);
            """)
        let before = try Data(contentsOf: URL(fileURLWithPath: world.daemon.transferLogPath))
        let refused = try world.refusedStart(saying: "Failed to open the transfer log")
        XCTAssertEqual(refused.status, Self.stateUnusable, refused.stderr)
        XCTAssertTrue(refused.line?.contains("""
            \(world.daemon.transferLogPath) was written by a newer version of dragbroker (it has the migration v9-carried-by, \
            which this version does not know); it was left untouched
            """) == true, refused.line ?? refused.stderr)
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: world.daemon.transferLogPath)), before)
    }

    /// Random bytes where the log should be: refused with the exit status of unusable state.
    func testALogOfRandomBytesIsRefusedWithItsOwnExitStatus() throws {
        let world = try AuditWorld()
        world.stopDaemon()
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: world.daemon.transferLogPath + suffix) }
        let noise = Data((0..<8192).map { _ in UInt8.random(in: 0...255) })
        try noise.write(to: URL(fileURLWithPath: world.daemon.transferLogPath))
        let refused = try world.refusedStart(saying: "Failed to open the transfer log")
        XCTAssertEqual(refused.status, Self.stateUnusable, refused.stderr)
        XCTAssertTrue(refused.line?.contains("file is not a database") == true, refused.line ?? refused.stderr)
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: world.daemon.transferLogPath)), noise)
    }

    // MARK: Helpers

    func ledgerURL(_ world: AuditWorld) -> URL {
        world.stateDirectory.appendingPathComponent("transfers.inflight")
    }

    func sqlite(_ world: AuditWorld, _ sql: String) throws {
        // Waits for the lock a running daemon's writer may hold, rather than failing at once.
        let child = try Child(executable: URL(fileURLWithPath: "/usr/bin/sqlite3"),
                              arguments: ["-cmd", ".timeout 5000", world.daemon.transferLogPath, sql], environment: [:])
        child.process.waitUntilExit()
        guard child.process.terminationStatus == 0 else { throw HarnessError("sqlite3 failed: \(child.stderr.text)") }
    }

    /// One slot as dragbroker wrote them before the ledger had a header: state, load number,
    /// start, last checkpoint, bytes, session start, item count, text length, then seven
    /// NUL-ended fields (session, source, destination, type, operation, and two teams, 0xFF
    /// for none).
    func legacySlot(state: UInt32, session: String, started: Int64, updated: Int64, bytes: Int64) -> [UInt8] {
        var slot = [UInt8](repeating: 0, count: 2048)
        var text: [UInt8] = []
        for field in [session, "org.example.Old", "org.example.Dest", "text/plain", "copy"] { text += Array(field.utf8) + [0] }
        text += [0xFF, 0, 0xFF, 0]
        slot.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: state, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: UInt32(1), toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: started, toByteOffset: 8, as: Int64.self)
            raw.storeBytes(of: updated, toByteOffset: 16, as: Int64.self)
            raw.storeBytes(of: bytes, toByteOffset: 24, as: Int64.self)
            raw.storeBytes(of: started, toByteOffset: 32, as: Int64.self)
            raw.storeBytes(of: UInt32(1), toByteOffset: 40, as: UInt32.self)
            raw.storeBytes(of: UInt32(text.count), toByteOffset: 44, as: UInt32.self)
        }
        slot.replaceSubrange(48..<48 + text.count, with: text)
        return slot
    }
}

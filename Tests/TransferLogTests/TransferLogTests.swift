import Foundation
import GRDB
import XCTest

@testable import TransferLog

final class TransferLogTests: XCTestCase {
    private var directory: URL!

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("TransferLogTests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        if let mounted {
            try run("/bin/umount", "--lazy", mounted.path)
        }
        // A log released at the end of a test closes its last connection on its own queue, and
        // SQLite then deletes the -shm file: if that happens mid-removal, the removal sees a
        // file vanish under it. Again, then, until nothing is left.
        for attempt in 1...5 {
            do {
                try FileManager.default.removeItem(at: directory)
                return
            } catch where attempt < 5 && FileManager.default.fileExists(atPath: directory.path) {
                usleep(20_000)
            }
        }
    }

    private var logPath: String { directory.appendingPathComponent("transfers.sqlite").path }

    /// Reads the log's file through a connection of the test's own, as any SQLite client could.
    /// A `DatabaseQueue` leaves the journal mode as it finds it (a `DatabasePool` would set WAL).
    private func strings(sql: String) throws -> [String] {
        var config = Configuration()
        config.readonly = true
        return try DatabaseQueue(path: logPath, configuration: config).read { try String.fetchAll($0, sql: sql) }
    }

    /// Holds `log`'s writer queue until the returned semaphore is signalled, so that entries
    /// submitted meanwhile stay in memory: `sessionNumbering(prefix:ceiling:then:)` reports on that
    /// serial queue, and every later drain waits behind the report.
    private func holdWriter(of log: TransferLog) -> DispatchSemaphore {
        let release = DispatchSemaphore(value: 0)
        log.sessionNumbering(prefix: "s", ceiling: .max) { _ in release.wait() }
        return release
    }

    // Whole microseconds, so the exact Date survives the integer encoding.
    private let t0 = Date(timeIntervalSince1970: 1_700_000_000.123456)

    private func session(_ id: String = "s-1") -> SessionRecord {
        SessionRecord(
            sessionID: id, sourceApp: "org.example.Files", destinationApp: "org.example.Mail",
            itemCount: 3, operation: "copy", outcome: "source-disconnected",
            errorName: "org.dragbroker.Error.SourceGone",
            startedAt: t0, endedAt: t0.addingTimeInterval(2.5))
    }

    private func load(sessionID: String = "s-1", startedAt: Date? = nil, bytes: Int64 = 4_294_967_301) -> LoadRecord {
        let start = startedAt ?? t0.addingTimeInterval(0.000_001)
        return LoadRecord(
            sessionID: sessionID, sourceApp: "org.example.Files", destinationApp: "org.example.Mail",
            typeIdentifier: "public.png", bytes: bytes,
            startedAt: start, endedAt: start.addingTimeInterval(0.75),
            outcome: "completed", errorName: nil)
    }

    func testRecordsSurviveReopeningWithExactValues() throws {
        do {
            let log = try TransferLog(path: logPath)
            XCTAssertTrue(log.submit(.session(session())))
            XCTAssertTrue(log.submit(.load(load())))
            log.flush()
            XCTAssertNil(log.lastWriteError)
        }

        var expectedLoad = load()
        expectedLoad.id = 1
        let reopened = try TransferLog(path: logPath)
        XCTAssertEqual(try reopened.sessions(), [session()])
        XCTAssertEqual(try reopened.loads(), [expectedLoad])
        XCTAssertEqual(try reopened.loads()[0].bytes, 4_294_967_301)
        XCTAssertEqual(try reopened.sessions()[0].startedAt.timeIntervalSince1970, 1_700_000_000.123456)

        let reader = try TransferLog.openReadOnly(path: logPath)
        XCTAssertEqual(try reader.sessions(), [session()])
        XCTAssertEqual(try reader.loads(sessionID: "s-1"), [expectedLoad])
        XCTAssertEqual(try reader.loads(sessionID: "other"), [])
    }

    func testHighestSessionNumberCoversBothTablesAndIgnoresOtherPrefixes() throws {
        let log = try TransferLog(path: logPath)
        XCTAssertEqual(try log.sessionNumbering(prefix: "s", ceiling: .max).highest, 0, "an empty log starts numbering at 1")
        log.submit(.session(session("s9")))
        log.submit(.load(load(sessionID: "s12")))  // its session was never recorded: a crash
        log.submit(.session(session("x99")))
        log.flush()
        XCTAssertEqual(try log.sessionNumbering(prefix: "s", ceiling: .max).highest, 12)
        XCTAssertEqual(try log.sessionNumbering(prefix: "x", ceiling: .max).highest, 99)
        // Twenty digits: SQLite reads them as its largest integer, which no daemon hands out.
        log.submit(.session(session("s99999999999999999999")))
        log.flush()
        XCTAssertEqual(try log.sessionNumbering(prefix: "s", ceiling: 1 << 53), .init(highest: 12, outOfRange: 1))
    }

    /// The daemon's off-loop forms: retention and the last session number, reported from the
    /// writer's queue; a log opened for reading refuses to prune.
    func testPruneAndHighestSessionNumberReportFromTheWriterQueue() throws {
        let log = try TransferLog(path: logPath)
        log.submit(.session(session("s5")))
        let reported = expectation(description: "both reported")
        reported.expectedFulfillmentCount = 2
        log.sessionNumbering(prefix: "s", ceiling: .max) { result in
            XCTAssertEqual(try? result.get().highest, 5, "entries submitted before are written first")
            reported.fulfill()
        }
        log.prune(endedBefore: Date().addingTimeInterval(86_400)) { result in
            XCTAssertEqual(try? result.get(), 1)
            reported.fulfill()
        }
        wait(for: [reported], timeout: 10)
        let reader = try TransferLog.openReadOnly(path: logPath)
        let refused = expectation(description: "refused")
        reader.prune(endedBefore: Date()) { result in
            guard case .failure(let error) = result else { return XCTFail("a read-only log pruned") }
            XCTAssertEqual(error as? TransferLogError, .readOnly)
            XCTAssertEqual("\(error)", "the transfer log was opened read-only")
            refused.fulfill()
        }
        wait(for: [refused], timeout: 10)
    }

    func testDatesAreStoredAsIntegerMicroseconds() throws {
        let log = try TransferLog(path: logPath)
        log.submit(.session(session()))
        log.flush()
        XCTAssertEqual(
            try strings(sql: "SELECT typeof(startedAt) || ':' || startedAt FROM session"),
            ["integer:1700000000123456"])
    }

    func testJournalModeIsWAL() throws {
        _ = try TransferLog(path: logPath)
        XCTAssertEqual(try strings(sql: "PRAGMA journal_mode"), ["wal"])
    }

    func testMigrationIdentifiersAreRecordedOnce() throws {
        _ = try TransferLog(path: logPath)
        _ = try TransferLog(path: logPath)
        XCTAssertEqual(
            try strings(sql: "SELECT identifier FROM grdb_migrations ORDER BY rowid"),
            ["v1-sessions-and-loads", "v2-refusals", "v3-load-teams", "v4-write-ahead", "v5-log-state", "v6-session-kinds"])
    }

    /// Rows from before pastes existed are drags; a record rebuilt from a load after a crash
    /// knows a paste by its ID.
    func testSessionKindsOfOldRowsAndOfRecordsRebuiltFromTheirID() throws {
        let pool = try DatabasePool(path: logPath)
        try Schema.migrator.migrate(pool, upTo: "v5-log-state")
        try pool.write { db in
            try db.execute(sql: """
                INSERT INTO session (sessionID, sourceApp, destinationApp, itemCount, operation, outcome, startedAt, endedAt)
                VALUES ('s9', 'org.example.Old', NULL, 1, 'copy', 'completed', 1, 2)
                """)
        }
        try pool.close()
        let log = try TransferLog(path: logPath)
        XCTAssertEqual(try log.sessions().map(\.kind), ["drag"])
        var paste = session("s9_2")
        paste.kind = "paste"
        log.submit(.session(paste))
        log.flush()
        XCTAssertEqual(try strings(sql: "SELECT sessionID || ' ' || kind FROM session ORDER BY sessionID"), ["s9 drag", "s9_2 paste"])
        XCTAssertEqual(SessionRecord(sessionID: "s9_2", sourceApp: "a", destinationApp: nil, itemCount: 1, operation: "copy",
                                     outcome: "open", startedAt: t0, endedAt: t0).kind, "paste")
        XCTAssertEqual(SessionRecord(sessionID: "s9", sourceApp: "a", destinationApp: nil, itemCount: 1, operation: "copy",
                                     outcome: "open", startedAt: t0, endedAt: t0).channel, "drag")
    }

    func testPruneRemovesOnlyOldRecords() throws {
        let log = try TransferLog(path: logPath)
        log.submit(.session(session("old")))
        log.submit(.load(load(sessionID: "old")))
        var recent = session("new")
        recent.startedAt = t0.addingTimeInterval(86_400 * 10)
        recent.endedAt = recent.startedAt
        log.submit(.session(recent))
        log.flush()
        XCTAssertEqual(try log.prune(endedBefore: t0.addingTimeInterval(86_400)), 2)
        XCTAssertEqual(try log.sessions().map(\.sessionID), ["new"])
        XCTAssertEqual(try log.loads(), [])
    }

    func testRefusalsRoundTrip() throws {
        let log = try TransferLog(path: logPath)
        let refusal = RefusalRecord(at: t0, app: "org.example.Unmanaged", uid: 1000, pid: 42, action: "Load", sessionID: "s3",
                                    subject: "text/plain", errorName: "org.dragbroker.Broker1.Error.AccessDenied",
                                    message: "denied by policy", rule: "/etc/dragbroker/dragbroker.conf:12")
        log.submit(.refusal(refusal))
        log.flush()
        var expected = refusal
        expected.id = 1
        XCTAssertEqual(try TransferLog.openReadOnly(path: logPath).refusals(), [expected])
    }

    func testRefusalFilterMatchesEachFieldAndKeepsNewestFirst() throws {
        let log = try TransferLog(path: logPath)
        func refusal(_ seconds: Double, app: String, action: String, subject: String?, error: String) -> RefusalRecord {
            RefusalRecord(at: t0.addingTimeInterval(seconds), app: app, uid: 1000, pid: 42, action: action, sessionID: subject == nil ? nil : "s1",
                          subject: subject, errorName: "org.dragbroker.Broker1.Error.\(error)", message: "no", rule: nil)
        }
        log.submit(.refusal(refusal(0, app: "org.example.Mail", action: "Load", subject: "text/plain", error: "WrongState")))
        log.submit(.refusal(refusal(10, app: "org.example.Mail", action: "Load", subject: "image/png", error: "AccessDenied")))
        log.submit(.refusal(refusal(20, app: "org.example.Files", action: "BeginSession", subject: nil, error: "LimitExceeded")))
        log.submit(.refusal(refusal(20, app: "org.example.Files", action: "Load", subject: "text/plain", error: "AccessDenied")))
        log.flush()
        XCTAssertNil(log.lastWriteError)
        let reader = try TransferLog.openReadOnly(path: logPath)
        func ids(_ filter: TransferLog.RefusalFilter, limit: Int = 10) throws -> [Int64?] {
            try reader.refusals(limit: limit, filter: filter).map(\.id)
        }
        XCTAssertEqual(try ids(.init()), [4, 3, 2, 1], "newest first; equal times by insertion, newest first")
        XCTAssertEqual(try ids(.init(), limit: 2), [4, 3])
        XCTAssertEqual(try ids(.init(since: t0.addingTimeInterval(10))), [4, 3, 2], "since is inclusive")
        XCTAssertEqual(try ids(.init(until: t0.addingTimeInterval(10))), [2, 1], "until is inclusive")
        XCTAssertEqual(try ids(.init(since: t0.addingTimeInterval(5), until: t0.addingTimeInterval(15))), [2])
        XCTAssertEqual(try ids(.init(app: "org.example.Mail")), [2, 1])
        XCTAssertEqual(try ids(.init(type: "text/plain")), [4, 1])
        XCTAssertEqual(try ids(.init(action: "BeginSession")), [3])
        XCTAssertEqual(try ids(.init(errorName: "org.dragbroker.Broker1.Error.AccessDenied")), [4, 2])
        XCTAssertEqual(try ids(.init(errorName: "AccessDenied")), [], "the full name, as recorded")
        XCTAssertEqual(try ids(.init(app: "org.example.Files", type: "text/plain", action: "Load",
                                     errorName: "org.dragbroker.Broker1.Error.AccessDenied")), [4], "filters combine")
        XCTAssertEqual(try ids(.init(app: "org.example.Nobody")), [])
        XCTAssertEqual(try reader.refusals(limit: 1, filter: .init(action: "BeginSession")).first?.subject, nil)
    }

    func testThousandSubmitsYieldThousandRowsNewestFirst() throws {
        let log = try TransferLog(path: logPath)
        for i in 0..<1000 {
            XCTAssertTrue(log.submit(.load(load(startedAt: t0.addingTimeInterval(Double(i) / 1_000_000), bytes: Int64(i)))))
        }
        log.flush()
        XCTAssertNil(log.lastWriteError)
        XCTAssertEqual(try strings(sql: "SELECT CAST(count(*) AS TEXT) FROM load"), ["1000"])
        let loads = try log.loads(limit: 5000)
        XCTAssertEqual(loads.count, 1000)
        XCTAssertEqual(loads.map(\.bytes), (0..<1000).reversed().map(Int64.init))
        XCTAssertEqual(try log.loads(limit: 2).map(\.id), [1000, 999])
    }

    func testBurstIsCommittedAsOneTransaction() throws {
        // Built from its parts so the test can watch the pool's commits.
        let pool = try DatabasePool(path: logPath)
        try Schema.migrator.migrate(pool)
        let commits = CommitCounter()
        pool.add(transactionObserver: commits)
        let writer = BatchWriter(pool: pool, capacity: TransferLog.defaultQueueCapacity, onEvent: nil)
        let release = DispatchSemaphore(value: 0)
        writer.perform { release.wait() }
        for i in 0..<500 { _ = writer.submit(.init(entry: .session(session("s-\(i)")), mustCommit: false, committed: nil)) }
        release.signal()
        writer.flush()
        XCTAssertEqual(commits.count, 1)
        XCTAssertEqual(try strings(sql: "SELECT CAST(count(*) AS TEXT) FROM session"), ["500"])
    }

    func testOpenReadOnlyMissingPathThrowsWithoutCreatingFile() {
        let missing = directory.appendingPathComponent("nope/transfers.sqlite").path
        XCTAssertThrowsError(try TransferLog.openReadOnly(path: missing)) { error in
            XCTAssertEqual(error as? TransferLogError, .missingDatabase(path: missing))
            XCTAssertEqual("\(error)", "no transfer log at \(missing) (has dragbrokerd run yet?)")
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: missing))
    }

    func testOpenReadOnlyRejectsFileThatIsNotATransferLog() throws {
        XCTAssertTrue(FileManager.default.createFile(atPath: logPath, contents: Data()))
        XCTAssertThrowsError(try TransferLog.openReadOnly(path: logPath)) { error in
            XCTAssertEqual(error as? TransferLogError, .unsupportedSchema(path: logPath))
        }
    }

    func testReadOnlyLogRefusesSubmissions() throws {
        _ = try TransferLog(path: logPath)
        let reader = try TransferLog.openReadOnly(path: logPath)
        XCTAssertFalse(reader.submit(.session(session())))
        reader.flush()
        XCTAssertEqual(try reader.sessions(), [])
    }

    func testSubmitReturnsFalseWhenQueueIsFull() throws {
        let log = try TransferLog(path: logPath, queueCapacity: 3)
        let release = holdWriter(of: log)
        XCTAssertEqual((0..<4).map { log.submit(.session(session("s-\($0)"))) }, [true, true, true, false])
        release.signal()
        log.flush()
        XCTAssertEqual(try log.sessions().map(\.sessionID).sorted(), ["s-0", "s-1", "s-2"])
        // The one that did not fit is counted, and the count is on record with the batch.
        let gaps = try log.gaps()
        XCTAssertEqual(gaps.map(\.lost), [1])
        XCTAssertEqual(gaps.map(\.reason), ["the queue of records waiting to be written was full (3 records)"])
        XCTAssertEqual(try log.lostRecords(), 1)
        // Capacity is released once the batch is on disk.
        XCTAssertTrue(log.submit(.session(session("s-3"))))
        log.flush()
        XCTAssertEqual(try log.sessions().count, 4)
        XCTAssertEqual(try log.gaps().count, 1, "a gap is recorded once")
    }

    func testBadEntryIsReportedAndCountedWithoutLosingTheRestOfItsBatch() throws {
        let reported = EventBox()
        let log = try TransferLog(path: logPath, onEvent: { reported.append($0) })
        let release = holdWriter(of: log)
        let refusal = RefusalRecord(id: 7, at: t0, app: "org.example.Mail", uid: 1000, pid: 42, action: "Load", sessionID: "s1",
                                    subject: "text/plain", errorName: "org.dragbroker.Broker1.Error.WrongState", message: "no", rule: nil)
        log.submit(.refusal(refusal))
        log.submit(.refusal(refusal))  // the same primary key: SQLite refuses it, for good
        log.submit(.load(load()))
        release.signal()
        log.flush()

        XCTAssertEqual(try log.refusals().map(\.id), [7])
        XCTAssertEqual(try log.loads().count, 1)
        let failure = try XCTUnwrap(log.lastWriteError as? TransferLogWriteFailure)
        XCTAssertEqual(failure.droppedEntries, 1)
        XCTAssertEqual(reported.names, ["rejected 1", "gapRecorded 1"])
        let gap = try XCTUnwrap(try log.gaps().first)
        XCTAssertEqual(gap.lost, 1)
        XCTAssertTrue(gap.reason.hasPrefix("SQLite refused them: "), gap.reason)
        XCTAssertFalse(log.isFailing, "a bad row is no failure of the log")
    }

    // MARK: Write-ahead records

    /// A session's row as written when it begins.
    private func openSession(_ id: String) -> SessionRecord {
        var record = session(id)
        record.outcome = SessionRecord.open
        record.endedAt = record.startedAt
        return record
    }

    private func openLoad(_ loadID: Int64, sessionID: String = "s1") -> LoadRecord {
        var record = load(sessionID: sessionID, bytes: 0)
        record.loadID = loadID
        record.endedAt = record.startedAt
        record.outcome = LoadRecord.open
        return record
    }

    /// A running load's open record with its bytes so far at `at`, as the daemon checkpoints it.
    private func checkpoint(_ log: TransferLog, _ loadID: Int64, sessionID: String = "s1", bytes: Int64, at: Date) {
        var record = openLoad(loadID, sessionID: sessionID)
        record.bytes = bytes
        record.endedAt = at
        log.checkpoint(record)
    }

    /// A session and a load are each one row from start to end: the end completes the row the
    /// start opened, checkpoints move an open row's bytes and time, and never a closed one's.
    func testTheEndCompletesTheRowTheStartOpened() throws {
        let log = try TransferLog(path: logPath)
        let opened = openSession("s1")
        log.submit(.session(opened))
        log.submit(.load(openLoad(1)))
        log.submit(.load(openLoad(2)))
        log.flush()
        XCTAssertEqual(try log.sessions(includingOpen: true).map(\.outcome), ["open"])
        XCTAssertEqual(try log.loads(includingOpen: true).map(\.outcome), ["open", "open"])
        XCTAssertEqual(try log.sessions(), [], "by default, only what ended")
        XCTAssertEqual(try log.loads(), [])

        checkpoint(log, 1, bytes: 1000, at: t0.addingTimeInterval(1))
        checkpoint(log, 1, bytes: 5000, at: t0.addingTimeInterval(2))
        log.flush()
        let checkpointed = try XCTUnwrap(try log.loads(includingOpen: true).first { $0.loadID == 1 })
        XCTAssertEqual(checkpointed.bytes, 5000, "the newest checkpoint")
        XCTAssertEqual(checkpointed.endedAt, t0.addingTimeInterval(2))
        XCTAssertEqual(checkpointed.outcome, "open")

        var ended = openLoad(1)
        ended.bytes = 6000
        ended.endedAt = t0.addingTimeInterval(3)
        ended.outcome = "completed"
        log.submit(.load(ended))
        checkpoint(log, 1, bytes: 5500, at: t0.addingTimeInterval(2.5))  // late: ignored
        log.submit(.session(session("s1")))
        log.flush()
        let loads = try log.loads(includingOpen: true).sorted { $0.loadID! < $1.loadID! }
        XCTAssertEqual(loads.map(\.loadID), [1, 2])
        XCTAssertEqual(loads.map(\.outcome), ["completed", "open"])
        XCTAssertEqual(loads.map(\.bytes), [6000, 0])
        XCTAssertEqual(loads[0].endedAt, t0.addingTimeInterval(3))
        XCTAssertEqual(try log.sessions(), [session("s1")])
        XCTAssertEqual(try strings(sql: "SELECT CAST(count(*) AS TEXT) FROM load"), ["2"])
    }

    /// A start that was lost still leaves its end on record, as a row of its own.
    func testAnEndWithoutItsStartIsInserted() throws {
        let log = try TransferLog(path: logPath)
        var ended = openLoad(3)
        ended.outcome = "completed"
        log.submit(.load(ended))
        log.submit(.session(session("s1")))
        log.flush()
        XCTAssertEqual(try log.loads().map(\.outcome), ["completed"])
        XCTAssertEqual(try log.sessions(), [session("s1")])
    }

    /// What a crashed daemon left open is closed as interrupted, at its last checkpoint, else
    /// its start; a session at the latest of its loads; closed records stay as they were.
    func testCloseOpenRecordsEndsEachAtItsLastCheckpointElseItsStart() throws {
        let log = try TransferLog(path: logPath)
        let opened = openSession("s1")
        log.submit(.session(opened))
        let untouched = openSession("s2")
        log.submit(.session(untouched))
        log.submit(.session(session("s0")))
        log.submit(.load(openLoad(1)))
        log.submit(.load(openLoad(2)))
        checkpoint(log, 2, bytes: 131_072, at: t0.addingTimeInterval(4))
        log.flush()

        // Kept beside the log: load 2 further than its row says, load 3 of session s3 with no row
        // at all, and load 1 of s0, whose end is on record and stays as it is.
        var further = openLoad(2)
        further.bytes = 200_000
        further.endedAt = t0.addingTimeInterval(5)
        var unwritten = openLoad(3, sessionID: "s3")
        unwritten.bytes = 42
        unwritten.endedAt = t0.addingTimeInterval(6)
        var s3 = openSession("s3")
        s3.endedAt = unwritten.endedAt
        var ended = openLoad(1, sessionID: "s0")
        ended.outcome = "completed"
        log.submit(.load(ended))
        log.flush()
        let inFlight = [TransferLog.InFlight(session: opened, load: further), TransferLog.InFlight(session: s3, load: unwritten),
                        TransferLog.InFlight(session: session("s0"), load: openLoad(1, sessionID: "s0"))]

        let recovery = try log.closeOpenRecords(errorName: "org.dragbroker.Broker1.Error.Disconnected", inFlight: inFlight)
        XCTAssertEqual(recovery, .init(sessions: 3, loads: 3, endedAtCheckpoint: 4, endedAtStart: 2))
        XCTAssertEqual(try log.loads(sessionID: "s0").map(\.outcome), ["completed"])
        let loads = try log.loads().filter { $0.sessionID != "s0" }.sorted { $0.loadID! < $1.loadID! }
        XCTAssertEqual(loads.map(\.outcome), ["interrupted", "interrupted", "interrupted"])
        XCTAssertEqual(Set(loads.map(\.errorName)), ["org.dragbroker.Broker1.Error.Disconnected"])
        XCTAssertEqual(loads.map(\.bytes), [0, 200_000, 42])
        XCTAssertEqual(loads.map(\.endedAt), [loads[0].startedAt, t0.addingTimeInterval(5), t0.addingTimeInterval(6)])
        XCTAssertEqual(loads[2].sessionID, "s3")
        let sessions = Dictionary(uniqueKeysWithValues: try log.sessions().map { ($0.sessionID, $0) })
        XCTAssertEqual(sessions["s1"]?.outcome, "interrupted")
        XCTAssertEqual(sessions["s1"]?.endedAt, t0.addingTimeInterval(5), "the session lived as long as its load")
        XCTAssertEqual(sessions["s3"]?.outcome, "interrupted", "a session known only beside the log")
        XCTAssertEqual(sessions["s3"]?.destinationApp, "org.example.Mail")
        XCTAssertEqual(sessions["s2"]?.endedAt, t0, "no checkpoint: its start")
        XCTAssertEqual(sessions["s0"], session("s0"))
        XCTAssertEqual(try log.closeOpenRecords(errorName: "x"), .init(), "nothing is left open")
    }

    func testPruneKeepsOpenRecords() throws {
        let log = try TransferLog(path: logPath)
        log.submit(.load(openLoad(1)))
        log.submit(.load(load(sessionID: "old")))
        log.flush()
        XCTAssertEqual(try log.prune(endedBefore: t0.addingTimeInterval(86_400)), 1)
        XCTAssertEqual(try log.loads(includingOpen: true).map(\.outcome), ["open"])
    }

    // MARK: A full disk

    /// A log on a file system of its own, 2 MiB of tmpfs, that `fill` fills as a full disk is
    /// full and `free` frees. Every commit appends to the WAL, so once the file system is full
    /// every write fails with SQLITE_FULL, as on a real disk.
    private func logOnSmallFileSystem(queueCapacity: Int = TransferLog.defaultQueueCapacity,
                                      onEvent: (@Sendable (TransferLogEvent) -> Void)? = nil) throws -> TransferLog {
        let mountPoint = directory.appendingPathComponent("small")
        try FileManager.default.createDirectory(at: mountPoint, withIntermediateDirectories: true)
        try run("/bin/mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", mountPoint.path)
        mounted = mountPoint
        return try TransferLog(path: mountPoint.appendingPathComponent("transfers.sqlite").path, queueCapacity: queueCapacity,
                               onEvent: onEvent)
    }

    private var mounted: URL?
    private var filler: URL? { mounted?.appendingPathComponent("filler") }

    private func fill() throws {
        let descriptor = open(try XCTUnwrap(filler).path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        XCTAssertGreaterThanOrEqual(descriptor, 0)
        defer { close(descriptor) }
        let block = [UInt8](repeating: 0, count: 4096)
        while write(descriptor, block, block.count) > 0 {}
        XCTAssertEqual(errno, ENOSPC)
    }

    private func free() throws {
        try FileManager.default.removeItem(at: try XCTUnwrap(filler))
    }

    private func run(_ arguments: String...) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: arguments[0])
        process.arguments = Array(arguments.dropFirst())
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw CocoaError(.fileWriteUnknown) }
    }

    /// While writes fail, records wait in order and are written when space returns; past the
    /// bound they are counted, and the count is written with them as a gap. The owner hears
    /// once that writes fail, once that the queue is full, and once that writes work again.
    func testRecordsWaitWhileTheDiskIsFullAndALossBeyondTheBoundIsAGap() throws {
        let reported = EventBox()
        let log = try logOnSmallFileSystem(queueCapacity: 3, onEvent: { reported.append($0) })
        try fill()
        let results = (0..<5).map { log.submit(.session(session("s\($0)"))) }
        XCTAssertEqual(results, [true, true, true, false, false])
        log.flush()
        XCTAssertTrue(log.isFailing)
        XCTAssertTrue(log.isLosingRecords)
        XCTAssertEqual(try log.sessions().count, 0)
        XCTAssertEqual(log.submit(.session(session("s5"))), false)
        log.flush()

        try free()
        log.flush()
        XCTAssertFalse(log.isFailing)
        XCTAssertFalse(log.isLosingRecords)
        XCTAssertEqual(try log.sessions().map(\.sessionID).sorted(), ["s0", "s1", "s2"])
        let gaps = try log.gaps()
        XCTAssertEqual(gaps.map(\.lost), [3])
        XCTAssertEqual(gaps.map(\.reason), ["the queue of records waiting to be written was full (3 records)"])
        XCTAssertLessThanOrEqual(gaps[0].firstLostAt, gaps[0].lastLostAt)
        XCTAssertEqual(Set(reported.names), ["writesFailing", "queueFull 3", "writesRecovered 3", "gapRecorded 3"])
        XCTAssertEqual(reported.names.count, 4, "each told once: \(reported.names)")

        XCTAssertTrue(log.submit(.session(session("s6"))))
        log.flush()
        XCTAssertEqual(try log.sessions().count, 4)
        XCTAssertEqual(try log.gaps().count, 1)
    }

    /// The caller that holds a transfer back for its record hears whether it committed. An
    /// entry that must commit is dropped when it cannot, and is no loss: its caller refuses the
    /// transfer instead. A kept entry hears of each failed attempt, and once that it committed.
    func testCommittedIsToldAfterEachAttemptAndMustCommitEntriesAreDroppedNotKept() throws {
        let log = try logOnSmallFileSystem()
        let answers = AnswerBox()
        XCTAssertTrue(log.submit(.load(openLoad(1)), mustCommit: true) { answers.append("first \($0)") })
        log.flush()
        XCTAssertEqual(answers.values, ["first true"])

        try fill()
        XCTAssertTrue(log.submit(.load(openLoad(2)), mustCommit: true) { answers.append("refused \($0)") })
        XCTAssertTrue(log.submit(.load(openLoad(3)), mustCommit: false) { answers.append("kept \($0)") })
        log.flush()
        XCTAssertEqual(answers.values.filter { $0.hasPrefix("refused") }, ["refused false"])
        XCTAssertFalse(answers.values.contains("kept true"))
        XCTAssertTrue(answers.values.contains("kept false"))

        try free()
        log.flush()
        XCTAssertEqual(try log.loads(includingOpen: true).compactMap(\.loadID).sorted(), [1, 3])
        XCTAssertEqual(try log.gaps(), [])
        XCTAssertEqual(answers.values.last, "kept true")
        XCTAssertEqual(answers.values.filter { $0 == "kept true" }.count, 1, "told once that it committed")
        XCTAssertEqual(answers.values.filter { $0.hasPrefix("refused") }, ["refused false"], "a dropped entry is told once")
    }

    func testCreatesMissingParentDirectoriesPrivately() throws {
        let nested = directory.appendingPathComponent("a/b")
        _ = try TransferLog(path: nested.appendingPathComponent("transfers.sqlite").path)
        for dir in [directory.appendingPathComponent("a"), nested] {
            let attributes = try FileManager.default.attributesOfItem(atPath: dir.path)
            XCTAssertEqual((attributes[.posixPermissions] as? NSNumber)?.intValue, 0o700, dir.path)
        }
    }

    /// The log is the user's alone whatever the umask: the directories it creates 0700, the
    /// database and the -wal and -shm files SQLite creates beside it 0600, also when SQLite
    /// recreates them for a reopened log, and files an older version left open are tightened.
    func testFilesArePrivateUnderAPermissiveUmask() throws {
        let nested = directory.appendingPathComponent("state/dragbroker")
        let path = nested.appendingPathComponent("transfers.sqlite").path
        func mode(_ path: String) throws -> Int {
            try XCTUnwrap((FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? NSNumber)?.intValue, path)
        }
        func entries() throws -> [String] { try FileManager.default.contentsOfDirectory(atPath: nested.path).sorted() }
        let previous = umask(0)
        defer { umask(previous) }

        do {
            let log = try TransferLog(path: path)
            XCTAssertTrue(log.submit(.session(session("s1"))))
            log.flush()
            XCTAssertNil(log.lastWriteError)
            XCTAssertEqual(try entries(), ["transfers.sqlite", "transfers.sqlite-shm", "transfers.sqlite-wal"])
            for file in try entries() { XCTAssertEqual(try mode(nested.appendingPathComponent(file).path), 0o600, file) }
            for dir in [directory.appendingPathComponent("state"), nested] { XCTAssertEqual(try mode(dir.path), 0o700, dir.path) }
        }
        // The last connection closed: SQLite checkpointed and deleted the -wal and -shm files.
        XCTAssertEqual(try entries(), ["transfers.sqlite"])

        // Reopened, it recreates them, still private; and a database file left readable is tightened.
        XCTAssertEqual(chmod(path, 0o644), 0)
        let log = try TransferLog(path: path)
        XCTAssertTrue(log.submit(.session(session("s2"))))
        log.flush()
        XCTAssertNil(log.lastWriteError)
        XCTAssertEqual(try entries(), ["transfers.sqlite", "transfers.sqlite-shm", "transfers.sqlite-wal"])
        for file in try entries() { XCTAssertEqual(try mode(nested.appendingPathComponent(file).path), 0o600, file) }
        XCTAssertEqual(try log.sessions().map(\.sessionID), ["s2", "s1"])
    }

    func testDefaultPathPrecedence() {
        let all = [
            "DRAGBROKER_STATE_DIRECTORY": "/var/lib/dragbroker",
            "XDG_STATE_HOME": "/home/u/.state",
            "HOME": "/home/u",
        ]
        XCTAssertEqual(TransferLog.defaultPath(environment: all), "/var/lib/dragbroker/transfers.sqlite")
        XCTAssertEqual(
            TransferLog.defaultPath(environment: all.merging(["DRAGBROKER_STATE_DIRECTORY": ""]) { $1 }),
            "/home/u/.state/dragbroker/transfers.sqlite")
        XCTAssertEqual(
            TransferLog.defaultPath(environment: ["XDG_STATE_HOME": "relative", "HOME": "/home/u"]),
            "/home/u/.local/state/dragbroker/transfers.sqlite")
        XCTAssertEqual(
            TransferLog.defaultPath(environment: ["HOME": "/home/u"]),
            "/home/u/.local/state/dragbroker/transfers.sqlite")
    }
}

/// Counts the transactions committed on a pool's writer connection.
private final class CommitCounter: TransactionObserver, @unchecked Sendable {
    private let lock = NSLock()
    private var commits = 0

    var count: Int { lock.withLock { commits } }

    func observes(eventsOfKind eventKind: DatabaseEventKind) -> Bool { false }
    func databaseDidChange(with event: DatabaseEvent) {}
    func databaseDidCommit(_ db: Database) { lock.withLock { commits += 1 } }
    func databaseDidRollback(_ db: Database) {}
}

/// Collects the writer's events, by name and count.
private final class EventBox: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: [String] = []

    func append(_ event: TransferLogEvent) {
        let name = switch event {
        case .writesFailing: "writesFailing"
        case .writesRecovered(let written, _): "writesRecovered \(written)"
        case .queueFull(let capacity): "queueFull \(capacity)"
        case .gapRecorded(let gap): "gapRecorded \(gap.lost)"
        case .rejected(let failure): "rejected \(failure.droppedEntries)"
        }
        lock.withLock { stored.append(name) }
    }

    var names: [String] { lock.withLock { stored } }
}

private final class AnswerBox: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: [String] = []

    func append(_ value: String) { lock.withLock { stored.append(value) } }
    var values: [String] { lock.withLock { stored } }
}

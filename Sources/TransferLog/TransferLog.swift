import Foundation
import GRDB
import SystemCalls

public enum TransferLogError: Error, Equatable, CustomStringConvertible {
    case missingDatabase(path: String)
    /// The file is not a transfer log, or was written by an incompatible version.
    case unsupportedSchema(path: String)
    /// A log opened for reading was asked to write.
    case readOnly
    /// A newer version of dragbroker wrote the log: it has migrations this one does not know.
    case newerSchema(path: String, unknownMigrations: [String])

    public var description: String {
        switch self {
        case .missingDatabase(let path):
            "no transfer log at \(path) (has dragbrokerd run yet?)"
        case .unsupportedSchema(let path):
            "\(path) is not a transfer log this version of dragbroker can read"
        case .readOnly:
            "the transfer log was opened read-only"
        case .newerSchema(let path, let unknown):
            """
            \(path) was written by a newer version of dragbroker (it has the migration\(unknown.count == 1 ? "" : "s") \
            \(unknown.joined(separator: ", ")), which this version does not know); it was left untouched. Run the newer \
            version, or move the file aside to start a new log
            """
        }
    }
}

/// The SQLite record of every drag session and data load.
public final class TransferLog: Sendable {
    public enum Entry: Sendable, Equatable {
        case session(SessionRecord)
        case load(LoadRecord)
        case refusal(RefusalRecord)
    }

    public static let defaultQueueCapacity = 10_000

    /// Internal for tests, which reach the writer connection (say, to cap the file as a full disk would).
    let pool: DatabasePool
    /// Nil for read-only logs.
    private let writer: BatchWriter?

    /// Opens (creating if needed) the log for writing in the state directory that holds
    /// `path`, and migrates it; see `init(directory:queueCapacity:onEvent:)`.
    public convenience init(
        path: String,
        queueCapacity: Int = TransferLog.defaultQueueCapacity,
        onEvent: (@Sendable (TransferLogEvent) -> Void)? = nil
    ) throws {
        let directory = try StateDirectory(path: (path as NSString).deletingLastPathComponent)
        precondition((path as NSString).lastPathComponent == Self.fileName, "the log is \(Self.fileName) in its directory")
        try self.init(directory: directory, queueCapacity: queueCapacity, onEvent: onEvent)
    }

    /// Opens (creating if needed) the log for writing and migrates it. A log that a newer
    /// version wrote is refused before anything is written to it.
    ///
    /// - Parameters:
    ///   - queueCapacity: records kept in memory while they cannot be written; past it, new
    ///     ones are counted and recorded as a gap instead.
    ///   - onEvent: called on the writer's queue, never on the submitter's; it must not call
    ///     `flush()`.
    public convenience init(
        directory: StateDirectory,
        queueCapacity: Int = TransferLog.defaultQueueCapacity,
        onEvent: (@Sendable (TransferLogEvent) -> Void)? = nil
    ) throws {
        // Session history reveals which apps the user works with: keep it private. SQLite opens
        // its files by path and follows links, so each is checked first: the directory is the
        // daemon's own (StateDirectory), so no one else can put a link there afterwards.
        let path = directory.pathOf(Self.fileName)
        for suffix in ["-wal", "-shm", "-journal"] { try directory.tighten(Self.fileName + suffix) }
        let database = try directory.openFile(Self.fileName)
        let isNew = (try? database.status().size) == 0
        database.closeQuietly()
        if isNew {
            try directory.synchronize()
        } else {
            try Self.refuseNewerSchema(path: path)
        }
        var config = Configuration()
        // Only the writer queue ever waits here, never the bus loop, so waiting
        // out a concurrent checkpoint beats dropping a batch.
        config.busyMode = .timeout(5)
        // Checkpoints run on a connection of their own, beside the writer (BatchWriter).
        config.prepareDatabase { db in try db.execute(sql: "PRAGMA wal_autocheckpoint = 0") }
        let pool = try DatabasePool(path: path, configuration: config)
        try Schema.migrator.migrate(pool)
        var checkpointing = Configuration()
        checkpointing.busyMode = .timeout(5)
        let checkpointer = try DatabaseQueue(path: path, configuration: checkpointing)
        let durability = WriteAheadSync(directory: directory, walName: Self.fileName + "-wal")
        self.init(pool: pool, writer: BatchWriter(pool: pool, checkpointer: checkpointer, durability: durability,
                                                  capacity: queueCapacity, onEvent: onEvent))
    }

    /// Reads which migrations the log has through a read-only connection, so a log this
    /// version cannot know is never written, not even its journal mode.
    static func refuseNewerSchema(path: String) throws {
        var config = Configuration()
        config.readonly = true
        let applied = try DatabaseQueue(path: path, configuration: config).read { db in
            try Schema.migrator.appliedIdentifiers(db)
        }
        let unknown = applied.subtracting(Schema.migrator.migrations).sorted()
        guard unknown.isEmpty else { throw TransferLogError.newerSchema(path: path, unknownMigrations: unknown) }
    }

    /// Opens an existing log for reading only, as `dragctl log` does while the
    /// daemon may be writing to it.
    public static func openReadOnly(path: String) throws -> TransferLog {
        guard FileManager.default.fileExists(atPath: path) else {
            throw TransferLogError.missingDatabase(path: path)
        }
        var config = Configuration()
        config.readonly = true
        let pool = try DatabasePool(path: path, configuration: config)
        let compatible = try pool.read { db in
            try Schema.migrator.hasCompletedMigrations(db)
        }
        guard compatible else { throw TransferLogError.unsupportedSchema(path: path) }
        return TransferLog(pool: pool, writer: nil)
    }

    private init(pool: DatabasePool, writer: BatchWriter?) {
        self.pool = pool
        self.writer = writer
    }

    /// Queues an entry for the background writer without touching the disk. While the log
    /// cannot be written, entries wait in memory for a retry, up to the queue's capacity.
    ///
    /// - Returns: false if the log is read-only, or the queue is at its capacity: the entry is
    ///   then counted into the next gap instead.
    @discardableResult
    public func submit(_ entry: Entry) -> Bool {
        writer?.submit(.init(entry: entry, mustCommit: false, committed: nil)) ?? false
    }

    /// Queues an entry and tells, on the writer's queue, whether the first attempt to write it
    /// committed: a caller can hold back what the entry records until it is on disk. An entry
    /// that `mustCommit` is dropped rather than kept when that attempt fails, since its caller
    /// then refuses what it would have recorded; such an entry is never counted as lost.
    ///
    /// - Returns: false if the entry was not queued (see `submit(_:)`); `committed` is then
    ///   never called.
    @discardableResult
    public func submit(_ entry: Entry, mustCommit: Bool, committed: @escaping @Sendable (Bool) -> Void) -> Bool {
        writer?.submit(.init(entry: entry, mustCommit: mustCommit, committed: committed)) ?? false
    }

    /// Brings the open record of a running load up to date with its bytes so far and their
    /// time (`endedAt`), writing it if it is not there yet, so a crash leaves them on record.
    /// Written with the next batch; only the newest per load is kept, and it is ignored once
    /// the load's end is written.
    public func checkpoint(_ open: LoadRecord) {
        guard let loadID = open.loadID else { return }
        writer?.checkpoint(.init(sessionID: open.sessionID, loadID: loadID), open)
    }

    /// Makes one attempt to write everything waiting, and returns when it is done: every entry
    /// submitted before the call is committed, or still waits because the log cannot be written
    /// (and `onEvent` was told). Do not call from the bus event loop.
    public func flush() {
        writer?.flush()
    }

    /// For a clean stop: writes everything submitted, syncs it and checkpoints the WAL into the
    /// database, so nothing committed can be lost; the log can still be read afterwards.
    public func close() throws {
        try writer?.close()
    }

    /// Whether the last attempt to write failed and records wait for a retry.
    public var isFailing: Bool {
        writer?.isFailing ?? true
    }

    /// Whether new records are being counted as lost instead of kept: the queue is at its capacity.
    public var isLosingRecords: Bool {
        writer?.isFull ?? true
    }

    /// The most recent failure to write, if any; kept until replaced.
    public var lastWriteError: (any Error)? {
        writer?.lastWriteError
    }

    // MARK: After a crash

    /// What `closeOpenRecords` found: records left open by a daemon that never ended them.
    public struct Recovery: Sendable, Equatable {
        public var sessions = 0
        public var loads = 0
        /// Records whose end is their last checkpoint (for a session, its drop or its loads'
        /// last checkpoint), and records that had none, which end at their start.
        public var endedAtCheckpoint = 0
        public var endedAtStart = 0
    }

    /// A load a daemon was running when it died, as it kept it beside the log: the load's and
    /// its session's open records, as of the load's last checkpoint.
    public struct InFlight: Sendable, Equatable {
        public var session: SessionRecord
        public var load: LoadRecord

        public init(session: SessionRecord, load: LoadRecord) {
            self.session = session
            self.load = load
        }
    }

    /// Closes every session and load left open, as a daemon that died leaves them, with the
    /// outcome "interrupted" and `errorName`: each ends at the latest time it was known alive,
    /// its last checkpoint, else its start. `inFlight` adds the loads the daemon kept beside
    /// the log, which may be newer than their rows or have none yet. Call before the daemon
    /// records anything itself.
    public func closeOpenRecords(errorName: String, inFlight: [InFlight] = []) throws -> Recovery {
        try pool.write { db in
            let open = LoadRecord.open
            var recovery = Recovery()
            for left in inFlight {
                let session = left.session
                try db.execute(sql: """
                    INSERT INTO session (sessionID, kind, sourceApp, destinationApp, itemCount, operation, outcome, startedAt, endedAt)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT(sessionID) DO UPDATE SET destinationApp = COALESCE(session.destinationApp, excluded.destinationApp)
                        WHERE session.outcome = excluded.outcome
                    """, arguments: [session.sessionID, session.kind, session.sourceApp, session.destinationApp, session.itemCount,
                                     session.operation, open, MicrosecondTimestamp.microseconds(session.startedAt),
                                     MicrosecondTimestamp.microseconds(session.endedAt)])
                let load = left.load
                try db.execute(sql: """
                    INSERT INTO load (sessionID, loadID, sourceApp, destinationApp, typeIdentifier, bytes, startedAt, endedAt,
                                      outcome, sourceTeam, destinationTeam)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT(sessionID, loadID) DO UPDATE SET bytes = MAX(load.bytes, excluded.bytes),
                        endedAt = MAX(load.endedAt, excluded.endedAt)
                        WHERE load.outcome = excluded.outcome
                    """, arguments: [load.sessionID, load.loadID, load.sourceApp, load.destinationApp, load.typeIdentifier, load.bytes,
                                     MicrosecondTimestamp.microseconds(load.startedAt), MicrosecondTimestamp.microseconds(load.endedAt),
                                     open, load.sourceTeam, load.destinationTeam])
            }
            // A session was alive at least as long as any of its loads.
            try db.execute(sql: """
                UPDATE session SET endedAt = MAX(endedAt, COALESCE((SELECT MAX(load.endedAt) FROM load
                    WHERE load.sessionID = session.sessionID), endedAt))
                WHERE outcome = ?
                """, arguments: [open])
            for table in ["session", "load"] {
                let row = try Row.fetchOne(db, sql: """
                    SELECT COUNT(*) AS n, COALESCE(SUM(endedAt > startedAt), 0) AS later FROM \(table) WHERE outcome = ?
                    """, arguments: [open])
                let count: Int = row?["n"] ?? 0
                let later: Int = row?["later"] ?? 0
                if table == "session" { recovery.sessions = count } else { recovery.loads = count }
                recovery.endedAtCheckpoint += later
                recovery.endedAtStart += count - later
                try db.execute(sql: "UPDATE \(table) SET outcome = ?, errorName = ? WHERE outcome = ?",
                               arguments: [LoadRecord.interrupted, errorName, open])
            }
            return recovery
        }
    }

    /// `closeOpenRecords(errorName:inFlight:)` on the writer's queue, reported there.
    public func closeOpenRecords(errorName: String, inFlight: [InFlight],
                                 then report: @escaping @Sendable (Result<Recovery, any Error>) -> Void) {
        onWriterQueue({ try self.closeOpenRecords(errorName: errorName, inFlight: inFlight) }, then: report)
    }

    /// Runs `body` on the writer's queue, after every entry submitted before it, and reports
    /// there; a read-only log reports `TransferLogError.readOnly` at once, on the caller's thread.
    private func onWriterQueue<T>(_ body: @escaping @Sendable () throws -> T, then report: @escaping @Sendable (Result<T, any Error>) -> Void) {
        guard let writer else { return report(.failure(TransferLogError.readOnly)) }
        writer.perform { report(Result { try body() }) }
    }

    // MARK: Reading

    /// Gaps in the log, newest first.
    public func gaps(limit: Int = 100) throws -> [GapRecord] {
        try pool.read { db in
            try GapRecord.order(Column("lastLostAt").desc, Column("id").desc).limit(limit).fetchAll(db)
        }
    }

    /// How many records the log is known to be missing, over every gap.
    public func lostRecords() throws -> Int64 {
        try pool.read { db in try Int64.fetchOne(db, sql: "SELECT COALESCE(SUM(lost), 0) FROM gap") ?? 0 }
    }

    /// Newest first.
    ///
    /// - Parameter includingOpen: also sessions still running, or left open by a crash the
    ///   daemon has not yet recovered from; by default only those that ended.
    public func sessions(limit: Int = 100, includingOpen: Bool = false) throws -> [SessionRecord] {
        try pool.read { db in
            try SessionRecord
                .filter(includingOpen || Column("outcome") != SessionRecord.open)
                .order(Column("startedAt").desc, Column("sessionID").desc)
                .limit(limit)
                .fetchAll(db)
        }
    }

    /// What the log holds of session IDs of the form `<prefix>N`.
    public struct SessionNumbering: Sendable, Equatable {
        /// The highest N up to the ceiling asked for; 0 when there is none.
        public var highest: Int64
        /// IDs past the ceiling: no daemon hands those out, so they are damage, and ignored.
        public var outOfRange: Int

        public init(highest: Int64, outOfRange: Int) {
            self.highest = highest
            self.outOfRange = outOfRange
        }
    }

    /// The prefix of every session ID the daemon hands out (`s1`, `s2`, …).
    public static let sessionIDPrefix = "s"
    /// The highest session number any daemon hands out: 2^53 − 1, the largest every JSON and
    /// JavaScript client reads exactly.
    public static let sessionNumberCeiling: Int64 = (1 << 53) - 1
    static let highestPrunedKey = "highestPrunedSessionNumber"

    /// The numbers of session IDs of the form `<prefix>N`, as `n`, from both tables (loads are
    /// logged before their session); arguments: prefix, then `condition`'s, for each table.
    static func sessionNumbersSQL(prefix: String = sessionIDPrefix, where condition: String = "1") -> String {
        let start = prefix.utf8.count + 1
        return """
            SELECT CAST(substr(sessionID, \(start)) AS INTEGER) AS n FROM session WHERE sessionID LIKE ? || '%' AND \(condition)
            UNION ALL
            SELECT CAST(substr(sessionID, \(start)) AS INTEGER) AS n FROM load WHERE sessionID LIKE ? || '%' AND \(condition)
            """
    }

    /// The highest N among session IDs of the form `<prefix>N` in either table, or deleted by
    /// retention, so a restarted daemon never reuses an ID the log holds or held. Numbers past
    /// `ceiling` (SQLite reads any longer run of digits as its largest integer) are counted apart.
    public func sessionNumbering(prefix: String, ceiling: Int64) throws -> SessionNumbering {
        try pool.read { db in
            let sql = """
                SELECT COALESCE(MAX(CASE WHEN n <= ? THEN n END), 0), COALESCE(SUM(n > ?), 0) FROM (\(Self.sessionNumbersSQL(prefix: prefix)))
                """
            let row = try Row.fetchOne(db, sql: sql, arguments: [ceiling, ceiling, prefix, prefix])
            var highest: Int64 = row?[0] ?? 0
            let outOfRange: Int = row?[1] ?? 0
            if prefix == Self.sessionIDPrefix,
               let pruned = try Int64.fetchOne(db, sql: "SELECT value FROM logState WHERE key = ?", arguments: [Self.highestPrunedKey]),
               pruned <= ceiling {
                highest = max(highest, pruned)
            }
            return SessionNumbering(highest: max(0, highest), outOfRange: outOfRange)
        }
    }

    /// Records that the log is missing `lost` records, for `reason`: a gap from its newest record
    /// to now. On the writer's queue, after every entry submitted before it.
    public func recordGap(lost: Int64, reason: String, then report: @escaping @Sendable (Result<GapRecord, any Error>) -> Void) {
        onWriterQueue({
            try self.pool.write { db in
                let newest = try Int64.fetchOne(db, sql: "SELECT MAX(t) FROM (SELECT MAX(endedAt) AS t FROM session UNION ALL SELECT MAX(endedAt) FROM load)")
                let now = Date()
                var gap = GapRecord(recordedAt: now, firstLostAt: newest.map(MicrosecondTimestamp.date) ?? now, lastLostAt: now,
                                    lost: lost, reason: reason)
                try gap.insert(db)
                return gap
            }
        }, then: report)
    }

    /// Deletes records that ended before `cutoff` on the writer's queue, after every entry
    /// submitted before it, and reports how many went there: the caller never waits for SQLite.
    /// A read-only log reports `TransferLogError.readOnly` at once, on the caller's thread.
    public func prune(endedBefore cutoff: Date, then report: @escaping @Sendable (Result<Int, any Error>) -> Void) {
        onWriterQueue({ try self.prune(endedBefore: cutoff) }, then: report)
    }

    /// `sessionNumbering(prefix:ceiling:)`, read and reported on the writer's queue after every
    /// entry submitted before it; a read-only log has no writer, so it reads and reports on the
    /// caller's thread.
    public func sessionNumbering(prefix: String, ceiling: Int64, then report: @escaping @Sendable (Result<SessionNumbering, any Error>) -> Void) {
        let read: @Sendable () throws -> SessionNumbering = { try self.sessionNumbering(prefix: prefix, ceiling: ceiling) }
        guard writer != nil else { return report(Result(catching: read)) }
        onWriterQueue(read, then: report)
    }

    /// Deletes records that ended before `cutoff`; returns how many went. Open records stay,
    /// however old their start: they have not ended.
    @discardableResult
    public func prune(endedBefore cutoff: Date) throws -> Int {
        let micros = Int64((cutoff.timeIntervalSince1970 * 1_000_000).rounded())
        return try pool.write { db in
            // The highest number about to go is kept, so numbering never falls back below it.
            try db.execute(sql: """
                INSERT INTO logState (key, value)
                SELECT ?, MAX(n) FROM (\(Self.sessionNumbersSQL(where: "endedAt < ? AND outcome != ?"))) WHERE n <= ?
                HAVING MAX(n) IS NOT NULL
                ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)
                """, arguments: [Self.highestPrunedKey, Self.sessionIDPrefix, micros, SessionRecord.open,
                                 Self.sessionIDPrefix, micros, LoadRecord.open, Self.sessionNumberCeiling])
            try db.execute(sql: "DELETE FROM session WHERE endedAt < ? AND outcome != ?", arguments: [micros, SessionRecord.open])
            var removed = db.changesCount
            try db.execute(sql: "DELETE FROM load WHERE endedAt < ? AND outcome != ?", arguments: [micros, LoadRecord.open])
            removed += db.changesCount
            try db.execute(sql: "DELETE FROM refusal WHERE at < ?", arguments: [micros])
            removed += db.changesCount
            try db.execute(sql: "DELETE FROM gap WHERE lastLostAt < ?", arguments: [micros])
            return removed + db.changesCount
        }
    }

    /// One line of `stats`: a key (app, type or outcome) with its load count and bytes.
    public struct Total: Sendable, Equatable, Codable {
        public var key: String
        public var loads: Int
        public var bytes: Int64
    }

    /// Load totals grouped by `column` (sourceApp, destinationApp, typeIdentifier, outcome),
    /// largest byte count first.
    /// `column` is "sourceApp", "destinationApp", "typeIdentifier", "outcome", or "channel":
    /// "drag" or "paste", told by the load's session ID (`SessionRecord.kind(ofSessionWithLoads:)`).
    public func totals(by column: String) throws -> [Total] {
        precondition(["sourceApp", "destinationApp", "typeIdentifier", "outcome", "channel"].contains(column))
        let key = column == "channel" ? "CASE WHEN instr(sessionID, '_') > 0 THEN 'paste' ELSE 'drag' END" : column
        return try pool.read { db in
            try Row.fetchAll(db, sql: "SELECT \(key) AS key, COUNT(*) AS loads, SUM(bytes) AS bytes FROM load GROUP BY 1 ORDER BY bytes DESC, key")
                .map { Total(key: $0["key"], loads: $0["loads"], bytes: $0["bytes"]) }
        }
    }

    /// Newest first.
    public func refusals(limit: Int = 100) throws -> [RefusalRecord] {
        try pool.read { db in
            try RefusalRecord.order(Column("at").desc, Column("id").desc).limit(limit).fetchAll(db)
        }
    }

    /// Which refusals `dragctl refusals` shows; nil fields match everything. `app` is the
    /// refused caller's, `type` the subject it asked for, `action` the bus method refused
    /// (e.g. `Load`) and `errorName` the full D-Bus error name it was answered with.
    public struct RefusalFilter: Sendable {
        public var since: Date?
        public var until: Date?
        public var app: String?
        public var type: String?
        public var action: String?
        public var errorName: String?
        public init(since: Date? = nil, until: Date? = nil, app: String? = nil, type: String? = nil, action: String? = nil,
                    errorName: String? = nil) {
            self.since = since
            self.until = until
            self.app = app
            self.type = type
            self.action = action
            self.errorName = errorName
        }
    }

    /// Newest first, filtered.
    public func refusals(limit: Int, filter: RefusalFilter) throws -> [RefusalRecord] {
        try pool.read { db in
            var request = RefusalRecord.all()
            if let since = filter.since { request = request.filter(Column("at") >= MicrosecondTimestamp.microseconds(since)) }
            if let until = filter.until { request = request.filter(Column("at") <= MicrosecondTimestamp.microseconds(until)) }
            if let app = filter.app { request = request.filter(Column("app") == app) }
            if let type = filter.type { request = request.filter(Column("subject") == type) }
            if let action = filter.action { request = request.filter(Column("action") == action) }
            if let errorName = filter.errorName { request = request.filter(Column("errorName") == errorName) }
            return try request.order(Column("at").desc, Column("id").desc).limit(limit).fetchAll(db)
        }
    }

    /// Which loads `dragctl log` shows; nil fields match everything. An app or team matches
    /// either end of the transfer.
    public struct LoadFilter: Sendable {
        public var since: Date?
        public var until: Date?
        public var app: String?
        public var team: String?
        public var type: String?
        public var outcome: String?
        public init(since: Date? = nil, until: Date? = nil, app: String? = nil, team: String? = nil, type: String? = nil, outcome: String? = nil) {
            self.since = since
            self.until = until
            self.app = app
            self.team = team
            self.type = type
            self.outcome = outcome
        }
    }

    /// Newest first, filtered; loads still running (outcome "open") are listed too.
    public func loads(limit: Int, filter: LoadFilter) throws -> [LoadRecord] {
        try pool.read { db in
            var request = LoadRecord.all()
            if let since = filter.since { request = request.filter(Column("startedAt") >= MicrosecondTimestamp.microseconds(since)) }
            if let until = filter.until { request = request.filter(Column("startedAt") <= MicrosecondTimestamp.microseconds(until)) }
            if let app = filter.app { request = request.filter(Column("sourceApp") == app || Column("destinationApp") == app) }
            if let team = filter.team { request = request.filter(Column("sourceTeam") == team || Column("destinationTeam") == team) }
            if let type = filter.type { request = request.filter(Column("typeIdentifier") == type) }
            if let outcome = filter.outcome { request = request.filter(Column("outcome") == outcome) }
            return try request.order(Column("startedAt").desc, Column("id").desc).limit(limit).fetchAll(db)
        }
    }

    /// Newest first, optionally restricted to one session.
    ///
    /// - Parameter includingOpen: also loads still running (with their last checkpoint), or
    ///   left open by a crash the daemon has not yet recovered from; by default only those that
    ///   ended, whose records are final.
    public func loads(limit: Int = 100, sessionID: String? = nil, includingOpen: Bool = false) throws -> [LoadRecord] {
        try pool.read { db in
            var request = LoadRecord.filter(includingOpen || Column("outcome") != LoadRecord.open)
            if let sessionID {
                request = request.filter(Column("sessionID") == sessionID)
            }
            return try request
                .order(Column("startedAt").desc, Column("id").desc)
                .limit(limit)
                .fetchAll(db)
        }
    }
}

extension TransferLog {
    public static let fileName = "transfers.sqlite"

    /// Whether SQLite found the file damaged, or not a database at all.
    public static func meansDamagedFile(_ error: any Error) -> Bool {
        guard let error = error as? DatabaseError else { return false }
        return error.resultCode == .SQLITE_CORRUPT || error.resultCode == .SQLITE_NOTADB
    }

    /// The log's path in a given state directory (`--state-directory`, `$STATE_DIRECTORY`).
    public static func path(inStateDirectory directory: String) -> String {
        (directory as NSString).appendingPathComponent(fileName)
    }

    /// Where the log is when nothing names its directory: `$DRAGBROKER_STATE_DIRECTORY` (how
    /// dragctl is pointed at another daemon's log), then `$XDG_STATE_HOME/dragbroker`, then
    /// `~/.local/state/dragbroker`. The daemon asks systemd's `$STATE_DIRECTORY` first.
    public static func defaultPath(
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> String {
        if let directory = environment["DRAGBROKER_STATE_DIRECTORY"], !directory.isEmpty {
            return path(inStateDirectory: directory)
        }
        // The XDG spec says to ignore relative values.
        if let stateHome = environment["XDG_STATE_HOME"], stateHome.hasPrefix("/") {
            return ((stateHome as NSString).appendingPathComponent("dragbroker") as NSString)
                .appendingPathComponent(fileName)
        }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
        return NSString.path(withComponents: [home, ".local", "state", "dragbroker", fileName])
    }
}

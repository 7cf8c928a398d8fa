import Foundation
import GRDB

public enum TransferLogError: Error, Equatable, CustomStringConvertible {
    case missingDatabase(path: String)
    /// The file is not a transfer log, or was written by an incompatible version.
    case unsupportedSchema(path: String)
    /// A log opened for reading was asked to write.
    case readOnly
    /// The log's directory or one of its files could not be created or made private
    /// (`call` failed with `errno`).
    case notPrivate(path: String, call: String, errno: Int32)

    public var description: String {
        switch self {
        case .missingDatabase(let path):
            "no transfer log at \(path) (has dragbrokerd run yet?)"
        case .unsupportedSchema(let path):
            "\(path) is not a transfer log this version of dragbroker can read"
        case .readOnly:
            "the transfer log was opened read-only"
        case .notPrivate(let path, let call, let errno):
            "cannot keep \(path) private: \(call) failed: \(String(cString: strerror(errno)))"
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

    private let pool: DatabasePool
    /// Nil for read-only logs.
    private let writer: BatchWriter?

    /// Opens (creating if needed) the log for writing and migrates it.
    ///
    /// - Parameters:
    ///   - queueCapacity: entries held in memory before `submit` starts refusing.
    ///   - onWriteError: called on the writer's queue, never on the submitter's;
    ///     it must not call `flush()`.
    public convenience init(
        path: String,
        queueCapacity: Int = TransferLog.defaultQueueCapacity,
        onWriteError: (@Sendable (any Error) -> Void)? = nil
    ) throws {
        // Session history reveals which apps the user works with: keep it private.
        try Self.createPrivately(path: path)
        var config = Configuration()
        // Only the writer queue ever waits here, never the bus loop, so waiting
        // out a concurrent checkpoint beats dropping a batch.
        config.busyMode = .timeout(5)
        let pool = try DatabasePool(path: path, configuration: config)
        try Schema.migrator.migrate(pool)
        self.init(pool: pool, writer: BatchWriter(pool: pool, capacity: queueCapacity, onError: onWriteError))
    }

    /// Makes the log's missing directories 0700 and its files 0600, whatever the process umask.
    ///
    /// Why no umask: SQLite's unix VFS creates the database file with 0644 less the umask, but
    /// its -wal, -shm and -journal files with the database file's own mode, and fchmods each
    /// new one to exactly that mode whatever the umask (`findCreateFileMode`, `robust_open`,
    /// `unixOpenSharedMemory`). So creating the database file 0600 before SQLite first opens it
    /// covers every file SQLite creates later too, such as the -wal it recreates when the log is
    /// reopened after its last connection closed, in any process that opens the log, without
    /// changing a process-wide setting that every other file the process creates would inherit.
    /// Files an older version left readable by others are tightened here. Directories that
    /// already exist are left alone: `--state-directory` may name one that is not only ours.
    /// Mode 0700/0600 at mkdir/open time leaves no moment when a permissive umask lets others in;
    /// the chmod after it only restores owner bits a strange umask (say 0o200) took away.
    static func createPrivately(path: String) throws {
        func check(_ result: Int32, _ call: String, _ target: String, allowing allowed: Int32? = nil) throws {
            guard result != 0 else { return }
            let error = errno
            if error == allowed { return }
            throw TransferLogError.notPrivate(path: target, call: call, errno: error)
        }
        var missing: [String] = []
        var directory = (path as NSString).deletingLastPathComponent
        while !directory.isEmpty, directory != "/", !FileManager.default.fileExists(atPath: directory) {
            missing.append(directory)
            directory = (directory as NSString).deletingLastPathComponent
        }
        for directory in missing.reversed() {
            try check(mkdir(directory, 0o700), "mkdir", directory, allowing: EEXIST)
            try check(chmod(directory, 0o700), "chmod", directory)
        }
        let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        if descriptor >= 0 { close(descriptor) } else { try check(-1, "open", path, allowing: EEXIST) }
        try check(chmod(path, 0o600), "chmod", path)
        for suffix in ["-wal", "-shm", "-journal"] {
            try check(chmod(path + suffix, 0o600), "chmod", path + suffix, allowing: ENOENT)
        }
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

    /// Queues an entry for the background writer without touching the disk.
    ///
    /// - Returns: false if the queue is full or the log is read-only; the entry
    ///   is then not recorded.
    @discardableResult
    public func submit(_ entry: Entry) -> Bool {
        writer?.submit(entry) ?? false
    }

    /// Blocks until every entry submitted before the call is committed (or has
    /// failed and been reported). Do not call from the bus event loop.
    public func flush() {
        writer?.flush()
    }

    /// Whether records are being lost right now: the last batch failed, or the queue is full.
    public var isFailing: Bool {
        guard let writer else { return true }
        return writer.isFailing || writer.isFull
    }

    /// The most recent failure to write a batch, if any; kept until replaced.
    public var lastWriteError: (any Error)? {
        writer?.lastWriteError
    }

    /// Newest first.
    public func sessions(limit: Int = 100) throws -> [SessionRecord] {
        try pool.read { db in
            try SessionRecord
                .order(Column("startedAt").desc, Column("sessionID").desc)
                .limit(limit)
                .fetchAll(db)
        }
    }

    /// The highest N among session IDs of the form `<prefix>N` in either table, so a restarted
    /// daemon never reuses an ID the log already holds (loads are logged before their session).
    public func highestSessionNumber(prefix: String) throws -> Int {
        try pool.read { db in
            let start = prefix.count + 1
            let sql = """
                SELECT MAX(n) FROM (
                    SELECT CAST(substr(sessionID, \(start)) AS INTEGER) AS n FROM session WHERE sessionID LIKE ? || '%'
                    UNION ALL
                    SELECT CAST(substr(sessionID, \(start)) AS INTEGER) AS n FROM load WHERE sessionID LIKE ? || '%')
                """
            return try Int.fetchOne(db, sql: sql, arguments: [prefix, prefix]) ?? 0
        }
    }

    /// Deletes records that ended before `cutoff` on the writer's queue, after every entry
    /// submitted before it, and reports how many went there: the caller never waits for SQLite.
    /// A read-only log reports `TransferLogError.readOnly` at once, on the caller's thread.
    public func prune(endedBefore cutoff: Date, then report: @escaping @Sendable (Result<Int, any Error>) -> Void) {
        guard let writer else { return report(.failure(TransferLogError.readOnly)) }
        writer.perform { report(Result { try self.prune(endedBefore: cutoff) }) }
    }

    /// The highest session number (see `highestSessionNumber(prefix:)`), read and reported on
    /// the writer's queue after every entry submitted before it; a read-only log has no writer,
    /// so it reads and reports on the caller's thread.
    public func highestSessionNumber(prefix: String, then report: @escaping @Sendable (Result<Int, any Error>) -> Void) {
        guard let writer else { return report(Result { try self.highestSessionNumber(prefix: prefix) }) }
        writer.perform { report(Result { try self.highestSessionNumber(prefix: prefix) }) }
    }

    /// Deletes records that ended before `cutoff`; returns how many went.
    @discardableResult
    public func prune(endedBefore cutoff: Date) throws -> Int {
        let micros = Int64((cutoff.timeIntervalSince1970 * 1_000_000).rounded())
        return try pool.write { db in
            try db.execute(sql: "DELETE FROM session WHERE endedAt < ?", arguments: [micros])
            var removed = db.changesCount
            try db.execute(sql: "DELETE FROM load WHERE endedAt < ?", arguments: [micros])
            removed += db.changesCount
            try db.execute(sql: "DELETE FROM refusal WHERE at < ?", arguments: [micros])
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
    public func totals(by column: String) throws -> [Total] {
        precondition(["sourceApp", "destinationApp", "typeIdentifier", "outcome"].contains(column))
        return try pool.read { db in
            try Row.fetchAll(db, sql: "SELECT \(column) AS key, COUNT(*) AS loads, SUM(bytes) AS bytes FROM load GROUP BY \(column) ORDER BY bytes DESC, key")
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

    /// Newest first, filtered.
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
    public func loads(limit: Int = 100, sessionID: String? = nil) throws -> [LoadRecord] {
        try pool.read { db in
            var request = LoadRecord.all()
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

    /// The log's path in a given state directory (`--state-directory`, `$STATE_DIRECTORY`).
    public static func path(inStateDirectory directory: String) -> String {
        (directory as NSString).appendingPathComponent(fileName)
    }

    /// Where the daemon keeps its log: `$DRAGBROKER_STATE_DIRECTORY` (e.g. set
    /// from systemd's `StateDirectory=`), then the XDG state directory.
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

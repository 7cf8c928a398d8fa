import Foundation
import GRDB

/// One session: a drag, a pasteboard entry or a paste of one. Written with the outcome "open"
/// when it begins, brought up to date at the drop, and completed in place when it ends. While
/// it is open, `endedAt` is the latest time the session was known to be alive.
public struct SessionRecord: Sendable, Codable, Equatable, MicrosecondDatedRecord, PersistableRecord {
    public static let databaseTableName = "session"

    public var sessionID: String
    /// "drag", "copy" (an entry on the pasteboard) or "paste" (one paste of an entry).
    public var kind: String
    public var sourceApp: String
    public var destinationApp: String?
    public var itemCount: Int
    /// "cancel", "copy", "move" or "forbidden".
    public var operation: String
    /// Free text chosen by the daemon, e.g. "completed", "cancelled", "source-disconnected";
    /// "open" while it runs, "interrupted" when the daemon died before it ended.
    public var outcome: String
    public var errorName: String?
    public var startedAt: Date
    public var endedAt: Date

    public static let open = "open"
    public static let interrupted = "interrupted"

    /// The kind of a session that had loads, from its ID alone: only drags and pastes have
    /// loads, and a paste's ID is its entry's, "_" and its number (`s12_3`). What a record
    /// rebuilt from a load after a crash is.
    public static func kind(ofSessionWithLoads sessionID: String) -> String {
        sessionID.contains("_") ? "paste" : "drag"
    }

    /// The channel data of a session of `kind` moves through, as flow rules and the journal name it.
    public static func channel(ofKind kind: String) -> String { kind == "drag" ? "drag" : "paste" }

    public var channel: String { Self.channel(ofKind: kind) }

    public init(
        sessionID: String, kind: String? = nil, sourceApp: String, destinationApp: String?, itemCount: Int,
        operation: String, outcome: String, errorName: String? = nil,
        startedAt: Date, endedAt: Date
    ) {
        self.sessionID = sessionID
        self.kind = kind ?? Self.kind(ofSessionWithLoads: sessionID)
        self.sourceApp = sourceApp
        self.destinationApp = destinationApp
        self.itemCount = itemCount
        self.operation = operation
        self.outcome = outcome
        self.errorName = errorName
        self.startedAt = startedAt
        self.endedAt = endedAt
    }
}

/// One data transfer from a source to a destination within a session: written with the outcome
/// "open" when it starts, its bytes checkpointed while it runs, and completed in place when it
/// ends. While it is open, `bytes` and `endedAt` are those of its last checkpoint (at first, its
/// start).
public struct LoadRecord: Sendable, Codable, Equatable, MicrosecondDatedRecord, PersistableRecord {
    public static let databaseTableName = "load"

    /// The channel its bytes moved through, from its session's ID.
    public var channel: String { SessionRecord.channel(ofKind: SessionRecord.kind(ofSessionWithLoads: sessionID)) }

    /// Assigned by SQLite; nil until the record has been written.
    public var id: Int64?
    public var sessionID: String
    /// The load's number within its session, as the bus names it; with `sessionID` it finds the
    /// row a load's end completes. Nil in records from before write-ahead auditing.
    public var loadID: Int64?
    public var sourceApp: String
    public var destinationApp: String
    public var typeIdentifier: String
    public var bytes: Int64
    public var startedAt: Date
    public var endedAt: Date
    /// Free text chosen by the daemon, e.g. "completed", "failed", "cancelled"; "open" while
    /// it runs, "interrupted" when the daemon died before it ended.
    public var outcome: String
    public var errorName: String?
    public var sourceTeam: String?
    public var destinationTeam: String?

    public static let open = SessionRecord.open
    public static let interrupted = SessionRecord.interrupted

    public init(
        id: Int64? = nil, sessionID: String, loadID: Int64? = nil, sourceApp: String, destinationApp: String,
        typeIdentifier: String, bytes: Int64, startedAt: Date, endedAt: Date,
        outcome: String, errorName: String? = nil, sourceTeam: String? = nil, destinationTeam: String? = nil
    ) {
        self.sourceTeam = sourceTeam
        self.destinationTeam = destinationTeam
        self.id = id
        self.sessionID = sessionID
        self.loadID = loadID
        self.sourceApp = sourceApp
        self.destinationApp = destinationApp
        self.typeIdentifier = typeIdentifier
        self.bytes = bytes
        self.startedAt = startedAt
        self.endedAt = endedAt
        self.outcome = outcome
        self.errorName = errorName
    }
}

/// One refused request: who asked (as the daemon identified it), for what, and why, with
/// the policy rule (`file:line`) when a rule decided.
public struct RefusalRecord: Codable, Equatable, Sendable, MicrosecondDatedRecord, MutablePersistableRecord {
    public static let databaseTableName = "refusal"

    public var id: Int64?
    public var at: Date
    public var app: String
    public var uid: Int64
    public var pid: Int64
    /// The bus method refused, e.g. `Load`.
    public var action: String
    public var sessionID: String?
    /// What was asked for, e.g. the type of a load.
    public var subject: String?
    public var errorName: String
    public var message: String
    public var rule: String?

    public init(id: Int64? = nil, at: Date, app: String, uid: Int64, pid: Int64, action: String, sessionID: String?,
                subject: String?, errorName: String, message: String, rule: String?) {
        self.id = id
        self.at = at
        self.app = app
        self.uid = uid
        self.pid = pid
        self.action = action
        self.sessionID = sessionID
        self.subject = subject
        self.errorName = errorName
        self.message = message
        self.rule = rule
    }

    public mutating func didInsert(_ inserted: InsertionSuccess) {
        id = inserted.rowID
    }
}

/// Records the log could not keep, counted instead: written as soon as the log can take a
/// row again, so a reader knows the log is incomplete, when, by how much, and why.
public struct GapRecord: Codable, Equatable, Sendable, MicrosecondDatedRecord, MutablePersistableRecord {
    public static let databaseTableName = "gap"

    public var id: Int64?
    /// When the gap itself was written.
    public var recordedAt: Date
    public var firstLostAt: Date
    public var lastLostAt: Date
    /// How many records were lost.
    public var lost: Int64
    public var reason: String

    public init(id: Int64? = nil, recordedAt: Date, firstLostAt: Date, lastLostAt: Date, lost: Int64, reason: String) {
        self.id = id
        self.recordedAt = recordedAt
        self.firstLostAt = firstLostAt
        self.lastLostAt = lastLostAt
        self.lost = lost
        self.reason = reason
    }

    public mutating func didInsert(_ inserted: InsertionSuccess) {
        id = inserted.rowID
    }
}

/// A record whose dates are stored as `MicrosecondTimestamp`s.
public protocol MicrosecondDatedRecord: FetchableRecord, EncodableRecord {}

extension MicrosecondDatedRecord {
    public static func databaseDateEncodingStrategy(for column: String) -> DatabaseDateEncodingStrategy {
        MicrosecondTimestamp.encoding
    }

    public static func databaseDateDecodingStrategy(for column: String) -> DatabaseDateDecodingStrategy {
        MicrosecondTimestamp.decoding
    }
}

/// GRDB's default text dates keep only milliseconds, and floating-point seconds
/// do not round-trip exactly; integer microseconds since 1970 do both and sort
/// numerically.
public enum MicrosecondTimestamp {
    /// Clamped to Int64's range (NaN to 0): a date read from a damaged file must not trap.
    public static func microseconds(_ date: Date) -> Int64 {
        let value = (date.timeIntervalSince1970 * 1_000_000).rounded()
        guard !value.isNaN else { return 0 }
        // Int64.max is not a Double: 2^63 is the first value past it.
        guard value < 9_223_372_036_854_775_808.0 else { return .max }
        guard value >= -9_223_372_036_854_775_808.0 else { return .min }
        return Int64(value)
    }

    public static func date(_ microseconds: Int64) -> Date {
        Date(timeIntervalSince1970: Double(microseconds) / 1_000_000)
    }

    static let encoding = DatabaseDateEncodingStrategy.custom { microseconds($0) }

    static let decoding = DatabaseDateDecodingStrategy.custom { value in
        Int64.fromDatabaseValue(value).map(date)
    }
}

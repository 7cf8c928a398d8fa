import Foundation
import GRDB

/// One drag session, written once when the session ends.
public struct SessionRecord: Sendable, Codable, Equatable, FetchableRecord, PersistableRecord {
    public static let databaseTableName = "session"

    public var sessionID: String
    public var sourceApp: String
    public var destinationApp: String?
    public var itemCount: Int
    /// "cancel", "copy", "move" or "forbidden".
    public var operation: String
    /// Free text chosen by the daemon, e.g. "completed", "cancelled", "source-disconnected".
    public var outcome: String
    public var errorName: String?
    public var startedAt: Date
    public var endedAt: Date

    public init(
        sessionID: String, sourceApp: String, destinationApp: String?, itemCount: Int,
        operation: String, outcome: String, errorName: String? = nil,
        startedAt: Date, endedAt: Date
    ) {
        self.sessionID = sessionID
        self.sourceApp = sourceApp
        self.destinationApp = destinationApp
        self.itemCount = itemCount
        self.operation = operation
        self.outcome = outcome
        self.errorName = errorName
        self.startedAt = startedAt
        self.endedAt = endedAt
    }

    public static func databaseDateEncodingStrategy(for column: String) -> DatabaseDateEncodingStrategy {
        MicrosecondTimestamp.encoding
    }

    public static func databaseDateDecodingStrategy(for column: String) -> DatabaseDateDecodingStrategy {
        MicrosecondTimestamp.decoding
    }
}

/// One data transfer from a source to a destination within a session.
public struct LoadRecord: Sendable, Codable, Equatable, FetchableRecord, PersistableRecord {
    public static let databaseTableName = "load"

    /// Assigned by SQLite; nil until the record has been written.
    public var id: Int64?
    public var sessionID: String
    public var sourceApp: String
    public var destinationApp: String
    public var typeIdentifier: String
    public var bytes: Int64
    public var startedAt: Date
    public var endedAt: Date
    /// Free text chosen by the daemon, e.g. "completed", "failed", "cancelled".
    public var outcome: String
    public var errorName: String?
    public var sourceTeam: String?
    public var destinationTeam: String?

    public init(
        id: Int64? = nil, sessionID: String, sourceApp: String, destinationApp: String,
        typeIdentifier: String, bytes: Int64, startedAt: Date, endedAt: Date,
        outcome: String, errorName: String? = nil, sourceTeam: String? = nil, destinationTeam: String? = nil
    ) {
        self.sourceTeam = sourceTeam
        self.destinationTeam = destinationTeam
        self.id = id
        self.sessionID = sessionID
        self.sourceApp = sourceApp
        self.destinationApp = destinationApp
        self.typeIdentifier = typeIdentifier
        self.bytes = bytes
        self.startedAt = startedAt
        self.endedAt = endedAt
        self.outcome = outcome
        self.errorName = errorName
    }

    public static func databaseDateEncodingStrategy(for column: String) -> DatabaseDateEncodingStrategy {
        MicrosecondTimestamp.encoding
    }

    public static func databaseDateDecodingStrategy(for column: String) -> DatabaseDateDecodingStrategy {
        MicrosecondTimestamp.decoding
    }
}

/// One refused request: who asked (as the daemon identified it), for what, and why, with
/// the policy rule (`file:line`) when a rule decided.
public struct RefusalRecord: Codable, Equatable, Sendable, FetchableRecord, MutablePersistableRecord {
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
enum MicrosecondTimestamp {
    static func microseconds(_ date: Date) -> Int64 {
        Int64((date.timeIntervalSince1970 * 1_000_000).rounded())
    }

    static let encoding = DatabaseDateEncodingStrategy.custom { microseconds($0) }

    static let decoding = DatabaseDateDecodingStrategy.custom { value in
        Int64.fromDatabaseValue(value).map { Date(timeIntervalSince1970: Double($0) / 1_000_000) }
    }
}

import BusKit
import TransferLog

/// The audit trail in the journal, beside SQLite: one entry per load, per session, per refusal and per gap, with
/// fixed MESSAGE_IDs and DRAGBROKER_* fields, so a fleet can forward it with
/// systemd-journal-upload and select it with `journalctl MESSAGE_ID=…`.
enum AuditJournal {
    /// `journalctl MESSAGE_ID=9c1a7e3b5f2d4e8a8b6c0d1e2f3a4b5c`: a transfer ended.
    static let transferMessageID = "9c1a7e3b5f2d4e8a8b6c0d1e2f3a4b5c"
    /// `journalctl MESSAGE_ID=4e2b9d7c1a3f4b6e9d8c7b6a5f4e3d2c`: a request was refused.
    static let refusalMessageID = "4e2b9d7c1a3f4b6e9d8c7b6a5f4e3d2c"
    /// `journalctl MESSAGE_ID=7d3f1b9e2c4a4d6f8e0a1b2c3d4e5f60`: a session ended.
    static let sessionMessageID = "7d3f1b9e2c4a4d6f8e0a1b2c3d4e5f60"
    /// `journalctl MESSAGE_ID=8593af0f7c664ce8ad07ab14ac085c52`: records the log could not keep
    /// were counted into it as a gap.
    static let gapMessageID = "8593af0f7c664ce8ad07ab14ac085c52"

    static let enabled = Journal.isConnected

    static func record(_ load: LoadRecord) {
        guard enabled else { return }
        Journal.send([
            ("MESSAGE", load.summary),
            ("MESSAGE_ID", transferMessageID),
            ("PRIORITY", "\(load.priority)"),
            ("SYSLOG_IDENTIFIER", "dragbrokerd"),
            ("DRAGBROKER_SESSION", load.sessionID),
            ("DRAGBROKER_CHANNEL", load.channel),
            ("DRAGBROKER_SOURCE_APP", load.sourceApp),
            ("DRAGBROKER_SOURCE_TEAM", load.sourceTeam ?? ""),
            ("DRAGBROKER_DESTINATION_APP", load.destinationApp),
            ("DRAGBROKER_DESTINATION_TEAM", load.destinationTeam ?? ""),
            ("DRAGBROKER_TYPE", load.typeIdentifier),
            ("DRAGBROKER_BYTES", "\(load.bytes)"),
            ("DRAGBROKER_OUTCOME", load.outcome),
            ("DRAGBROKER_ERROR", load.errorName ?? ""),
        ])
    }

    /// `channel` is that of the session refused, if any.
    static func record(_ refusal: RefusalRecord, channel: String?) {
        guard enabled else { return }
        Journal.send([
            ("MESSAGE", refusal.summary),
            ("MESSAGE_ID", refusalMessageID),
            ("PRIORITY", "\(refusal.priority)"),
            ("SYSLOG_IDENTIFIER", "dragbrokerd"),
            ("DRAGBROKER_SESSION", refusal.sessionID ?? ""),
            ("DRAGBROKER_CHANNEL", channel ?? ""),
            ("DRAGBROKER_APP", refusal.app),
            ("DRAGBROKER_ACTION", refusal.action),
            ("DRAGBROKER_TYPE", refusal.subject ?? ""),
            ("DRAGBROKER_ERROR", refusal.errorName),
            ("DRAGBROKER_RULE", refusal.rule ?? ""),
        ])
    }

    static func record(_ session: SessionRecord) {
        guard enabled else { return }
        Journal.send([
            ("MESSAGE", session.summary),
            ("MESSAGE_ID", sessionMessageID),
            ("PRIORITY", "\(session.priority)"),
            ("SYSLOG_IDENTIFIER", "dragbrokerd"),
            ("DRAGBROKER_SESSION", session.sessionID),
            ("DRAGBROKER_KIND", session.kind),
            ("DRAGBROKER_CHANNEL", session.channel),
            ("DRAGBROKER_SOURCE_APP", session.sourceApp),
            ("DRAGBROKER_DESTINATION_APP", session.destinationApp ?? ""),
            ("DRAGBROKER_ITEMS", "\(session.itemCount)"),
            ("DRAGBROKER_OPERATION", session.operation),
            ("DRAGBROKER_OUTCOME", session.outcome),
            ("DRAGBROKER_ERROR", session.errorName ?? ""),
        ])
    }

    /// A forwarded audit trail must say where it is incomplete, as the log itself does, so the
    /// gap is an entry of its own kind rather than only an error line. Returns false when the
    /// journal did not take it.
    @discardableResult
    static func record(_ gap: GapRecord, message: String) -> Bool {
        guard enabled else { return false }
        return Journal.send([
            ("MESSAGE", message),
            ("MESSAGE_ID", gapMessageID),
            ("PRIORITY", "3"),
            ("SYSLOG_IDENTIFIER", "dragbrokerd"),
            ("DRAGBROKER_LOST", "\(gap.lost)"),
            ("DRAGBROKER_REASON", gap.reason),
            ("DRAGBROKER_FIRST_LOST_USEC", "\(MicrosecondTimestamp.microseconds(gap.firstLostAt))"),
            ("DRAGBROKER_LAST_LOST_USEC", "\(MicrosecondTimestamp.microseconds(gap.lastLostAt))"),
        ])
    }
}

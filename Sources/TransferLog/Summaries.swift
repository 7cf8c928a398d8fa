// What each record says in one line and how loud it is: the journal's MESSAGE and PRIORITY, and the message and severity
// of `dragctl log --format=ocsf`. Kept here, beside the records, so the two audit trails cannot drift apart.

extension LoadRecord {
    public var summary: String {
        "Transfer of \(typeIdentifier) from \(sourceApp) to \(destinationApp): \(outcome), \(bytes) bytes"
    }

    /// syslog's: 6 (info) for a transfer that completed, 5 (notice) for one that did not.
    public var priority: Int { outcome == "completed" ? 6 : 5 }
}

extension SessionRecord {
    public var summary: String {
        "\(kind == "copy" ? "Pasteboard entry" : "Session") \(sessionID) from \(sourceApp) ended: \(outcome), operation \(operation)"
    }

    public var priority: Int { outcome == "completed" ? 6 : 5 }
}

extension RefusalRecord {
    public var summary: String { "Refused \(action) for \(app): \(message)" }

    /// Always 5 (notice): a refusal is worth reading, and it is the daemon doing its job.
    public var priority: Int { 5 }
}

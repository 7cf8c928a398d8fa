import BusKit
import Logging

/// swift-log into the journal: each line a structured entry with its priority and source
/// location, so `journalctl -u dragbrokerd -p warning` works as for systemd's own daemons.
struct JournalLogHandler: LogHandler {
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var fields: [(String, String)] = [
            ("MESSAGE", "\(event.message)"),
            ("PRIORITY", "\(Self.priority(event.level))"),
            ("SYSLOG_IDENTIFIER", "dragbrokerd"),
            ("CODE_FILE", event.file),
            ("CODE_LINE", "\(event.line)"),
            ("CODE_FUNC", event.function),
        ]
        for (key, value) in metadata.merging(event.metadata ?? [:], uniquingKeysWith: { $1 }) {
            fields.append(("DRAGBROKER_" + key.uppercased(), "\(value)"))
        }
        Journal.send(fields)
    }

    /// syslog priorities, as journald expects them.
    static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }
}

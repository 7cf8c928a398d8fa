// Subcommands that read the transfer log file directly, so they work even when dragbrokerd is not running: log, refusals
// and stats (which then adds, from the daemon when it answers, what each app holds now).
import ArgumentParser
import BrokerClient
import BrokerProtocol
import Foundation
import TransferLog

struct LogOptions: ParsableArguments {
    @Option(help: "The state directory holding transfers.sqlite (default: $DRAGBROKER_STATE_DIRECTORY, else $XDG_STATE_HOME/dragbroker).")
    var stateDirectory: String?

    func open() throws -> TransferLog {
        try TransferLog.openReadOnly(path: stateDirectory.map(TransferLog.path(inStateDirectory:)) ?? TransferLog.defaultPath())
    }
}

/// What `dragctl log` prints: tables, the JSON report, or OCSF events.
enum LogFormat: String, ExpressibleByArgument, CaseIterable {
    case text, json, ocsf
}

struct Log: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show the transfer log: sessions and their loads, newest first.")

    @OptionGroup var location: LogOptions

    @Option(help: "Show at most this many records of each kind.")
    var limit: Int = 50

    @Option(help: "Only loads that started at or after this time (\"2026-11-21 09:00\", \"-2h\").")
    var since: String?

    @Option(help: "Only loads that started at or before this time.")
    var until: String?

    @Option(help: "Only loads from or to this app ID.")
    var app: String?

    @Option(help: "Only loads from or to this team.")
    var team: String?

    @Option(help: "Only loads of this type.")
    var type: String?

    @Option(help: "Only loads with this outcome: completed, cancelled, timed-out, denied, disconnected, failed, interrupted, or open (still running).")
    var outcome: String?

    @Option(help: ArgumentHelp(
        "Print text (tables), json (the report, as --json=short) or ocsf.",
        discussion: "ocsf writes one OCSF 1.6.0 event a line, oldest first: each load, each ended session, and each refusal "
            + "(refusals are matched by --since, --until, --app and --type, and left out with --team or --outcome)."))
    var format: LogFormat?

    @OptionGroup var output: OutputOptions

    struct Report: Encodable {
        var sessions: [SessionRecord]
        var loads: [LoadRecord]
        /// Records the daemon could not write, counted instead: the log is incomplete.
        var lostRecords: Int64
        var gaps: [GapRecord]
    }

    func validate() throws {
        try validateWindow(since: since, until: until, limit: limit)
        if let format, format != .json, output.mode != .off {
            throw ValidationError("--format=\(format.rawValue) prints no JSON report: leave out --json and -j, or use --format=json")
        }
    }

    func run() async throws {
        let report: Report
        var refusals: [RefusalRecord] = []
        let format = format ?? (output.mode == .off ? .text : .json)
        let filter = TransferLog.LoadFilter(since: since.flatMap(parseTime), until: until.flatMap(parseTime), app: app, team: team,
                                            type: type, outcome: outcome)
        let filtered = since != nil || until != nil || app != nil || team != nil || type != nil || outcome != nil
        do {
            let log = try location.open()
            let loads = try log.loads(limit: limit, filter: filter)
            let ids = Set(loads.map(\.sessionID))
            let sessions = try log.sessions(limit: limit, includingOpen: true).filter { !filtered || ids.contains($0.sessionID) }
            report = Report(sessions: sessions, loads: loads, lostRecords: try log.lostRecords(), gaps: try log.gaps())
            if format == .ocsf && team == nil && outcome == nil {
                refusals = try log.refusals(limit: limit, filter: TransferLog.RefusalFilter(
                    since: filter.since, until: filter.until, app: app, type: type, action: nil, errorName: nil))
            }
        } catch {
            throw fail("Failed to read the transfer log: \(error)")
        }
        switch format {
        case .json: return try output.printJSON(report)
        case .ocsf: return try printOCSF(report, refusals: refusals)
        case .text: break
        }
        output.page((gapWarning(lost: report.lostRecords, report.gaps).map { $0 + "\n\n" } ?? "") + output.table(
            ["SESSION", "KIND", "STARTED", "SOURCE", "DESTINATION", "OPERATION", "OUTCOME"],
            report.sessions.map { [$0.sessionID, $0.kind, timestamp($0.startedAt), $0.sourceApp, $0.destinationApp ?? "-", $0.operation, $0.outcome] },
            legend: "\(plural(report.sessions.count, "session")) listed.") + "\n\n" + output.table(
            ["SESSION", "STARTED", "TYPE", "BYTES", "DESTINATION", "OUTCOME"],
            report.loads.map { [$0.sessionID, timestamp($0.startedAt), $0.typeIdentifier, String($0.bytes), $0.destinationApp, $0.outcome + ($0.errorName.map { " (\($0))" } ?? "")] },
            legend: "\(plural(report.loads.count, "load")) listed."))
    }
}

extension Log {
    /// Oldest first, as a log file reads, so appending runs of `--since` makes one stream. The gap warning goes to
    /// stderr: stdout holds events and nothing else.
    func printOCSF(_ report: Report, refusals: [RefusalRecord]) throws {
        if let warning = gapWarning(lost: report.lostRecords, report.gaps) {
            FileHandle.standardError.write(Data("dragctl: \(warning)\n".utf8))
        }
        let events = report.loads.map { ($0.endedAt, OCSF.event(for: $0)) }
            + report.sessions.compactMap { session in OCSF.event(for: session).map { (session.endedAt, $0) } }
            + refusals.map { ($0.at, OCSF.event(for: $0)) }
        // sort is not stable: the offset keeps records of one millisecond in the order they were read.
        let ordered = events.enumerated().sorted { ($0.element.0, $0.offset) < ($1.element.0, $1.offset) }.map(\.element.1)
        FileHandle.standardOutput.write(Data(try ordered.map { try OCSF.line($0) + "\n" }.joined().utf8))
    }
}

/// The first thing `log` and `stats` say when the log is incomplete, nil when it is whole.
func gapWarning(lost: Int64, _ gaps: [GapRecord]) -> String? {
    guard lost > 0, let last = gaps.first else { return nil }
    return "Warning: the transfer log is missing \(plural(Int(lost), "record")) that dragbrokerd could not write "
        + "(\(plural(gaps.count, "gap")), the last at \(timestamp(last.lastLostAt))); dragctl stats lists them."
}

/// The checks `log` and `refusals` share: times `parseTime` reads, and a positive limit.
func validateWindow(since: String?, until: String?, limit: Int) throws {
    if let since, parseTime(since) == nil { throw ValidationError("--since: '\(since)' is not a time such as \"2026-11-21 09:00\" or \"-2h\"") }
    if let until, parseTime(until) == nil { throw ValidationError("--until: '\(until)' is not a time such as \"2026-11-21 09:00\" or \"-2h\"") }
    guard limit > 0 else { throw ValidationError("--limit must be positive") }
}

struct Refusals: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the requests dragbrokerd refused (by policy, or out of turn), newest first: who asked, for what, and why.")

    @OptionGroup var location: LogOptions

    @Option(help: "Show at most this many refusals.")
    var limit: Int = 50

    @Option(help: "Only refusals at or after this time (\"2026-11-21 09:00\", \"-2h\").")
    var since: String?

    @Option(help: "Only refusals at or before this time.")
    var until: String?

    @Option(help: "Only refusals of this app ID (the caller refused).")
    var app: String?

    @Option(help: "Only refused loads of this type.")
    var type: String?

    @Option(help: "Only refusals of this bus method, e.g. Load or BeginSession.")
    var action: String?

    @Option(help: "Only refusals answered with this error: a name such as WrongState, or the full org.dragbroker.Broker1.Error.WrongState.")
    var error: String?

    @OptionGroup var output: OutputOptions

    func validate() throws {
        try validateWindow(since: since, until: until, limit: limit)
    }

    func run() async throws {
        let filter = TransferLog.RefusalFilter(
            since: since.flatMap(parseTime), until: until.flatMap(parseTime), app: app, type: type, action: action,
            errorName: error.map { $0.contains(".") ? $0 : BrokerNames.errorPrefix + $0 })
        let refusals: [RefusalRecord]
        do {
            refusals = try location.open().refusals(limit: limit, filter: filter)
        } catch {
            throw fail("Failed to read the transfer log: \(error)")
        }
        if output.mode != .off { return try output.printJSON(refusals) }
        output.printTable(
            ["TIME", "APP", "ACTION", "SESSION", "TYPE", "ERROR", "MESSAGE"],
            refusals.map { [timestamp($0.at), $0.app, $0.action, $0.sessionID ?? "-", $0.subject ?? "-", $0.errorName, $0.message] },
            legend: "\(plural(refusals.count, "refusal")) listed.")
    }
}

struct Stats: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Totals of the transfer log by app, type, outcome and channel; then, from the running daemon, what each app holds now.")

    @OptionGroup var location: LogOptions
    @OptionGroup var bus: BusOptions
    @OptionGroup var output: OutputOptions

    @Flag(inversion: .prefixedNo, help: "Ask the running daemon what each app holds now (administrators only).")
    var live = true

    struct Report: Encodable {
        var bySourceApp: [TransferLog.Total]
        var byDestinationApp: [TransferLog.Total]
        var byType: [TransferLog.Total]
        var byOutcome: [TransferLog.Total]
        /// Drag and drop, and copy and paste.
        var byChannel: [TransferLog.Total]
        /// Records the daemon could not write, counted instead: the totals are short by them.
        var lostRecords: Int64
        var gaps: [GapRecord]
        /// From the running daemon, when it answered.
        var now: UsageReport?
    }

    func run() async throws {
        var report: Report
        do {
            let log = try location.open()
            report = Report(bySourceApp: try log.totals(by: "sourceApp"), byDestinationApp: try log.totals(by: "destinationApp"),
                            byType: try log.totals(by: "typeIdentifier"), byOutcome: try log.totals(by: "outcome"),
                            byChannel: try log.totals(by: "channel"), lostRecords: try log.lostRecords(), gaps: try log.gaps())
        } catch {
            throw fail("Failed to read the transfer log: \(error)")
        }
        var liveFailure: String?
        if live {
            do {
                report.now = try await BrokerConnection.connect(address: bus.address).usage()
            } catch where error.code == .accessDenied {
                liveFailure = error.message
            } catch {
                // No daemon to ask: the log alone is what there is.
            }
        }
        if output.mode != .off { return try output.printJSON(report) }
        var tables = [("SOURCE APP", report.bySourceApp), ("DESTINATION APP", report.byDestinationApp),
                      ("TYPE", report.byType), ("OUTCOME", report.byOutcome), ("CHANNEL", report.byChannel)].map { title, totals in
            output.table([title, "LOADS", "BYTES"], totals.map { [$0.key, String($0.loads), bytes(UInt64(max($0.bytes, 0)))] },
                         legend: "\(totals.count) \(totals.count == 1 ? "entry" : "entries") listed.")
        }
        if let warning = gapWarning(lost: report.lostRecords, report.gaps) {
            tables.insert(warning, at: 0)
            tables.append(output.table(
                ["GAP", "FIRST LOST", "LAST LOST", "LOST", "REASON"],
                report.gaps.map { [String($0.id ?? 0), timestamp($0.firstLostAt), timestamp($0.lastLostAt), String($0.lost), $0.reason] },
                legend: "\(plural(report.gaps.count, "gap")) listed, \(plural(Int(report.lostRecords), "record")) lost."))
        }
        if let now = report.now {
            tables.append(output.table(
                ["NOW", "SESSIONS", "LOADS", "THREADS", "WAITING"],
                now.buckets.map {
                    [$0.name, String($0.sessions), String($0.loads), String($0.descriptorThreads),
                     $0.descriptorThreads == 0 ? "-" : String(format: "%.1fs", Double($0.oldestThreadWait) / 1_000_000)]
                },
                legend: "\(plural(Int(now.sessions), "live session")), \(plural(Int(now.loads), "load")) in flight, "
                    + "\(now.threadsBusy) of \(plural(Int(now.threadsMade), "descriptor thread")) busy."))
        } else if let liveFailure {
            tables.append("What each app holds now is not shown: \(liveFailure)".escapedForTerminal)
        }
        output.page(tables.joined(separator: "\n\n") + "\n")
    }
}

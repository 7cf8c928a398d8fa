import ArgumentParser
import BrokerClient
import BrokerPolicy
import BrokerProtocol
import Foundation
import TransferLog
import UniformTypes

/// dragctl: inspect live drag sessions and the transfer log.
@main
struct Dragctl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dragctl",
        abstract: "Inspect dragbroker's live drag sessions and its transfer log.",
        version: "0.1.0",
        subcommands: [ListSessions.self, ShowSession.self, Monitor.self, CancelSession.self, CancelLoad.self, Log.self, Stats.self,
                      WhoAmI.self, PolicyCommand.self])
}

enum JSONMode: String, ExpressibleByArgument, CaseIterable {
    case pretty, short, off
}

struct OutputOptions: ParsableArguments {
    @Option(name: .customLong("json"), help: "Print JSON: pretty, short or off.")
    var json: JSONMode = .off

    @Flag(name: .customShort("j"), help: "Same as --json=pretty.")
    var prettyJSON = false

    @Flag(name: .customLong("no-legend"), help: "Do not print the header and the legend line.")
    var noLegend = false

    @Flag(name: .customLong("no-pager"), help: "Do not pipe the output into a pager.")
    var noPager = false

    var mode: JSONMode { prettyJSON ? .pretty : json }

    func printJSON<T: Encodable>(_ value: T) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = mode == .pretty ? [.prettyPrinted, .sortedKeys] : [.sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        print(String(decoding: try encoder.encode(value), as: UTF8.self))
    }

    /// A table in the manner of systemd's tools: header, rows, then a legend line.
    func printTable(_ header: [String], _ rows: [[String]], legend: String) {
        page(table(header, rows, legend: legend))
    }

    func table(_ header: [String], _ rows: [[String]], legend: String) -> String {
        var lines: [String] = []
        let widths = header.indices.map { i in ([header[i]] + rows.map { $0[i] }).map(\.count).max() ?? 0 }
        func row(_ cells: [String]) -> String {
            cells.enumerated().map { i, cell in
                i == cells.count - 1 ? cell : cell.padding(toLength: widths[i] + 1, withPad: " ", startingAt: 0)
            }.joined()
        }
        if !noLegend && !rows.isEmpty { lines.append(row(header)) }
        lines += rows.map(row)
        if !noLegend {
            if !rows.isEmpty { lines.append("") }
            lines.append(legend)
        }
        return lines.joined(separator: "\n")
    }

    /// Like systemd's tools: on a terminal, output taller than the screen goes through
    /// `$PAGER` (default `less -FRX`), unless --no-pager or `$SYSTEMD_PAGER=cat`.
    func page(_ text: String) {
        let environment = ProcessInfo.processInfo.environment
        let pager = environment["DRAGCTL_PAGER"] ?? environment["SYSTEMD_PAGER"] ?? environment["PAGER"] ?? "less -FRX"
        var size = winsize()
        let rows = ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0 ? Int(size.ws_row) : 0
        guard !noPager, isatty(STDOUT_FILENO) == 1, rows > 0, text.split(separator: "\n").count >= rows,
              !pager.isEmpty, pager != "cat" else {
            print(text)
            return
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", pager]
        let input = Pipe()
        process.standardInput = input
        do {
            try process.run()
            input.fileHandleForWriting.write(Data((text + "\n").utf8))
            try? input.fileHandleForWriting.close()
            process.waitUntilExit()
        } catch {
            print(text)
        }
    }
}

struct LogOptions: ParsableArguments {
    @Option(help: "The state directory holding transfers.sqlite (default: $DRAGBROKER_STATE_DIRECTORY, else $XDG_STATE_HOME/dragbroker).")
    var stateDirectory: String?

    func open() throws -> TransferLog {
        try TransferLog.openReadOnly(path: stateDirectory.map(TransferLog.path(inStateDirectory:)) ?? TransferLog.defaultPath())
    }
}

struct BusOptions: ParsableArguments {
    @Option(help: "The bus address (default: $DRAGBROKER_BUS_ADDRESS, else the session bus).")
    var address: String?
}

func plural(_ n: Int, _ word: String) -> String { "\(n) \(word)\(n == 1 ? "" : "s")" }

func fail(_ message: String) -> ExitCode {
    FileHandle.standardError.write(Data("dragctl: \(message)\n".utf8))
    return ExitCode(1)
}

/// Local time and how long ago, as systemd's tools show times: "2026-11-21 09:12:03 (2min ago)".
func timestamp(_ date: Date, now: Date = Date()) -> String {
    let formatter = DateFormatter()
    formatter.dateFormat = "yyyy-MM-dd HH:mm:ss"
    return "\(formatter.string(from: date)) (\(relative(now.timeIntervalSince(date))))"
}

func relative(_ seconds: TimeInterval) -> String {
    let s = Int(seconds.rounded(.down))
    switch s {
    case ..<1: return "just now"
    case ..<60: return "\(s)s ago"
    case ..<3600: return "\(s / 60)min ago"
    case ..<86_400: return "\(s / 3600)h \(s % 3600 / 60)min ago"
    default: return "\(s / 86_400) days ago"
    }
}

func bytes(_ count: UInt64) -> String {
    let units: [(UInt64, String)] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")]
    guard let (size, unit) = units.first(where: { count >= $0.0 }) else { return "\(count)B" }
    return String(format: "%.1f%@", Double(count) / Double(size), unit)
}

/// Parses `--since`/`--until`: "2026-11-21 09:00:00", "2026-11-21", or "-2h"/"-30min"/"-3d".
func parseTime(_ text: String) -> Date? {
    if text.hasPrefix("-") {
        let body = text.dropFirst()
        for (suffix, unit) in [("min", 60.0), ("h", 3600.0), ("d", 86_400.0), ("s", 1.0)] where body.hasSuffix(suffix) {
            if let n = Double(body.dropLast(suffix.count)) { return Date().addingTimeInterval(-n * unit) }
        }
        return nil
    }
    let formatter = DateFormatter()
    for format in ["yyyy-MM-dd HH:mm:ss", "yyyy-MM-dd HH:mm", "yyyy-MM-dd"] {
        formatter.dateFormat = format
        if let date = formatter.date(from: text) { return date }
    }
    return nil
}

struct ListSessions: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list-sessions", abstract: "List live drag sessions.")

    @OptionGroup var bus: BusOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        let sessions: [SessionSummary]
        do {
            let connection = try await BrokerConnection.connect(address: bus.address)
            sessions = try await connection.listSessions()
        } catch {
            throw fail("Failed to list sessions: \(error)")
        }
        if output.mode != .off { return try output.printJSON(sessions) }
        output.printTable(
            ["SESSION", "STATE", "ITEMS", "SOURCE", "SINCE"],
            sessions.map {
                [$0.id, $0.state, String($0.itemCount), $0.sourceApp,
                 timestamp(Date(timeIntervalSince1970: Double($0.createdAt) / 1_000_000))]
            },
            legend: "\(plural(sessions.count, "session")) listed.")
    }
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

    @Option(help: "Only loads with this outcome: completed, cancelled, timed-out, denied, disconnected, failed.")
    var outcome: String?

    @OptionGroup var output: OutputOptions

    struct Report: Encodable {
        var sessions: [SessionRecord]
        var loads: [LoadRecord]
    }

    func validate() throws {
        if let since, parseTime(since) == nil { throw ValidationError("--since: '\(since)' is not a time such as \"2026-11-21 09:00\" or \"-2h\"") }
        if let until, parseTime(until) == nil { throw ValidationError("--until: '\(until)' is not a time such as \"2026-11-21 09:00\" or \"-2h\"") }
        guard limit > 0 else { throw ValidationError("--limit must be positive") }
    }

    func run() async throws {
        let report: Report
        let filter = TransferLog.LoadFilter(since: since.flatMap(parseTime), until: until.flatMap(parseTime), app: app, team: team,
                                            type: type, outcome: outcome)
        let filtered = since != nil || until != nil || app != nil || team != nil || type != nil || outcome != nil
        do {
            let log = try location.open()
            let loads = try log.loads(limit: limit, filter: filter)
            let ids = Set(loads.map(\.sessionID))
            let sessions = try log.sessions(limit: limit).filter { !filtered || ids.contains($0.sessionID) }
            report = Report(sessions: sessions, loads: loads)
        } catch {
            throw fail("Failed to read the transfer log: \(error)")
        }
        if output.mode != .off { return try output.printJSON(report) }
        output.page(output.table(
            ["SESSION", "STARTED", "SOURCE", "DESTINATION", "OPERATION", "OUTCOME"],
            report.sessions.map { [$0.sessionID, timestamp($0.startedAt), $0.sourceApp, $0.destinationApp ?? "-", $0.operation, $0.outcome] },
            legend: "\(plural(report.sessions.count, "session")) listed.") + "\n\n" + output.table(
            ["SESSION", "STARTED", "TYPE", "BYTES", "DESTINATION", "OUTCOME"],
            report.loads.map { [$0.sessionID, timestamp($0.startedAt), $0.typeIdentifier, String($0.bytes), $0.destinationApp, $0.outcome + ($0.errorName.map { " (\($0))" } ?? "")] },
            legend: "\(plural(report.loads.count, "load")) listed."))
    }
}

struct WhoAmI: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "whoami", abstract: "Show how dragbrokerd identifies this process: app ID, team, managed, and why.")

    @OptionGroup var bus: BusOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        let identity: BrokerIdentity
        do {
            identity = try await BrokerConnection.connect(address: bus.address).whoAmI()
        } catch {
            throw fail("Failed to ask dragbrokerd: \(error)")
        }
        if output.mode != .off { return try output.printJSON(identity) }
        let rows: [(String, String)] = [
            ("App ID", identity.appID), ("Team", identity.team ?? "-"), ("Managed", identity.managed ? "yes" : "no"),
            ("Source", identity.source), ("Sandboxed", identity.sandboxed ? "yes" : "no"),
            ("Executable", identity.executable), ("PID", String(identity.pid)), ("UID", String(identity.uid)),
        ]
        for (key, value) in rows { print("\(key.padding(toLength: 11, withPad: " ", startingAt: 0))\(value)") }
    }
}

struct PolicyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "policy", abstract: "Show, check or reload the administrator's policy.",
        subcommands: [Show.self, Check.self, Reload.self])

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the policy dragbrokerd enforces, with the file and line of each entry.")
        @OptionGroup var bus: BusOptions

        func run() async throws {
            do {
                print(try await BrokerConnection.connect(address: bus.address).policy(), terminator: "")
            } catch {
                throw fail("Failed to ask dragbrokerd: \(error)")
            }
        }
    }

    struct Check: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check policy files without applying them: a directory (main file and drop-ins) or one file.")

        @Argument(help: "A policy file, or a directory holding dragbroker.conf and dragbroker.conf.d/.")
        var path: String = "/etc/dragbroker"

        func run() async throws {
            var isDirectory: ObjCBool = false
            let exists = FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory)
            do {
                let policy: Policy
                if exists && !isDirectory.boolValue {
                    policy = try PolicyLoader.parse(file: path) { try MimeDatabase.validatePattern($0) }
                } else {
                    policy = try PolicyLoader.load(directory: path) { try MimeDatabase.validatePattern($0) }
                }
                let files = policy.files.isEmpty ? "no files: the defaults apply" : policy.files.joined(separator: ", ")
                print("\(plural(policy.apps.count, "app")), \(plural(policy.flows.count, "flow rule")) from \(files).")
            } catch {
                FileHandle.standardError.write(Data("\(error)\n".utf8))
                throw ExitCode(1)
            }
        }
    }

    struct Reload: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Make dragbrokerd reload its policy; a bad file changes nothing.")
        @OptionGroup var bus: BusOptions

        func run() async throws {
            do {
                try await BrokerConnection.connect(address: bus.address).reloadPolicy()
            } catch {
                throw fail("Failed to reload the policy: \(error)")
            }
        }
    }
}

struct ShowSession: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "show-session", abstract: "Show one live session: items, types and visibility, state, source, destination, loads.")

    @Argument(help: "The session ID, as list-sessions shows it.")
    var id: String

    @OptionGroup var bus: BusOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        let details: SessionDetails
        do {
            details = try await BrokerConnection.connect(address: bus.address).describeSession(id)
        } catch {
            throw fail("Failed to show session \(id): \(error)")
        }
        if output.mode != .off { return try output.printJSON(details) }
        print("Session \(details.id)")
        print("      State: \(details.state)\(details.operation == "cancel" ? "" : " (\(details.operation))")")
        print("     Source: \(details.sourceApp)\(details.sourceTeam.isEmpty ? "" : " (team \(details.sourceTeam))")")
        print("Destination: \(details.destinationApp.isEmpty ? "-" : details.destinationApp)")
        print(" Restricted: \(details.restricted ? "yes" : "no")")
        print("      Items:")
        for (index, item) in details.items.enumerated() {
            let size = item.preferredWidth > 0 ? " \(Int(item.preferredWidth))x\(Int(item.preferredHeight))" : ""
            print("             \(index): \(item.suggestedName.isEmpty ? "(unnamed)" : item.suggestedName)\(size)")
            for representation in item.representations {
                print("                \(representation.typeIdentifier) (\(representation.kind.rawValue), visible to \(representation.visibility.rawValue))")
            }
        }
        if details.loads.isEmpty { return }
        print("      Loads:")
        for load in details.loads {
            let total = load.expected > 0 ? " of \(bytes(load.expected)) (\(load.bytes * 100 / load.expected)%)" : ""
            print("             \(load.id): \(load.typeIdentifier) to \(load.destinationApp), \(bytes(load.bytes))\(total)")
        }
    }
}

struct CancelSession: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cancel-session", abstract: "End a live session; every party is told an administrator cancelled it.")

    @Argument(help: "The session ID.")
    var id: String

    @OptionGroup var bus: BusOptions

    func run() async throws {
        do {
            try await BrokerConnection.connect(address: bus.address).cancelSession(id)
        } catch {
            throw fail("Failed to cancel session \(id): \(error)")
        }
    }
}

struct CancelLoad: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "cancel-load", abstract: "Cancel one load of a live session.")

    @Argument(help: "The session ID.")
    var session: String

    @Argument(help: "The load ID, as show-session lists it.")
    var load: UInt32

    @OptionGroup var bus: BusOptions

    func run() async throws {
        do {
            try await BrokerConnection.connect(address: bus.address).cancelLoad(session: session, load: load)
        } catch {
            throw fail("Failed to cancel load \(load) of session \(session): \(error)")
        }
    }
}

struct Stats: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Totals of the transfer log by app, type and outcome.")

    @OptionGroup var location: LogOptions
    @OptionGroup var output: OutputOptions

    struct Report: Encodable {
        var bySourceApp: [TransferLog.Total]
        var byDestinationApp: [TransferLog.Total]
        var byType: [TransferLog.Total]
        var byOutcome: [TransferLog.Total]
    }

    func run() async throws {
        let report: Report
        do {
            let log = try location.open()
            report = Report(bySourceApp: try log.totals(by: "sourceApp"), byDestinationApp: try log.totals(by: "destinationApp"),
                            byType: try log.totals(by: "typeIdentifier"), byOutcome: try log.totals(by: "outcome"))
        } catch {
            throw fail("Failed to read the transfer log: \(error)")
        }
        if output.mode != .off { return try output.printJSON(report) }
        let tables = [("SOURCE APP", report.bySourceApp), ("DESTINATION APP", report.byDestinationApp),
                      ("TYPE", report.byType), ("OUTCOME", report.byOutcome)].map { title, totals in
            output.table([title, "LOADS", "BYTES"], totals.map { [$0.key, String($0.loads), bytes(UInt64(max($0.bytes, 0)))] },
                         legend: "\(totals.count) \(totals.count == 1 ? "entry" : "entries") listed.")
        }
        output.page(tables.joined(separator: "\n\n") + "\n")
    }
}

struct Monitor: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Follow live drag events (begin, enter, update, drop, loads with progress, end) until Ctrl-C.")

    @OptionGroup var bus: BusOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        let events: AsyncStream<MonitorEvent>
        let connection: BrokerConnection
        do {
            connection = try await BrokerConnection.connect(address: bus.address)
            events = try await connection.monitor()
        } catch {
            throw fail("Failed to monitor: \(error)")
        }
        let terminal = isatty(STDOUT_FILENO) == 1
        FileHandle.standardError.write(Data("Monitoring drag sessions; press Ctrl-C to stop.\n".utf8))
        var progressShown = false
        for await event in events {
            if output.mode != .off {
                try output.printJSON(event)
                continue
            }
            let formatter = DateFormatter()
            formatter.dateFormat = "HH:mm:ss"
            let time = formatter.string(from: Date())
            if event.event == "progress" {
                let line = "\(time) \(event.session) progress \(event.detail) \(Self.bar(event.bytes, event.expected))"
                // On a terminal the bar redraws in place; in a pipe each report is a line.
                if terminal { print("\r\u{1B}[K" + line, terminator: "") } else { print(line) }
                progressShown = terminal
                fflush(nil)
                continue
            }
            if progressShown { print() }
            progressShown = false
            let amount = event.event == "loaded" ? " \(bytes(event.bytes))" : ""
            print("\(time) \(event.session) \(event.event) \(event.detail)\(amount)")
            fflush(nil)
        }
        withExtendedLifetime(connection) {}
    }

    static func bar(_ done: UInt64, _ total: UInt64) -> String {
        guard total > 0 else { return "\(bytes(done))" }
        let fraction = min(Double(done) / Double(total), 1)
        let filled = Int(fraction * 20)
        return "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: 20 - filled) + "] "
            + "\(Int(fraction * 100))% \(bytes(done)) of \(bytes(total))"
    }
}

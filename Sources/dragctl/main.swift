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
        subcommands: [ListSessions.self, Log.self, WhoAmI.self, PolicyCommand.self])
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

    var mode: JSONMode { prettyJSON ? .pretty : json }

    func printJSON<T: Encodable>(_ value: T) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = mode == .pretty ? [.prettyPrinted, .sortedKeys] : [.sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        print(String(decoding: try encoder.encode(value), as: UTF8.self))
    }

    /// A table in the manner of systemd's tools: header, rows, then a legend line.
    func printTable(_ header: [String], _ rows: [[String]], legend: String) {
        if !noLegend && !rows.isEmpty { printRow(header, widths(header, rows)) }
        for row in rows { printRow(row, widths(header, rows)) }
        if !noLegend {
            if !rows.isEmpty { print() }
            print(legend)
        }
    }

    private func widths(_ header: [String], _ rows: [[String]]) -> [Int] {
        header.indices.map { i in ([header[i]] + rows.map { $0[i] }).map(\.count).max() ?? 0 }
    }

    private func printRow(_ cells: [String], _ widths: [Int]) {
        var line = ""
        for (i, cell) in cells.enumerated() {
            line += i == cells.count - 1 ? cell : cell.padding(toLength: widths[i] + 1, withPad: " ", startingAt: 0)
        }
        print(line)
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

func timestamp(_ date: Date) -> String {
    let formatter = DateFormatter()
    formatter.dateFormat = "yyyy-MM-dd HH:mm:ss"
    return formatter.string(from: date)
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

    @Option(help: "The state directory holding transfers.sqlite (default: $DRAGBROKER_STATE_DIRECTORY, else $XDG_STATE_HOME/dragbroker).")
    var stateDirectory: String?

    @Option(help: "Show at most this many records of each kind.")
    var limit: Int = 50

    @OptionGroup var output: OutputOptions

    struct Report: Encodable {
        var sessions: [SessionRecord]
        var loads: [LoadRecord]
    }

    func run() async throws {
        let path = stateDirectory.map { $0 + "/transfers.sqlite" } ?? TransferLog.defaultPath()
        let report: Report
        do {
            let log = try TransferLog.openReadOnly(path: path)
            report = Report(sessions: try log.sessions(limit: limit), loads: try log.loads(limit: limit))
        } catch {
            throw fail("Failed to read the transfer log: \(error)")
        }
        if output.mode != .off { return try output.printJSON(report) }
        output.printTable(
            ["SESSION", "STARTED", "SOURCE", "DESTINATION", "OPERATION", "OUTCOME"],
            report.sessions.map { [$0.sessionID, timestamp($0.startedAt), $0.sourceApp, $0.destinationApp ?? "-", $0.operation, $0.outcome] },
            legend: "\(plural(report.sessions.count, "session")) listed.")
        print()
        output.printTable(
            ["SESSION", "STARTED", "TYPE", "BYTES", "DESTINATION", "OUTCOME"],
            report.loads.map { [$0.sessionID, timestamp($0.startedAt), $0.typeIdentifier, String($0.bytes), $0.destinationApp, $0.outcome + ($0.errorName.map { " (\($0))" } ?? "")] },
            legend: "\(plural(report.loads.count, "load")) listed.")
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

// Subcommands that ask dragbrokerd about its live sessions over the bus: list, show, follow, cancel.
import ArgumentParser
import BrokerClient
import BrokerProtocol
import Foundation

struct ListSessions: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list-sessions", abstract: "List live sessions: drags, pasteboard entries and pastes.")

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
            ["SESSION", "KIND", "STATE", "ITEMS", "SOURCE", "SINCE"],
            sessions.map {
                [$0.id, $0.kind, $0.state, String($0.itemCount), $0.sourceApp,
                 timestamp(Date(timeIntervalSince1970: Double($0.createdAt) / 1_000_000))]
            },
            legend: "\(plural(sessions.count, "session")) listed.")
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
        // Each string is escaped as it goes in: the app, its team, item names and types were a client's to choose.
        print("Session \(details.id.escapedForTerminal)")
        let operation = details.operation == "cancel" ? "" : " (\(details.operation.escapedForTerminal))"
        print("      State: \(details.state.escapedForTerminal)\(operation)")
        let team = details.sourceTeam.isEmpty ? "" : " (team \(details.sourceTeam.escapedForTerminal))"
        print("     Source: \(details.sourceApp.escapedForTerminal)\(team)")
        print("Destination: \(details.destinationApp.isEmpty ? "-" : details.destinationApp.escapedForTerminal)")
        print(" Restricted: \(details.restricted ? "yes" : "no")")
        print("      Items:")
        for (index, item) in details.items.enumerated() {
            let size = item.preferredWidth > 0 ? " \(Int(item.preferredWidth))x\(Int(item.preferredHeight))" : ""
            print("             \(index): \(item.suggestedName.isEmpty ? "(unnamed)" : item.suggestedName.escapedForTerminal)\(size)")
            for representation in item.representations {
                print("                \(representation.typeIdentifier.escapedForTerminal) "
                      + "(\(representation.kind.rawValue), visible to \(representation.visibility.rawValue))")
            }
        }
        if details.loads.isEmpty { return }
        print("      Loads:")
        for load in details.loads {
            let total = load.expected > 0 ? " of \(bytes(load.expected)) (\(load.bytes * 100 / load.expected)%)" : ""
            print("             \(load.id): \(load.typeIdentifier.escapedForTerminal) to \(load.destinationApp.escapedForTerminal), "
                  + "\(bytes(load.bytes))\(total)")
        }
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
                // One event per line, as it happens, also into a pipe (`| jq`).
                fflush(nil)
                continue
            }
            let formatter = DateFormatter()
            formatter.dateFormat = "HH:mm:ss"
            let time = formatter.string(from: Date())
            // The event's strings are escaped, never the line: its `\r\e[K` is dragctl's own redrawing.
            let session = event.session.escapedForTerminal, detail = event.detail.escapedForTerminal
            if event.event == "progress" {
                let line = "\(time) \(session) progress \(detail) \(Self.bar(event.bytes, event.expected))"
                // On a terminal the bar redraws in place; in a pipe each report is a line.
                if terminal { print("\r\u{1B}[K" + line, terminator: "") } else { print(line) }
                progressShown = terminal
                fflush(nil)
                continue
            }
            if progressShown { print() }
            progressShown = false
            let amount = event.kind == .loaded ? " \(bytes(event.bytes))" : ""
            print("\(time) \(session) \(event.event.escapedForTerminal) \(detail)\(amount)")
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

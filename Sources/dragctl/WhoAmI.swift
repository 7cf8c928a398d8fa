// whoami: dragbrokerd's view of the calling process, to see why policy treats an app the way it does.
import ArgumentParser
import BrokerClient
import Foundation

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
        // The executable's path is whatever the caller's file is named, and sandboxes name their own app IDs.
        for (key, value) in rows { print("\(key.padding(toLength: 11, withPad: " ", startingAt: 0))\(value.escapedForTerminal)") }
    }
}

// The root command: a new subcommand gets its own file (or joins its group's) and is listed in `subcommands` here.
import ArgumentParser
import BrokerProtocol

/// dragctl: inspect live drag sessions and the transfer log.
@main
struct Dragctl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dragctl",
        abstract: "Inspect dragbroker's live drag sessions and its transfer log.",
        version: BrokerVersion.current,
        subcommands: [ListSessions.self, ShowSession.self, Monitor.self, CancelSession.self, CancelLoad.self, Log.self, Refusals.self, Stats.self,
                      WhoAmI.self, PolicyCommand.self])
}

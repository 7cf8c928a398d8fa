// The policy group: show and reload go through dragbrokerd, check parses files locally before they are deployed.
import ArgumentParser
import BrokerClient
import BrokerPolicy
import Foundation
import UniformTypes

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

        @Argument(help: "A policy file, or a directory holding dragbroker.conf and dragbroker.conf.d/ (default: /etc/dragbroker).")
        var path: String?

        func run() async throws {
            var isDirectory: ObjCBool = false
            let path = path ?? PolicyLoader.defaultDirectory
            let exists = FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory)
            // A missing /etc/dragbroker means the defaults, as for the daemon; a path someone
            // typed that is not there is a mistake to report, not a policy that passes.
            if !exists && self.path != nil {
                FileHandle.standardError.write(Data("\(path): no such file or directory\n".utf8))
                throw ExitCode(1)
            }
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

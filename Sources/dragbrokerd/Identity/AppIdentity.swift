// Identity/ — who a caller is, from the bus's kernel-verified PID and EUID and from /proc,
// never from what it sends. A new identity source: a case of `IdentitySource`, a field of
// `ProcessFacts` read in `IdentityResolver.readFacts`, and its place in `AppIdentity.init`.
import BrokerPolicy
import BrokerProtocol
import BusKit
import Foundation
import SystemCalls

/// Where an app ID came from, strongest first, and so the order in which they are tried.
/// A sandbox vouches for its ID: the app inside cannot leave it or change it. A registered
/// executable is as strong as its path's permissions against the users who cannot write it.
/// A systemd unit or scope name is self-chosen: any unsandboxed process of the user can start
/// itself in a scope of any name, so such an ID names an app but grants nothing the
/// administrator did not grant to that source (`[App] Sources=systemd-unit`).
enum IdentitySource: String, Sendable {
    case flatpak, snap
    /// The administrator's registry, by executable path.
    case registry
    /// The XDG convention for systemd units: `app-[<launcher>-]<AppID>…` in the cgroup path.
    case systemdUnit = "systemd-unit"
    /// Nothing better: the executable path itself.
    case executable

    var isSandboxed: Bool { self == .flatpak || self == .snap }

    /// The registry source an `[App]` entry must list to give an app of this source its team
    /// and `Managed=` by app ID alone.
    var entrySource: AppEntry.Source? {
        switch self {
        case .flatpak: .flatpak
        case .snap: .snap
        case .systemdUnit: .systemdUnit
        case .registry, .executable: nil
        }
    }
}

/// What the kernel says about a peer, read once per connection while the process is pinned.
struct ProcessFacts: Equatable, Sendable {
    var uniqueName: String
    var pid: pid_t
    var uid: uid_t
    var executable: String
    /// `[Application] name=` of `/proc/PID/root/.flatpak-info`.
    var flatpakApp: String?
    /// The snap name from a `snap.<name>.<app>…` cgroup.
    var snapName: String?
    /// The app ID from an XDG-style `app-…` unit in the cgroup path.
    var unitApp: String?
}

/// How the daemon sees a bus peer. Built only from kernel-verified credentials and /proc,
/// and the administrator's policy, never from anything the peer sends.
///
/// A class, so that the sessions, destinations and events of one connection share the
/// resolver's one copy: a value of these strings and arrays takes 136 bytes inline in every
/// session that holds it. Immutable, so sharing it shares nothing anyone can change; a new
/// policy makes new identities, and a session keeps the one it began with.
final class AppIdentity: Sendable {
    let facts: ProcessFacts
    let appID: String
    let team: String?
    let managed: Bool
    let source: IdentitySource

    var uniqueName: String { facts.uniqueName }
    var pid: pid_t { facts.pid }
    var uid: uid_t { facts.uid }
    var executable: String { facts.executable }
    var isSandboxed: Bool { source.isSandboxed }

    /// Applies the resolution order, strongest first: Flatpak, Snap, registered executable,
    /// XDG unit name, executable path.
    init(facts: ProcessFacts, policy: Policy) {
        self.facts = facts
        let registered = policy.app(forExecutable: facts.executable)
        if let app = facts.flatpakApp {
            (appID, source) = (app, .flatpak)
        } else if let snap = facts.snapName {
            (appID, source) = ("snap.\(snap)", .snap)
        } else if let registered {
            (appID, source) = (registered.appID, .registry)
        } else if let app = facts.unitApp {
            (appID, source) = (app, .systemdUnit)
        } else {
            (appID, source) = (facts.executable, .executable)
        }
        // Only an entry that accepts this source grants a team or Managed=: a scope named
        // like a registered app gains nothing from that app's entry.
        let resolvedID = appID
        let entry = source == .registry ? registered : source.entrySource.flatMap { policy.app(id: resolvedID, from: $0) }
        if let team = entry?.team {
            self.team = team
        } else if source.isSandboxed, appID.contains(".") {
            // A sandbox's reverse-DNS ID implies its team; other sources have none unless granted.
            self.team = String(appID[..<appID.lastIndex(of: ".")!])
        } else {
            self.team = nil
        }
        managed = policy.isManaged(entry: entry, team: team)
        // Computed once per connection: every load counts against them at its start and end.
        buckets = source.isSandboxed ? [.app(appID)] : [.app(appID), .unsandboxedUser(facts.uid)]
    }

    /// The buckets this identity's use of the daemon counts against: its app's; and for an
    /// unsandboxed app, which can take any ID it likes (copy its binary, name its own scope),
    /// also the one every unsandboxed app of its user shares. A sandbox vouches for its ID,
    /// so a sandboxed app has its app's bucket alone.
    let buckets: [Bucket]

    /// Same app: same app ID, and a self-chosen one (a unit or scope name) only with another
    /// self-chosen one, so that naming a scope like a registered or sandboxed app does not make
    /// a process that app. Same team: same app, or both in one named team.
    func isSameApp(as other: AppIdentity) -> Bool {
        appID == other.appID && (source == .systemdUnit) == (other.source == .systemdUnit)
    }
    func isSameTeam(as other: AppIdentity) -> Bool {
        isSameApp(as: other) || (team != nil && team == other.team)
    }
}

/// Whose share of the daemon a use counts against (see `AppIdentity.buckets`).
enum Bucket: Hashable, Sendable, CustomStringConvertible {
    case app(String)
    case unsandboxedUser(uid_t)
    /// Callers whose identity could not be read (their process was gone): one bucket for all.
    case unidentified

    var description: String {
        switch self {
        case .app(let id): id
        case .unsandboxedUser(let uid): "the unsandboxed apps of uid \(uid)"
        case .unidentified: "callers that could not be identified"
        }
    }

    /// The bucket as the subject of a refusal: "com.example.Foo has", "The unsandboxed apps of
    /// uid 1000 have".
    var holder: String {
        if case .app(let id) = self { return "\(id) has" }
        return "\(description.prefix(1).uppercased())\(description.dropFirst()) have"
    }

    /// "its" limit or "their" limit.
    var possessive: String {
        if case .app = self { "its" } else { "their" }
    }
}

/// Resolves identities and caches the kernel's facts per unique bus name; entries die with
/// the connection (NameOwnerChanged).
final class IdentityResolver {
    private var facts: [String: ProcessFacts] = [:]
    private var identities: [String: AppIdentity] = [:]
    private(set) var policy: Policy
    /// The policy's `FlowView.generation`: new with each policy applied.
    private(set) var policyGeneration = FlowView.newGeneration()

    init(policy: Policy) { self.policy = policy }

    func identity(of call: MethodCall) throws(BrokerError) -> AppIdentity {
        try identity(ofName: call.sender, on: call.bus)
    }

    /// The identity of the connection `uniqueName`, e.g. the caller a property reply goes to.
    func identity(ofName uniqueName: String, on bus: Bus) throws(BrokerError) -> AppIdentity {
        if let known = identities[uniqueName] { return known }
        let facts = try Self.readFacts(bus, uniqueName)
        self.facts[uniqueName] = facts
        let identity = AppIdentity(facts: facts, policy: policy)
        identities[uniqueName] = identity
        return identity
    }

    /// The identity of a connection already seen, if it is still known.
    func known(_ uniqueName: String) -> AppIdentity? { identities[uniqueName] }

    /// A new policy changes registry-derived IDs, teams and managed flags, not the facts.
    func apply(_ policy: Policy) {
        self.policy = policy
        policyGeneration = FlowView.newGeneration()
        identities = facts.mapValues { AppIdentity(facts: $0, policy: policy) }
    }

    func forget(_ uniqueName: String) {
        facts.removeValue(forKey: uniqueName)
        identities.removeValue(forKey: uniqueName)
    }

    /// Pins the sender's process with a pidfd, checks the bus still reports that PID for the
    /// connection (so the PID was not recycled in between), and only then reads /proc.
    static func readFacts(_ bus: Bus, _ sender: String) throws(BrokerError) -> ProcessFacts {
        let credentials: Credentials
        do {
            credentials = try bus.credentials(ofName: sender)
        } catch {
            throw BrokerError(.failed, "Failed to read the caller's credentials: \(error.message)")
        }
        let pidfd: FileDescriptor
        do {
            pidfd = try Kernel.openProcess(credentials.pid)
        } catch {
            throw BrokerError(.accessDenied, "The calling process \(credentials.pid) could not be pinned: it may have exited")
        }
        defer { pidfd.closeQuietly() }
        let again: Credentials
        do {
            again = try bus.credentials(ofName: sender)
        } catch {
            throw BrokerError(.accessDenied, "The caller's connection went away while its identity was read")
        }
        guard again.pid == credentials.pid else {
            throw BrokerError(.accessDenied, "The caller's process changed while its identity was read")
        }
        let root = "/proc/\(credentials.pid)"
        let cgroup = (try? String(contentsOfFile: "\(root)/cgroup", encoding: .utf8)).map(Self.cgroupPath) ?? ""
        return ProcessFacts(
            uniqueName: sender, pid: credentials.pid, uid: credentials.euid,
            executable: executable(of: credentials.pid) ?? "unknown",
            flatpakApp: (try? String(contentsOfFile: "\(root)/root/.flatpak-info", encoding: .utf8)).flatMap(flatpakApp(info:)),
            snapName: snapName(cgroup: cgroup),
            unitApp: unitApp(cgroup: cgroup))
    }

    /// The executable's path, without the " (deleted)" suffix the kernel adds for replaced files.
    static func executable(of pid: pid_t) -> String? {
        guard var path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe") else { return nil }
        if path.hasSuffix(" (deleted)") { path.removeLast(" (deleted)".count) }
        return path
    }

    /// `name=` in the `[Application]` group of a .flatpak-info file.
    static func flatpakApp(info: String) -> String? {
        var inApplication = false
        for raw in info.split(separator: "\n") {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.hasPrefix("[") {
                inApplication = line == "[Application]"
            } else if inApplication, line.hasPrefix("name=") {
                let name = String(line.dropFirst("name=".count))
                return name.isEmpty ? nil : name
            }
        }
        return nil
    }

    /// The unified hierarchy's path ("0::/…"), else systemd's named v1 hierarchy.
    static func cgroupPath(_ contents: String) -> String {
        let lines = contents.split(separator: "\n")
        if let unified = lines.first(where: { $0.hasPrefix("0::") }), unified != "0::/" {
            return String(unified.dropFirst(3))
        }
        if let named = lines.first(where: { $0.contains(":name=systemd:") }) {
            return String(named[named.range(of: ":name=systemd:")!.upperBound...])
        }
        return ""
    }

    /// `snap.<name>.<app>.service` or `snap.<name>.<app>-<uuid>.scope` anywhere in the path.
    static func snapName(cgroup: String) -> String? {
        for component in cgroup.split(separator: "/").reversed() where component.hasPrefix("snap.") {
            let parts = component.split(separator: ".")
            if parts.count >= 3, !parts[1].isEmpty { return String(parts[1]) }
        }
        return nil
    }

    /// The app ID of the innermost `app-[<launcher>-]<AppID>[@<random>].service` or
    /// `app-[<launcher>-]<AppID>-<random>.scope` unit in the path.
    static func unitApp(cgroup: String) -> String? {
        for component in cgroup.split(separator: "/").reversed() where component.hasPrefix("app-") {
            var name = component.dropFirst("app-".count)
            var parts: [Substring]
            if name.hasSuffix(".service") {
                name = name.dropLast(".service".count)
                if let at = name.firstIndex(of: "@") { name = name[..<at] }
                parts = name.split(separator: "-", omittingEmptySubsequences: false)
            } else if name.hasSuffix(".scope") {
                name = name.dropLast(".scope".count)
                parts = name.split(separator: "-", omittingEmptySubsequences: false)
                guard parts.count >= 2 else { continue }
                parts.removeLast()  // the random part
            } else {
                continue
            }
            // A launcher prefix is a plain word; app IDs are reverse-DNS.
            if parts.count >= 2, !parts[0].contains(".") { parts.removeFirst() }
            let app = parts.joined(separator: "-").replacingOccurrences(of: "\\x2d", with: "-")
            if !app.isEmpty, app.contains(".") { return app }
        }
        return nil
    }
}

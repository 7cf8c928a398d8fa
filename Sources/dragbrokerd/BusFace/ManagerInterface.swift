import BrokerPolicy
import BrokerProtocol
import BusKit
import Glibc

/// `org.dragbroker.Broker1.Manager` at the manager path: beginning and joining sessions, and
/// the operator's and administrator's calls.
final class ManagerInterface {
    private unowned let daemon: Daemon
    private var exported: ExportedObject?
    private var registry: Registry { daemon.registry }

    init(daemon: Daemon) throws(BusError) {
        self.daemon = daemon
        let dispatcher = daemon.dispatcher
        func method(_ member: ManagerMember, _ body: @escaping (ManagerInterface, MethodCall) throws -> Void) -> MemberBinding {
            .method(dispatcher.serve(member.name) { [unowned self] call in try body(self, call) })
        }
        exported = try daemon.bus.export(
            path: BrokerNames.managerPath, interface: BrokerInterfaces.manager,
            implementation: InterfaceImplementation(ManagerMember.self) { member in
                switch member {
                case .beginSession: method(member) { try $0.beginSession($1) }
                case .presentToken: method(member) { try $0.presentToken($1) }
                case .listSessions: method(member) { try $0.listSessions($1) }
                case .cancelLoad: method(member) { try $0.cancelLoad($1) }
                case .describeSession: method(member) { try $0.describeSession($1) }
                case .cancelSession: method(member) { try $0.cancelSession($1) }
                case .monitor: method(member) { try $0.monitor($1) }
                case .whoAmI: method(member) { try $0.whoAmI($1) }
                case .getPolicy: method(member) { try $0.getPolicy($1) }
                case .reloadPolicy: method(member) { try $0.reloadPolicy($1) }
                case .getUsage: method(member) { try $0.getUsage($1) }
                case .version: .property { m, _ throws(BusError) in try m.append(BrokerVersion.current) }
                case .sessionCount:
                    .property { [unowned self] m, _ throws(BusError) in try m.append(UInt32(try sessionCount(for: m.destination))) }
                case .monitorEvent: .signal
                case .copy: method(member) { try $0.copy($1) }
                }
            })
    }

    /// SessionCount is per caller, so a broadcast can only say that it changed (it is declared
    /// to emit invalidation): each listener reads its own value again.
    func sessionCountChanged() {
        try? daemon.bus.emitPropertiesChanged(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface,
                                               properties: [ManagerMember.sessionCount.name])
    }

    /// How many sessions ListSessions shows `caller`: the count must tell a caller no more than
    /// the list would.
    private func sessionCount(for caller: String?) throws(BusError) -> Int {
        guard let caller else { throw BrokerError(.failed, "SessionCount is read per caller").busError }
        let identity: AppIdentity
        do {
            identity = try daemon.identity(ofName: caller)
        } catch {
            throw error.busError
        }
        return registry.sessions.values.count { $0.mayBeInspected(by: identity) }
    }

    private func beginSession(_ call: MethodCall) throws {
        try offer(call, options: SessionOptions.decode) { source, items, options, provider in
            try registry.begin(source: source, items: items, options: options, providerPath: provider)
        }
    }

    /// As `beginSession`, onto the pasteboard.
    private func copy(_ call: MethodCall) throws {
        try offer(call, options: PasteOptions.decode) { source, items, options, provider in
            try registry.copy(source: source, items: items, options: options, providerPath: provider)
        }
    }

    /// `BeginSession` and `Copy`: the same arguments and answer, for a drag or an entry.
    private func offer<Options>(_ call: MethodCall, options decode: (Message) throws(BrokerError) -> Options,
                                _ begin: (AppIdentity, [ItemDescriptor], Options, String) throws -> Session) throws {
        let m = call.message
        let limits = registry.limits
        let items = try Items.normalize(try readItems(m, limit: limits.itemsPerSession), limits: limits)
        let options = try decode(m)
        let provider = try argument("provider") { () throws(BusError) in try m.readObjectPath() }
        let session = try begin(try daemon.identity(of: call), items, options, provider)
        try reply(call) { r throws(BusError) in
            try r.append(objectPath: session.path)
            try r.append(session.token.hex)
        }
    }

    private func presentToken(_ call: MethodCall) throws {
        let token = try argument("token") { () throws(BusError) in try call.message.readString() }
        let caller = try daemon.identity(of: call)
        let session = try registry.present(token: token, by: caller)
        try reply(call) { r throws(BusError) in try r.append(objectPath: session.path) }
    }

    /// The sessions the caller may inspect (`Session.mayBeInspected`): its own app's, and to an
    /// administrator every one not restricted to another app.
    private func listSessions(_ call: MethodCall) throws {
        let caller = try daemon.identity(of: call)
        let sessions = registry.sessions.values
            .filter { $0.mayBeInspected(by: caller) }
            .sorted { $0.createdAt < $1.createdAt }
        try reply(call) { r throws(BusError) in
            try r.openContainer("a", SessionSummary.signature)
            for session in sessions {
                try SessionSummary(
                    id: session.id, path: session.path, sourceApp: session.source.appID, state: session.state.rawValue,
                    itemCount: UInt32(session.items.count),
                    createdAt: UInt64(session.createdAt.timeIntervalSince1970 * 1_000_000)
                ).encode(to: r)
            }
            try r.closeContainer()
        }
    }

    private func inspectable(_ call: MethodCall) throws(BrokerError) -> (Session, AppIdentity) {
        let id = try argument("session") { () throws(BusError) in try call.message.readString() }
        let caller = try daemon.identity(of: call)
        guard let session = registry.session(id: id), session.mayBeInspected(by: caller) else { throw .notFound("No live session \(id)") }
        return (session, caller)
    }

    /// The full view: every representation whatever its visibility, the destination and the
    /// loads. Only for those who may inspect the session, so it shows them nothing that their
    /// own app or their place outside any sandbox does not already entitle them to.
    private func describeSession(_ call: MethodCall) throws {
        let (session, _) = try inspectable(call)
        let destination = (session.dropDestination ?? session.current).flatMap { session.destinations[$0]?.identity.appID } ?? ""
        let details = SessionDetails(
            id: session.id, state: session.state.rawValue, operation: session.operation.rawValue,
            sourceApp: session.source.appID, sourceTeam: session.source.team ?? "", restricted: session.options.restrictedToApp,
            destinationApp: destination, items: session.items,
            loads: session.loads.values.sorted { $0.id < $1.id }.map {
                SessionDetails.LoadState(id: $0.id, typeIdentifier: $0.typeIdentifier, destinationApp: $0.destination.appID,
                                         bytes: $0.bytes, expected: $0.expected ?? 0)
            })
        try reply(call) { r throws(BusError) in try details.encode(to: r) }
    }

    private func cancelSession(_ call: MethodCall) throws {
        let (session, caller) = try inspectable(call)
        try requireAdministrator(caller, to: "cancel another app's session")
        session.end(outcome: .cancelled, error: BrokerError(.cancelled, "An administrator cancelled the session"))
        try reply(call)
    }

    /// Subscribes the caller to `MonitorEvent` for every session it may inspect, until it
    /// disconnects.
    private func monitor(_ call: MethodCall) throws {
        let caller = try daemon.identity(of: call)
        try daemon.audit.monitors.add(caller)
        try reply(call)
    }

    private func whoAmI(_ call: MethodCall) throws {
        let caller = try daemon.identity(of: call)
        try reply(call) { r throws(BusError) in
            try r.openContainer("a", "{sv}")
            func entry(_ key: String, _ type: Unicode.Scalar, _ append: () throws(BusError) -> Void) throws(BusError) {
                try r.openContainer("e", "sv")
                try r.append(key)
                try r.openContainer("v", String(type))
                try append()
                try r.closeContainer()
                try r.closeContainer()
            }
            try entry("AppID", "s") { () throws(BusError) in try r.append(caller.appID) }
            try entry("Team", "s") { () throws(BusError) in try r.append(caller.team ?? "") }
            try entry("Managed", "b") { () throws(BusError) in try r.append(caller.managed) }
            try entry("Source", "s") { () throws(BusError) in try r.append(caller.source.rawValue) }
            try entry("Sandboxed", "b") { () throws(BusError) in try r.append(caller.isSandboxed) }
            try entry("Executable", "s") { () throws(BusError) in try r.append(caller.executable) }
            try entry("PID", "u") { () throws(BusError) in try r.append(UInt32(caller.pid)) }
            try entry("UID", "u") { () throws(BusError) in try r.append(UInt32(caller.uid)) }
            try r.closeContainer()
        }
    }

    /// The effective policy, each entry with the file and line it came from.
    private func getPolicy(_ call: MethodCall) throws {
        _ = try daemon.identity(of: call)
        let text = registry.policy.render()
        try reply(call) { r throws(BusError) in try r.append(text) }
    }

    /// Administrators as `Session.isAdministrator` defines them, the one definition every door uses.
    private func requireAdministrator(_ caller: AppIdentity, to action: String) throws(BrokerError) {
        guard Session.isAdministrator(caller) else {
            throw .accessDenied("Only root or the user dragbrokerd runs as may \(action), from outside any sandbox")
        }
    }

    private func cancelLoad(_ call: MethodCall) throws {
        let id = try argument("session") { () throws(BusError) in try call.message.readString() }
        let load = try argument("load") { () throws(BusError) in try call.message.readUInt32() }
        let caller = try daemon.identity(of: call)
        try requireAdministrator(caller, to: "cancel another app's load")
        // A session the administrator may not inspect (restricted to another app) is unknown here too.
        guard let session = registry.session(id: id), session.mayBeInspected(by: caller) else {
            throw BrokerError.notFound("No live session \(id)")
        }
        try session.cancelLoad(load, by: caller, asAdministrator: true)
        try reply(call)
    }

    private func reloadPolicy(_ call: MethodCall) throws {
        let caller = try daemon.identity(of: call)
        try requireAdministrator(caller, to: "reload the policy")
        try daemon.reloadPolicy()
        try reply(call)
    }
}

extension ManagerInterface {
    /// What each app and user holds now: their sessions and loads (`Quota`) and the descriptor
    /// threads their files hold (`BlockingWorkers`). Names which apps use the daemon, so an
    /// administrator's.
    private func getUsage(_ call: MethodCall) throws {
        try requireAdministrator(try daemon.identity(of: call), to: "read what every app holds")
        let quota = registry.quota
        let threads = daemon.descriptors.workers
        let busy = Dictionary(uniqueKeysWithValues: threads.usage().map { ($0.owner, $0) })
        let buckets = quota.buckets.union(busy.keys).map { bucket in
            let (sessions, loads) = quota.usage(of: bucket)
            return UsageReport.Bucket(name: bucket.description, sessions: UInt32(clamping: sessions), loads: UInt32(clamping: loads),
                                      descriptorThreads: UInt32(clamping: busy[bucket]?.busy ?? 0),
                                      oldestThreadWait: busy[bucket]?.oldestFor ?? 0)
        }
        let (made, working) = threads.threadCounts
        let report = UsageReport(sessions: UInt32(clamping: registry.count), loads: UInt32(clamping: quota.totalLoads),
                                 threadsMade: UInt32(clamping: made), threadsBusy: UInt32(clamping: working),
                                 buckets: buckets.sorted { $0.name < $1.name })
        try reply(call) { r throws(BusError) in try report.encode(to: r) }
    }
}

import BrokerPolicy
import BrokerProtocol
import BusKit
import Glibc

/// The bus face of the broker: `org.dragbroker.Broker1.Manager` at the manager path.
final class ManagerObject {
    private unowned let broker: Broker
    private var exported: ExportedObject?

    init(broker: Broker) throws(BusError) {
        self.broker = broker
        exported = try broker.bus.export(
            path: BrokerNames.managerPath, interface: BrokerInterfaces.manager,
            implementation: InterfaceImplementation(
                methods: [
                    "BeginSession": serve(broker, "BeginSession") { [unowned self] in try beginSession($0) },
                    "PresentToken": serve(broker, "PresentToken") { [unowned self] in try presentToken($0) },
                    "ListSessions": serve(broker, "ListSessions") { [unowned self] in try listSessions($0) },
                    "WhoAmI": serve(broker, "WhoAmI") { [unowned self] in try whoAmI($0) },
                    "CancelLoad": serve(broker, "CancelLoad") { [unowned self] in try cancelLoad($0) },
                    "DescribeSession": serve(broker, "DescribeSession") { [unowned self] in try describeSession($0) },
                    "CancelSession": serve(broker, "CancelSession") { [unowned self] in try cancelSession($0) },
                    "Monitor": serve(broker, "Monitor") { [unowned self] in try monitor($0) },
                    "GetPolicy": serve(broker, "GetPolicy") { [unowned self] in try getPolicy($0) },
                    "ReloadPolicy": serve(broker, "ReloadPolicy") { [unowned self] in try reloadPolicy($0) },
                ],
                properties: [
                    "Version": { m throws(BusError) in try m.append(BrokerVersion.current) },
                    "SessionCount": { [unowned self] m throws(BusError) in try m.append(UInt32(self.broker.sessions.count)) },
                ]))
    }

    func sessionCountChanged() {
        try? broker.bus.emitPropertiesChanged(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface,
                                               properties: ["SessionCount"])
    }

    private func beginSession(_ call: MethodCall) throws(BrokerError) {
        let m = call.message
        let items = try broker.normalize(try readItems(m, limit: broker.limits.itemsPerSession))
        let options = try SessionOptions.decode(from: m)
        let provider = try argument("provider") { () throws(BusError) in try m.readObjectPath() }
        let source = try broker.identity(of: call)
        let session = try broker.begin(source: source, items: items, options: options, providerPath: provider)
        try reply(call) { r throws(BusError) in
            try r.append(objectPath: session.path)
            try r.append(Broker.hex(session.token))
        }
    }

    private func presentToken(_ call: MethodCall) throws(BrokerError) {
        let token = try argument("token") { () throws(BusError) in try call.message.readString() }
        let caller = try broker.identity(of: call)
        let session = try broker.present(token: token, by: caller)
        try reply(call) { r throws(BusError) in try r.append(objectPath: session.path) }
    }

    /// Restricted sessions are listed to their own app only. Others are listed to their own
    /// app, to unsandboxed callers of the same user, and to root; a sandboxed app sees only
    /// its own sessions.
    private func listSessions(_ call: MethodCall) throws(BrokerError) {
        let caller = try broker.identity(of: call)
        let sessions = broker.sessions.values
            .filter { Self.mayInspect($0, caller) }
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

    /// Restricted sessions are known to their own app only. Others to their own app, to
    /// unsandboxed callers of the source's user, and to root; a sandbox sees only its own.
    static func mayInspect(_ session: Session, _ caller: AppIdentity) -> Bool {
        if caller.isSameApp(as: session.source) { return true }
        guard session.isVisible(to: caller), !caller.isSandboxed else { return false }
        return caller.uid == session.source.uid || caller.uid == 0
    }

    private func inspectable(_ call: MethodCall) throws(BrokerError) -> (Session, AppIdentity) {
        let id = try argument("session") { () throws(BusError) in try call.message.readString() }
        let caller = try broker.identity(of: call)
        guard let session = broker.sessions[id], Self.mayInspect(session, caller) else { throw .notFound("No live session \(id)") }
        return (session, caller)
    }

    private func describeSession(_ call: MethodCall) throws(BrokerError) {
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

    private func cancelSession(_ call: MethodCall) throws(BrokerError) {
        let (session, caller) = try inspectable(call)
        try requireAdministrator(caller, to: "cancel another app's session")
        broker.end(session, outcome: "cancelled", error: BrokerError(.cancelled, "An administrator cancelled the session"))
        try reply(call)
    }

    /// Subscribes the caller to `MonitorEvent` for every session it may inspect, until it
    /// disconnects.
    private func monitor(_ call: MethodCall) throws(BrokerError) {
        let caller = try broker.identity(of: call)
        try broker.monitors.add(caller)
        try reply(call)
    }

    private func whoAmI(_ call: MethodCall) throws(BrokerError) {
        let caller = try broker.identity(of: call)
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
    private func getPolicy(_ call: MethodCall) throws(BrokerError) {
        _ = try broker.identity(of: call)
        let text = broker.policy.render()
        try reply(call) { r throws(BusError) in try r.append(text) }
    }

    /// Administrators: root or the user the daemon runs as, never from a sandbox.
    private func requireAdministrator(_ caller: AppIdentity, to action: String) throws(BrokerError) {
        guard !caller.isSandboxed, caller.uid == 0 || caller.uid == getuid() else {
            throw .accessDenied("Only root or the user dragbrokerd runs as may \(action), from outside any sandbox")
        }
    }

    private func cancelLoad(_ call: MethodCall) throws(BrokerError) {
        let id = try argument("session") { () throws(BusError) in try call.message.readString() }
        let load = try argument("load") { () throws(BusError) in try call.message.readUInt32() }
        let caller = try broker.identity(of: call)
        try requireAdministrator(caller, to: "cancel another app's load")
        guard let session = broker.sessions[id] else { throw .notFound("No live session \(id)") }
        try broker.cancelLoad(load, by: caller, in: session, asAdministrator: true)
        try reply(call)
    }

    private func reloadPolicy(_ call: MethodCall) throws(BrokerError) {
        let caller = try broker.identity(of: call)
        try requireAdministrator(caller, to: "reload the policy")
        try broker.reloadPolicy()
        try reply(call)
    }
}

/// Reads the `a(sdda(sss))` items argument, stopping as soon as the limit is passed.
func readItems(_ m: Message, limit: Int) throws(BrokerError) -> [ItemDescriptor] {
    var items: [ItemDescriptor] = []
    _ = try argument("items") { () throws(BusError) in try m.enterContainer("a", ItemDescriptor.signature) }
    while let item = try ItemDescriptor.decode(from: m) {
        guard items.count < limit else {
            throw .limitExceeded("A session holds at most \(limit) items")
        }
        items.append(item)
    }
    try argument("items") { () throws(BusError) in try m.exitContainer() }
    return items
}

enum BrokerVersion {
    static let current = "0.1.0"
}

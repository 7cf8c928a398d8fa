import BrokerProtocol
import BusKit

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
                    "BeginSession": serve { [unowned self] in try beginSession($0) },
                    "PresentToken": serve { [unowned self] in try presentToken($0) },
                    "ListSessions": serve { [unowned self] in try listSessions($0) },
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
        let limits = broker.limits
        let m = call.message
        var items: [ItemDescriptor] = []
        _ = try argument("items") { () throws(BusError) in try m.enterContainer("a", ItemDescriptor.signature) }
        while let item = try ItemDescriptor.decode(from: m) {
            guard items.count < limits.itemsPerSession else {
                throw .limitExceeded("A session holds at most \(limits.itemsPerSession) items")
            }
            items.append(item)
        }
        try argument("items") { () throws(BusError) in try m.exitContainer() }
        let options = try SessionOptions.decode(from: m)
        let provider = try argument("provider") { () throws(BusError) in try m.readObjectPath() }

        try validate(items)
        let source = try broker.identity(of: call)
        let session = try broker.begin(source: source, items: items, options: options, providerPath: provider)
        try reply(call) { r throws(BusError) in
            try r.append(objectPath: session.path)
            try r.append(Broker.hex(session.token))
        }
    }

    private func validate(_ items: [ItemDescriptor]) throws(BrokerError) {
        let limits = broker.limits
        guard !items.isEmpty else { throw .invalidArgument("A drag needs at least one item") }
        for (index, item) in items.enumerated() {
            guard item.suggestedName.utf8.count <= limits.suggestedNameLength else {
                throw .limitExceeded("Item \(index): the suggested name is longer than \(limits.suggestedNameLength) bytes")
            }
            guard !item.representations.isEmpty else {
                throw .invalidArgument("Item \(index) has no representation")
            }
            guard item.representations.count <= limits.representationsPerItem else {
                throw .limitExceeded("Item \(index) has \(item.representations.count) representations (limit \(limits.representationsPerItem))")
            }
            guard item.preferredWidth.isFinite, item.preferredHeight.isFinite, item.preferredWidth >= 0, item.preferredHeight >= 0 else {
                throw .invalidArgument("Item \(index): the preferred size must be finite and not negative")
            }
            var seen = Set<String>()
            for representation in item.representations {
                let type = representation.typeIdentifier
                guard !type.isEmpty, type.utf8.count <= limits.typeIdentifierLength else {
                    throw .invalidArgument("Item \(index): a type identifier must have 1 to \(limits.typeIdentifierLength) bytes")
                }
                guard seen.insert(type).inserted else {
                    throw .invalidArgument("Item \(index) declares the type '\(type)' twice")
                }
            }
        }
    }

    private func presentToken(_ call: MethodCall) throws(BrokerError) {
        let token = try argument("token") { () throws(BusError) in try call.message.readString() }
        let caller = try broker.identity(of: call)
        let session = try broker.present(token: token, by: caller)
        try reply(call) { r throws(BusError) in try r.append(objectPath: session.path) }
    }

    private func listSessions(_ call: MethodCall) throws(BrokerError) {
        let sessions = broker.sessions.values.sorted { $0.createdAt < $1.createdAt }
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
}

enum BrokerVersion {
    static let current = "0.1.0"
}

import BrokerProtocol
import BusKit
import UniformTypes
import Glibc

/// The bus face of one session: `org.dragbroker.Broker1.Session` at the session's path.
/// Its signals are unicast, so only the session's parties ever receive them.
final class SessionObject {
    private unowned let broker: Broker
    private unowned let session: Session
    /// What sd-bus calls for this session's path, found through the broker's session subtree.
    private(set) var handlers: ObjectHandlers?

    /// The member table the subtree is built from; each session supplies its own handlers.
    static var template: InterfaceImplementation {
        let refuse: InterfaceImplementation.MethodHandler = { _ throws(BusError) in throw BrokerError.notFound("No such session").busError }
        let none: InterfaceImplementation.PropertyGetter = { _ throws(BusError) in throw BrokerError.notFound("No such session").busError }
        return InterfaceImplementation(
            methods: Dictionary(uniqueKeysWithValues: BrokerInterfaces.session.methods.map { ($0.name, refuse) }),
            properties: Dictionary(uniqueKeysWithValues: BrokerInterfaces.session.properties.map { ($0.name, none) }))
    }

    init(broker: Broker, session: Session) {
        self.broker = broker
        self.session = session
        handlers = broker.bus.handlers(for: InterfaceImplementation(
                methods: [
                    "GetItems": serve(broker, "GetItems", session: session) { [unowned self] in try getItems($0) },
                    "ConformingItems": serve(broker, "ConformingItems", session: session) { [unowned self] in try conformingItems($0) },
                    "AddItems": serve(broker, "AddItems", session: session) { [unowned self] in try addItems($0) },
                    "Enter": serve(broker, "Enter", session: session) { [unowned self] in try propose($0, entering: true) },
                    "Update": serve(broker, "Update", session: session) { [unowned self] in try propose($0, entering: false) },
                    "Exit": serve(broker, "Exit", session: session) { [unowned self] in try exit($0) },
                    "PerformDrop": serve(broker, "PerformDrop", session: session) { [unowned self] in try performDrop($0) },
                    "Load": serve(broker, "Load", session: session, subject: { m in
                        _ = try? m.readUInt32()
                        return try? m.readString()
                    }) { [unowned self] in try load($0) },
                    "CancelLoad": serve(broker, "CancelLoad", session: session) { [unowned self] in try cancelLoad($0) },
                    "SetExpectedSize": serve(broker, "SetExpectedSize", session: session) { [unowned self] in try setExpectedSize($0) },
                    "Conclude": serve(broker, "Conclude", session: session) { [unowned self] in try conclude($0) },
                    "Cancel": serve(broker, "Cancel", session: session) { [unowned self] in try cancel($0) },
                ],
                properties: [
                    "Id": { [unowned self] m throws(BusError) in try readable(m) { m throws(BusError) in try m.append(self.session.id) } },
                    "SourceApp": { [unowned self] m throws(BusError) in try readable(m) { m throws(BusError) in try m.append(self.session.source.appID) } },
                    "State": { [unowned self] m throws(BusError) in try readable(m) { m throws(BusError) in try m.append(self.session.state.rawValue) } },
                    "ItemCount": { [unowned self] m throws(BusError) in try readable(m) { m throws(BusError) in try m.append(UInt32(self.session.items.count)) } },
                    "Operation": { [unowned self] m throws(BusError) in try readable(m) { m throws(BusError) in try m.append(self.session.operation.rawValue) } },
                    "Progress": { [unowned self] m throws(BusError) in
                        try readable(m) { m throws(BusError) in
                            let (done, expected) = self.progress
                            try m.openContainer("r", "tt")
                            try m.append(done)
                            try m.append(expected)
                            try m.closeContainer()
                        }
                    },
                ]))
    }

    /// Properties are for the session's parties and those who may inspect it (as ListSessions
    /// decides); anyone else, and every other app for a restricted session, is refused.
    private func readable(_ reply: Message, _ append: (Message) throws(BusError) -> Void) throws(BusError) {
        guard let caller = reply.destination else { return try append(reply) }
        let identity: AppIdentity
        do {
            identity = try broker.identity(ofName: caller)
        } catch {
            throw error.busError
        }
        let party = caller == session.source.uniqueName || session.destinations[caller] != nil
        guard party || ManagerObject.mayInspect(session, identity) else {
            throw BrokerError.accessDenied("Session \(session.id)'s properties are for its parties").busError
        }
        try append(reply)
    }

    // MARK: Methods

    private func getItems(_ call: MethodCall) throws(BrokerError) {
        let caller = try broker.identity(of: call)
        try broker.requireParticipant(caller, session)
        let items = session.visibleItems(for: caller)
        try reply(call) { r throws(BusError) in
            try r.openContainer("a", VisibleItem.signature)
            for (_, item) in items { try item.encode(to: r) }
            try r.closeContainer()
        }
    }

    /// "hasItemsConforming": which items (as the caller numbers them) have a representation
    /// it can see that conforms to a MIME type, a wildcard or a UTI.
    private func conformingItems(_ call: MethodCall) throws(BrokerError) {
        let pattern = try argument("type") { () throws(BusError) in try call.message.readString() }
        do {
            try MimeDatabase.validatePattern(pattern)
        } catch {
            throw .invalidArgument(error.message)
        }
        let caller = try broker.identity(of: call)
        try broker.requireParticipant(caller, session)
        let matching = session.visibleItems(for: caller).enumerated().compactMap { viewIndex, entry -> UInt32? in
            entry.item.typeIdentifiers.contains { type in
                (try? TypeIdentifier(type)).map { broker.types.conforms($0, to: pattern) } ?? false
            } ? UInt32(viewIndex) : nil
        }
        try reply(call) { r throws(BusError) in
            try r.openContainer("a", "u")
            for index in matching { try r.append(index) }
            try r.closeContainer()
        }
    }

    private func addItems(_ call: MethodCall) throws(BrokerError) {
        let items = try broker.normalize(try readItems(call.message, limit: broker.limits.itemsPerSession))
        let caller = try broker.identity(of: call)
        try broker.addItems(items, by: caller, to: session)
        try reply(call)
    }

    private func propose(_ call: MethodCall, entering: Bool) throws(BrokerError) {
        let name = try argument("proposal") { () throws(BusError) in try call.message.readString() }
        guard let proposal = DropOperation(rawValue: name) else {
            throw .invalidArgument("Unknown proposal '\(name)': expected cancel, forbidden, copy or move")
        }
        let caller = try broker.identity(of: call)
        let allowed = try broker.propose(proposal, by: caller, in: session, entering: entering)
        try reply(call) { r throws(BusError) in try r.append(allowed.rawValue) }
    }

    private func exit(_ call: MethodCall) throws(BrokerError) {
        let caller = try broker.identity(of: call)
        try broker.exit(by: caller, from: session)
        try reply(call)
    }

    private func performDrop(_ call: MethodCall) throws(BrokerError) {
        let caller = try broker.identity(of: call)
        let operation = try broker.performDrop(by: caller, in: session)
        try reply(call) { r throws(BusError) in try r.append(operation.rawValue) }
    }

    /// Data loads answer at once with a pipe; file loads once the source has handed the file
    /// over, so this call may be answered later, from a provider reply.
    private func load(_ call: MethodCall) throws(BrokerError) {
        let item = try argument("item") { () throws(BusError) in try call.message.readUInt32() }
        let type = try argument("type") { () throws(BusError) in try call.message.readString() }
        let caller = try broker.identity(of: call)
        try broker.load(item: item, type: type, by: caller, in: session) { [weak self] result in
            guard let self else {
                if !call.answered { call.fail(BrokerError.notFound("The session ended").busError) }
                return
            }
            answerLoad(call, type: type, result)
        }
    }

    private func answerLoad(_ call: MethodCall, type: String, _ result: Result<(fd: Int32, id: UInt32, kind: RepresentationKind), BrokerError>) {
        guard !call.answered else { return }
        switch result {
        case .success(let answer):
            do {
                try call.reply { r throws(BusError) in
                    try r.append(fileDescriptor: answer.fd)
                    try r.append(answer.id)
                    try r.append(answer.kind.rawValue)
                }
            } catch {
                call.fail(BrokerError(.failed, "Failed to send the reply: \(error.message)").busError)
            }
        case .failure(let error):
            broker.recordRefusal(error, sender: call.sender, action: "Load", session: session, subject: type)
            call.fail(error.busError)
        }
    }

    private func cancelLoad(_ call: MethodCall) throws(BrokerError) {
        let id = try argument("load") { () throws(BusError) in try call.message.readUInt32() }
        let caller = try broker.identity(of: call)
        try broker.requireParticipant(caller, session)
        try broker.cancelLoad(id, by: caller, in: session)
        try reply(call)
    }

    private func setExpectedSize(_ call: MethodCall) throws(BrokerError) {
        let id = try argument("load") { () throws(BusError) in try call.message.readUInt32() }
        let size = try argument("size") { () throws(BusError) in try call.message.readUInt64() }
        let caller = try broker.identity(of: call)
        try broker.setExpectedSize(size, load: id, by: caller, in: session)
        try reply(call)
    }

    private func conclude(_ call: MethodCall) throws(BrokerError) {
        let caller = try broker.identity(of: call)
        try broker.conclude(by: caller, session)
        try reply(call)
    }

    private func cancel(_ call: MethodCall) throws(BrokerError) {
        let caller = try broker.identity(of: call)
        try broker.cancel(session, by: caller)
        try reply(call)
    }

    // MARK: Events

    /// PropertiesChanged is broadcast, so a restricted session keeps its changes to itself.
    private var announces: Bool { !session.options.restrictedToApp }

    func itemsChanged() {
        guard announces else { return }
        try? broker.bus.emitPropertiesChanged(path: session.path, interface: BrokerNames.sessionInterface, properties: ["ItemCount"])
    }

    func stateChanged() {
        guard announces else { return }
        try? broker.bus.emitPropertiesChanged(path: session.path, interface: BrokerNames.sessionInterface,
                                               properties: ["State", "Operation"])
    }

    private var parties: [String] {
        [session.source.uniqueName] + session.destinations.keys.filter { $0 != session.source.uniqueName }.sorted()
    }

    private func emit(_ member: String, to destination: String, _ build: (Message) throws(BusError) -> Void = { _ in }) {
        do {
            try broker.bus.emitSignal(path: session.path, interface: BrokerNames.sessionInterface, member: member,
                                      destination: destination, build)
        } catch {
            broker.logger.warning("Failed to emit \(member) to \(destination): \(error), ignoring")
        }
    }

    func emitWillEnd() {
        let operation = session.operation.rawValue
        emit("WillEnd", to: session.source.uniqueName) { m throws(BusError) in try m.append(operation) }
    }

    /// Tells the source and every destination that the session ended, and why when it failed.
    func emitEnded(error: BrokerError?) {
        let operation = error == nil ? session.operation : (session.state == .active ? .cancel : session.operation)
        for party in parties {
            emit("Ended", to: party) { m throws(BusError) in
                try m.append(operation.rawValue)
                try m.append(error?.code.busName ?? "")
                try m.append(error?.message ?? "")
            }
        }
    }

    func emitTransferFinished() {
        emit("TransferFinished", to: session.source.uniqueName)
    }

    /// Bytes done (finished loads and those in flight) and expected (announced sizes).
    var progress: (UInt64, UInt64) {
        let inFlight = session.loads.values.reduce(UInt64(0)) { $0 + $1.bytes }
        let expected = session.loads.values.reduce(session.finishedBytes) { $0 + ($1.expected ?? $1.bytes) }
        return (session.finishedBytes + inFlight, expected)
    }

    /// To both ends of the load, so a source can show progress as the destination does.
    func emitLoadProgress(_ load: Load) {
        let bytes = load.bytes
        let expected = load.expected ?? 0
        for party in Set([load.destination.uniqueName, session.source.uniqueName]) {
            emit("LoadProgress", to: party) { m throws(BusError) in
                try m.append(load.id)
                try m.append(bytes)
                try m.append(expected)
            }
        }
        if announces {
            try? broker.bus.emitPropertiesChanged(path: session.path, interface: BrokerNames.sessionInterface, properties: ["Progress"])
        }
    }

    /// To both ends: the destination learns whether every byte arrived, the source whether
    /// the destination cancelled.
    func emitLoadFinished(_ load: Load, bytes: UInt64, error: BrokerError?) {
        for party in Set([load.destination.uniqueName, session.source.uniqueName]) {
            emit("LoadFinished", to: party) { m throws(BusError) in
                try m.append(load.id)
                try m.append(bytes)
                try m.append(error?.code.busName ?? "")
                try m.append(error?.message ?? "")
            }
        }
        if announces {
            try? broker.bus.emitPropertiesChanged(path: session.path, interface: BrokerNames.sessionInterface, properties: ["Progress"])
        }
    }
}

import BrokerProtocol
import BusKit
import UniformTypes

/// `org.dragbroker.Broker1.Session`, served for every session object under one prefix by one
/// set of handlers: each finds its session from the object path in one dictionary probe.
/// Session objects exist per caller: a restricted session is no object at all for another app,
/// not in introspection, not in ObjectManager, not to call. Signals are unicast, so only the
/// session's parties ever receive them.
final class SessionInterface {
    private unowned let daemon: Daemon
    private var subtree: ExportedSubtree?
    private var retired: Slot?
    private var managedObjects: Slot?
    private var handlers: ObjectHandlers?
    private var registry: Registry { daemon.registry }
    private var bus: Bus { daemon.bus }

    init(daemon: Daemon) throws(BusError) {
        self.daemon = daemon
        let implementation = self.implementation
        handlers = bus.handlers(for: implementation)
        let prefix = String(BrokerNames.sessionPath(id: "").dropLast())
        subtree = try bus.exportSubtree(
            prefix: prefix, interface: BrokerInterfaces.session, template: implementation,
            find: { [unowned self] path, caller in
                guard let session = registry.session(atPath: path), isAddressable(session, by: caller, identity(of: caller)) else {
                    return nil
                }
                return handlers
            },
            enumerate: { [unowned self] caller in
                let identity = identity(of: caller)
                return registry.sessions.values.filter { isListed($0, to: caller, identity) }.map(\.path).sorted()
            })
        // sd-bus answers GetManagedObjects by asking every child's find callback and each
        // of its property getters one by one; at 10,000 sessions that walk alone outlasts the
        // bench's 100 ms. The registry answers it in one pass, with the same contents.
        managedObjects = try bus.addObjectFilter(path: BrokerNames.managerPath) { [unowned self] call in
            guard call.message.interface == "org.freedesktop.DBus.ObjectManager", call.message.member == "GetManagedObjects" else {
                return false
            }
            getManagedObjects(call)
            return true
        }
        // A call on a session that ended, or that does not exist for the caller, gets a broker
        // error, not sd-bus's UnknownObject.
        retired = try bus.addFallback(prefix: prefix) { [unowned self] call in
            guard call.message.interface == BrokerNames.sessionInterface, let path = call.message.path else { return false }
            if let session = registry.session(atPath: path), isAddressable(session, by: call.sender, identity(of: call.sender)) {
                return false
            }
            call.fail(BrokerError.notFound("No live session at \(path): it ended or never existed").busError)
            return true
        }
    }

    /// The identity of whoever sd-bus is serving, once per question however many sessions it
    /// covers; nil for our own emissions, or a caller that can no longer be identified.
    private func identity(of caller: String?) -> AppIdentity? {
        caller.flatMap { try? daemon.identity(ofName: $0) }
    }

    /// Whether `caller` may address the session's object at all: a restricted session exists
    /// only for its own app. Our own emissions have no caller.
    private func isAddressable(_ session: Session, by caller: String?, _ identity: AppIdentity?) -> Bool {
        guard session.options.restrictedToApp, caller != nil else { return true }
        return identity?.isSameApp(as: session.source) == true
    }

    /// Whether the session's object shows among the manager's children for `caller`: to
    /// its parties and to those who may inspect it, as ListSessions decides.
    private func isListed(_ session: Session, to caller: String?, _ identity: AppIdentity?) -> Bool {
        guard let caller else { return true }
        return session.isParty(caller) || identity.map(session.mayBeInspected(by:)) == true
    }

    // MARK: Members

    private var implementation: InterfaceImplementation {
        let dispatcher = daemon.dispatcher
        let atPath: (MethodCall) -> (session: Session?, subject: String?) = { [unowned self] call in
            (call.message.path.flatMap(registry.session(atPath:)), nil)
        }
        func method(_ name: String, _ body: @escaping (SessionInterface, MethodCall, Session) throws -> Void) -> (String, InterfaceImplementation.MethodHandler) {
            (name, dispatcher.serve(name, context: atPath) { [unowned self] call in try body(self, call, try session(of: call)) })
        }
        func property(_ name: String, _ append: @escaping (Session, Message) throws(BusError) -> Void) -> (String, InterfaceImplementation.PropertyGetter) {
            (name, { [unowned self] reply, path throws(BusError) in
                guard let session = registry.session(atPath: path) else { throw BrokerError.notFound("No such session").busError }
                try readable(session, reply) { m throws(BusError) in try append(session, m) }
            })
        }
        let loadContext: (MethodCall) -> (session: Session?, subject: String?) = { [unowned self] call in
            _ = try? call.message.readUInt32()
            return (call.message.path.flatMap(registry.session(atPath:)), try? call.message.readString())
        }
        return InterfaceImplementation(
            methods: Dictionary(uniqueKeysWithValues: [
                method("GetItems") { try $0.getItems($1, $2) },
                method("ConformingItems") { try $0.conformingItems($1, $2) },
                method("AddItems") { try $0.addItems($1, $2) },
                method("Enter") { try $0.propose($1, $2, entering: true) },
                method("Update") { try $0.propose($1, $2, entering: false) },
                method("Exit") { try $0.exit($1, $2) },
                method("PerformDrop") { try $0.performDrop($1, $2) },
                ("Load", dispatcher.serve("Load", context: loadContext) { [unowned self] call in try load(call, try session(of: call)) }),
                method("CancelLoad") { try $0.cancelLoad($1, $2) },
                method("SetExpectedSize") { try $0.setExpectedSize($1, $2) },
                method("Conclude") { try $0.conclude($1, $2) },
                method("Cancel") { try $0.cancel($1, $2) },
            ]),
            properties: Dictionary(uniqueKeysWithValues: Property.allCases.map { entry in
                property(entry.name) { session, m throws(BusError) in try m.write { entry.append(session, to: &$0) } }
            }))
    }

    /// The session's properties: their getters and GetManagedObjects both append from here.
    private enum Property: CaseIterable {
        case id, sourceApp, state, itemCount, operation, progress

        var name: String {
            switch self {
            case .id: "Id"
            case .sourceApp: "SourceApp"
            case .state: "State"
            case .itemCount: "ItemCount"
            case .operation: "Operation"
            case .progress: "Progress"
            }
        }

        var signature: StaticString {
            switch self {
            case .id, .sourceApp, .state, .operation: "s"
            case .itemCount: "u"
            case .progress: "(tt)"
            }
        }

        func append(_ session: Session, to w: inout MessageWriter) {
            switch self {
            case .id: w.append(session.id)
            case .sourceApp: w.append(session.source.appID)
            case .state: w.append(session.state.rawValue)
            case .itemCount: w.append(UInt32(session.items.count))
            case .operation: w.append(session.operation.rawValue)
            case .progress:
                let (done, expected) = session.progress
                w.open("r", "tt")
                w.append(done)
                w.append(expected)
                w.close()
            }
        }
    }

    private func session(of call: MethodCall) throws(BrokerError) -> Session {
        guard let path = call.message.path, let session = registry.session(atPath: path) else {
            throw .notFound("No live session at \(call.message.path ?? "?"): it ended or never existed")
        }
        return session
    }

    /// Properties are for the session's parties and those who may inspect it (as ListSessions
    /// decides); anyone else, and every other app for a restricted session, is refused.
    private func readable(_ session: Session, _ reply: Message, _ append: (Message) throws(BusError) -> Void) throws(BusError) {
        guard let caller = reply.destination else { return try append(reply) }
        let identity: AppIdentity
        do {
            identity = try daemon.identity(ofName: caller)
        } catch {
            throw error.busError
        }
        guard session.isParty(caller) || session.mayBeInspected(by: identity) else {
            throw BrokerError.accessDenied("Session \(session.id)'s properties are for its parties").busError
        }
        try append(reply)
    }

    /// `org.freedesktop.DBus.ObjectManager.GetManagedObjects` on the manager path: every
    /// session the caller may see, with the standard interfaces sd-bus lists for each object
    /// and the session's properties, as sd-bus's own walk would answer.
    private func getManagedObjects(_ call: MethodCall) {
        let caller = call.sender
        let identity = identity(of: caller)
        do {
            try reply(call) { r throws(BusError) in
                let properties = Property.allCases
                try r.write { w in
                    w.open("a", "{oa{sa{sv}}}")
                    for session in registry.sessions.values
                    where isListed(session, to: caller, identity) && isAddressable(session, by: caller, identity) {
                        w.open("e", "oa{sa{sv}}")
                        w.append(objectPath: session.path)
                        w.open("a", "{sa{sv}}")
                        // sd-bus lists the standard interfaces of every object, each without properties.
                        for standard in ["org.freedesktop.DBus.Peer", "org.freedesktop.DBus.Introspectable", "org.freedesktop.DBus.Properties"] {
                            w.open("e", "sa{sv}")
                            w.append(standard)
                            w.open("a", "{sv}")
                            w.close()
                            w.close()
                        }
                        w.open("e", "sa{sv}")
                        w.append(BrokerNames.sessionInterface)
                        w.open("a", "{sv}")
                        for property in properties {
                            w.open("e", "sv")
                            w.append(property.name)
                            w.open("v", property.signature)
                            property.append(session, to: &w)
                            w.close()
                            w.close()
                        }
                        w.close()
                        w.close()
                        w.close()
                        w.close()
                    }
                    w.close()
                }
            }
        } catch {
            daemon.dispatcher.fail(call, error, action: "GetManagedObjects", session: nil, subject: nil)
        }
    }

    // MARK: Methods

    private func getItems(_ call: MethodCall, _ session: Session) throws {
        let caller = try daemon.identity(of: call)
        try session.requireParticipant(caller)
        let items = session.visibleItems(for: caller, flow: registry.flow)
        try reply(call) { r throws(BusError) in
            try r.openContainer("a", VisibleItem.signature)
            for (_, item) in items { try item.encode(to: r) }
            try r.closeContainer()
        }
    }

    /// "hasItemsConforming": which items (as the caller numbers them) have a representation
    /// it can see that conforms to a MIME type, a wildcard or a UTI.
    private func conformingItems(_ call: MethodCall, _ session: Session) throws {
        let pattern = try argument("type") { () throws(BusError) in try call.message.readString() }
        do {
            try MimeDatabase.validatePattern(pattern)
        } catch {
            throw BrokerError.invalidArgument(error.message)
        }
        let caller = try daemon.identity(of: call)
        try session.requireParticipant(caller)
        let types = registry.types
        let matching = session.visibleItems(for: caller, flow: registry.flow).enumerated().compactMap { viewIndex, entry -> UInt32? in
            entry.item.typeIdentifiers.contains { type in
                (try? TypeIdentifier(type)).map { types.conforms($0, to: pattern) } ?? false
            } ? UInt32(viewIndex) : nil
        }
        try reply(call) { r throws(BusError) in
            try r.openContainer("a", "u")
            for index in matching { try r.append(index) }
            try r.closeContainer()
        }
    }

    private func addItems(_ call: MethodCall, _ session: Session) throws {
        let limits = registry.limits
        let items = try Items.normalize(try readItems(call.message, limit: limits.itemsPerSession), limits: limits)
        let caller = try daemon.identity(of: call)
        try session.addItems(items, by: caller, limit: limits.itemsPerSession, flow: registry.flow)
        try reply(call)
    }

    private func propose(_ call: MethodCall, _ session: Session, entering: Bool) throws {
        let name = try argument("proposal") { () throws(BusError) in try call.message.readString() }
        guard let proposal = DropOperation(rawValue: name) else {
            throw BrokerError.invalidArgument("Unknown proposal '\(name)': expected cancel, forbidden, copy or move")
        }
        let caller = try daemon.identity(of: call)
        let allowed = try session.propose(proposal, by: caller, entering: entering, flow: registry.flow)
        try reply(call) { r throws(BusError) in try r.append(allowed.rawValue) }
    }

    private func exit(_ call: MethodCall, _ session: Session) throws {
        let caller = try daemon.identity(of: call)
        try session.exit(by: caller)
        try reply(call)
    }

    private func performDrop(_ call: MethodCall, _ session: Session) throws {
        let caller = try daemon.identity(of: call)
        let operation = try session.performDrop(by: caller)
        try reply(call) { r throws(BusError) in try r.append(operation.rawValue) }
    }

    /// Data loads answer at once with a pipe; file loads once the source has handed the file
    /// over, so this call may be answered later, from a provider reply.
    private func load(_ call: MethodCall, _ session: Session) throws {
        let item = try argument("item") { () throws(BusError) in try call.message.readUInt32() }
        let type = try argument("type") { () throws(BusError) in try call.message.readString() }
        let caller = try daemon.identity(of: call)
        let request = try session.authorizeLoad(item: item, type: type, by: caller, rules: daemon.loadRules)
        let load = Load(request)
        let source = LoadSource(bus: bus, sessionPath: session.path, app: session.source, providerPath: session.providerPath,
                                limits: { [unowned daemon] in daemon.registry.limits })
        let dispatcher = daemon.dispatcher
        try load.start(from: source) { [weak session] answer in
            switch answer {
            case .success(let (fd, kind)):
                do {
                    try reply(call) { r throws(BusError) in
                        try r.append(fileDescriptor: fd.rawValue)
                        try r.append(load.id)
                        try r.append(kind.rawValue)
                    }
                } catch {
                    dispatcher.fail(call, error, action: "Load", session: session, subject: type)
                }
            case .failure(let error):
                dispatcher.fail(call, error, action: "Load", session: session, subject: type)
            }
        }
        session.track(load)
    }

    private func cancelLoad(_ call: MethodCall, _ session: Session) throws {
        let id = try argument("load") { () throws(BusError) in try call.message.readUInt32() }
        let caller = try daemon.identity(of: call)
        try session.requireParticipant(caller)
        try session.cancelLoad(id, by: caller)
        try reply(call)
    }

    private func setExpectedSize(_ call: MethodCall, _ session: Session) throws {
        let id = try argument("load") { () throws(BusError) in try call.message.readUInt32() }
        let size = try argument("size") { () throws(BusError) in try call.message.readUInt64() }
        let caller = try daemon.identity(of: call)
        try session.setExpectedSize(size, load: id, by: caller)
        try reply(call)
    }

    private func conclude(_ call: MethodCall, _ session: Session) throws {
        let caller = try daemon.identity(of: call)
        try session.conclude(by: caller)
        try reply(call)
    }

    private func cancel(_ call: MethodCall, _ session: Session) throws {
        let caller = try daemon.identity(of: call)
        try session.cancel(by: caller)
        try reply(call)
    }

    // MARK: Signals, from the model's events

    func publish(_ session: Session, _ event: SessionEvent) {
        switch event {
        case .began:
            // ObjectManager signals are broadcast: a restricted session must not announce itself.
            if announces(session) { try? bus.emitObjectAdded(path: session.path) }
        case .itemsAdded:
            propertiesChanged(session, ["ItemCount"])
        case .dropped:
            propertiesChanged(session, ["State", "Operation"])
            let operation = session.operation.rawValue
            emit(session, "WillEnd", to: session.source.uniqueName) { m throws(BusError) in try m.append(operation) }
        case .concluded:
            propertiesChanged(session, ["State", "Operation"])
            emitEnded(session, error: nil)
        case .loadProgressed(let load), .loadSizeAnnounced(let load):
            emitLoadProgress(session, load)
        case .loadFinished(let load, let error):
            let bytes = load.bytes
            for party in Set([load.destination.uniqueName, session.source.uniqueName]) where party != session.departed {
                emit(session, "LoadFinished", to: party) { m throws(BusError) in
                    try m.append(load.id)
                    try m.append(bytes)
                    try m.append(error?.code.busName ?? "")
                    try m.append(error?.message ?? "")
                }
            }
            propertiesChanged(session, ["Progress"])
        case .transferFinished:
            emit(session, "TransferFinished", to: session.source.uniqueName)
        case .ended(_, let error):
            if session.state != .concluded { emitEnded(session, error: error) }
            if announces(session) { try? bus.emitObjectRemoved(path: session.path) }
        case .proposed, .exited, .flowDenied, .loadStarted:
            break
        }
    }

    /// PropertiesChanged is broadcast, so a restricted session keeps its changes to itself.
    private func announces(_ session: Session) -> Bool { !session.options.restrictedToApp }

    private func propertiesChanged(_ session: Session, _ names: [String]) {
        guard announces(session) else { return }
        try? bus.emitPropertiesChanged(path: session.path, interface: BrokerNames.sessionInterface, properties: names)
    }

    /// Those who hear the session's signals: the source, then the destinations, less any that left.
    private func parties(_ session: Session) -> [String] {
        ([session.source.uniqueName] + session.destinations.keys.filter { $0 != session.source.uniqueName }.sorted())
            .filter { $0 != session.departed }
    }

    private func emit(_ session: Session, _ member: String, to destination: String, _ build: (Message) throws(BusError) -> Void = { _ in }) {
        do {
            try bus.emitSignal(path: session.path, interface: BrokerNames.sessionInterface, member: member,
                               destination: destination, build)
        } catch {
            daemon.logger.warning("Failed to emit \(member) to \(destination): \(error), ignoring")
        }
    }

    /// Tells the source and every destination that the session ended, and why when it failed.
    private func emitEnded(_ session: Session, error: BrokerError?) {
        let operation = error == nil ? session.operation : (session.state == .active ? .cancel : session.operation)
        for party in parties(session) {
            emit(session, "Ended", to: party) { m throws(BusError) in
                try m.append(operation.rawValue)
                try m.append(error?.code.busName ?? "")
                try m.append(error?.message ?? "")
            }
        }
    }

    /// To both ends of the load, so a source can show progress as the destination does.
    private func emitLoadProgress(_ session: Session, _ load: Load) {
        let bytes = load.bytes
        let expected = load.expected ?? 0
        for party in Set([load.destination.uniqueName, session.source.uniqueName]) {
            emit(session, "LoadProgress", to: party) { m throws(BusError) in
                try m.append(load.id)
                try m.append(bytes)
                try m.append(expected)
            }
        }
        propertiesChanged(session, ["Progress"])
    }
}

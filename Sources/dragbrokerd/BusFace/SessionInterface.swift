import BrokerProtocol
import BusKit
import UniformTypes

/// `org.dragbroker.Broker1.Session`, served for every session object under one prefix by one
/// set of handlers: each finds its session from the object path in one dictionary probe.
///
/// Two rules, the same at every door. A session *exists* for its parties and for those who may
/// inspect it (`Session.mayBeInspected`, as ListSessions decides): for anyone else it is no
/// object at all, not in introspection, not in ObjectManager, and calling it answers as for a
/// session that never existed. It is *used* by its parties alone: its methods and its
/// properties (Get, GetAll, Set, and their values in GetManagedObjects) refuse anyone else
/// with one error, before anything could reveal its state. Its signals, PropertiesChanged and
/// ObjectManager's included, are unicast to its parties: a broadcast cannot tell who may know.
final class SessionInterface {
    private unowned let daemon: Daemon
    private var subtree: ExportedSubtree?
    private var retired: Slot?
    private var managedObjects: [Slot] = []
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
            find: { [unowned self] path, message in
                guard let message else { return registry.session(atPath: path) == nil ? nil : handlers }
                return session(addressedBy: message) == nil ? nil : handlers
            },
            enumerate: { [unowned self] caller in
                let identity = identity(of: caller)
                return registry.sessions.values.filter { exists($0, for: caller, identity) }.map(\.path).sorted()
            })
        // sd-bus answers GetManagedObjects by asking every child's find callback and each
        // of its property getters one by one; at 10,000 sessions that walk alone outlasts the
        // bench's 100 ms. The registry answers it in one pass, with the same contents. The
        // sessions' own parent answers the same, as sd-bus would for any path below the manager.
        for path in [BrokerNames.managerPath, prefix] {
            managedObjects.append(try bus.addObjectFilter(path: path) { [unowned self] call in
                guard call.message.interface == "org.freedesktop.DBus.ObjectManager", call.message.member == "GetManagedObjects" else {
                    return false
                }
                getManagedObjects(call)
                return true
            })
        }
        // A call on a session that ended, or that does not exist for the caller, gets a broker
        // error, not sd-bus's UnknownObject; Properties calls from a non-party get the error
        // its methods give, before sd-bus's own Properties handling could answer anything.
        retired = try bus.addFallback(prefix: prefix) { [unowned self] call in
            let m = call.message
            let isProperties = m.interface == Self.propertiesInterface
            guard m.interface == BrokerNames.sessionInterface || isProperties, let path = m.path, path.hasPrefix(prefix + "/") else {
                return false
            }
            guard let session = session(addressedBy: m) else {
                call.fail(BrokerError.notFound("No live session at \(path): it ended or never existed").busError)
                return true
            }
            guard isProperties, !session.isParty(call.sender) else { return false }
            do {
                try session.requireParticipant(try daemon.identity(ofName: call.sender))
                return false
            } catch {
                daemon.dispatcher.fail(call, error, action: m.member ?? "Properties", session: session, subject: nil)
                return true
            }
        }
    }

    private static let propertiesInterface = "org.freedesktop.DBus.Properties"

    /// The session the message sd-bus is handling is about, found once, as logind's
    /// `session_object_find` does: the fallback above (which sd-bus runs first) finds it, and
    /// the subtree's find callback, the handler, its refusal's record and a property's getter
    /// take it from here. Named by the message and its cookie, so no other message's answer is
    /// ever used; weak, so a session that ended is not kept for it.
    private struct Found {
        /// A sender's cookie names its message; the address alone may be a freed one's.
        let sender: String?
        let cookie: UInt64
        let message: OpaquePointer
        weak var session: Session?
    }
    private var found: Found?

    /// The session `message` is addressed to, if it exists for the sender (a party, or one who
    /// may inspect it); nil as for a session that never existed.
    private func session(addressedBy message: Message) -> Session? {
        let cookie = message.cookie, caller = message.sender
        if let found, found.cookie == cookie, found.message == message.handle, found.sender == caller { return found.session }
        let session = message.path.flatMap(registry.session(atPath:)).flatMap { exists($0, for: caller, identity(of: caller)) ? $0 : nil }
        found = Found(sender: caller, cookie: cookie, message: message.handle, session: session)
        return session
    }

    /// The identity of whoever sd-bus is serving, once per question however many sessions it
    /// covers; nil for our own emissions, or a caller that can no longer be identified.
    private func identity(of caller: String?) -> AppIdentity? {
        caller.flatMap { try? daemon.identity(ofName: $0) }
    }

    /// Whether the session's object exists for `caller`: for its parties and for those who may
    /// inspect it, as ListSessions decides. Our own emissions have no caller. The identity is
    /// looked up only for a non-party, so a party's calls (Update is hot) cost one probe.
    private func exists(_ session: Session, for caller: String?, _ identity: @autoclosure () -> AppIdentity?) -> Bool {
        guard let caller else { return true }
        return session.isParty(caller) || identity().map(session.mayBeInspected(by:)) == true
    }

    // MARK: Members

    private var implementation: InterfaceImplementation {
        let dispatcher = daemon.dispatcher
        let atPath: (MethodCall) -> (session: Session?, subject: String?) = { [unowned self] call in
            (session(addressedBy: call.message), nil)
        }
        func method(_ member: SessionMember, _ body: @escaping (SessionInterface, MethodCall, Session, AppIdentity) throws -> Void) -> MemberBinding {
            .method(dispatcher.serve(member.name, context: atPath) { [unowned self] call in
                let (session, caller) = try party(of: call)
                try body(self, call, session, caller)
            })
        }
        func property(_ member: SessionMember, _ value: @escaping PropertyValue) -> MemberBinding {
            properties.append(Property(member: member, name: member.name, signature: member.signature, value: value))
            return .property { [unowned self] reply, path throws(BusError) in
                guard let session = bus.currentMessage.map(session(addressedBy:)) ?? registry.session(atPath: path) else {
                    throw BrokerError.notFound("No such session").busError
                }
                try readable(session, reply) { m throws(BusError) in try m.write { value(session, &$0) } }
            }
        }
        let loadContext: (MethodCall) -> (session: Session?, subject: String?) = { [unowned self] call in
            _ = try? call.message.readUInt32()
            return (session(addressedBy: call.message), try? call.message.readString())
        }
        return InterfaceImplementation(SessionMember.self) { member in
            switch member {
            case .getItems: method(member) { try $0.getItems($1, $2, $3) }
            case .conformingItems: method(member) { try $0.conformingItems($1, $2, $3) }
            case .addItems: method(member) { try $0.addItems($1, $2, $3) }
            case .enter: method(member) { try $0.propose($1, $2, $3, entering: true) }
            case .update: method(member) { try $0.propose($1, $2, $3, entering: false) }
            case .exit: method(member) { try $0.exit($1, $2, $3) }
            case .performDrop: method(member) { try $0.performDrop($1, $2, $3) }
            case .load:
                .method(dispatcher.serve(member.name, context: loadContext) { [unowned self] call in
                    let (session, caller) = try party(of: call)
                    try load(call, session, caller)
                })
            case .cancelLoad: method(member) { try $0.cancelLoad($1, $2, $3) }
            case .setExpectedSize: method(member) { try $0.setExpectedSize($1, $2, $3) }
            case .conclude: method(member) { try $0.conclude($1, $2, $3) }
            case .cancel: method(member) { try $0.cancel($1, $2, $3) }
            case .paste: method(member) { try $0.paste($1, $2, $3) }
            case .clearOffers: method(member) { try $0.clearOffers($1, $2, $3) }
            case .id: property(member) { $1.append($0.id) }
            case .sourceApp: property(member) { $1.append($0.source.appID) }
            case .state: property(member) { $1.append($0.state.rawValue) }
            case .itemCount: property(member) { $1.append(UInt32($0.items.count)) }
            case .operation: property(member) { $1.append($0.operation.rawValue) }
            case .progress:
                property(member) { session, w in
                    let (done, expected) = session.progress
                    w.open("r", "tt")
                    w.append(done)
                    w.append(expected)
                    w.close()
                }
            case .willEnd, .ended, .transferFinished, .loadProgress, .loadFinished, .pasted: .signal
            }
        }
    }

    /// Writes one property's value. Each is written in one place, its case of the switch
    /// above, for its getter, PropertiesChanged and GetManagedObjects alike.
    private typealias PropertyValue = (Session, inout MessageWriter) -> Void
    /// A property with its name and signature taken from its row once, at start: they are
    /// written for every property of every session GetManagedObjects lists.
    private struct Property {
        let member: SessionMember
        let name: String
        let signature: String
        let value: PropertyValue
    }
    /// The properties in the table's order.
    private var properties: [Property] = []

    /// The session a method was called on and its caller, who must be one of its parties: every
    /// method checks that first, so a non-party gets one answer whatever it asked and whatever
    /// the session's state, never WrongState or an argument's error.
    private func party(of call: MethodCall) throws(BrokerError) -> (Session, AppIdentity) {
        guard let session = session(addressedBy: call.message) else {
            throw .notFound("No live session at \(call.message.path ?? "?"): it ended or never existed")
        }
        let caller = try daemon.identity(of: call)
        try session.requireParticipant(caller)
        return (session, caller)
    }

    /// Properties are the parties' alone, as the methods are. The fallback refuses anyone else
    /// before sd-bus reaches a getter; this holds the rule for any other way sd-bus may ask.
    private func readable(_ session: Session, _ reply: Message, _ append: (Message) throws(BusError) -> Void) throws(BusError) {
        guard let caller = reply.destination, !session.isParty(caller) else { return try append(reply) }
        do {
            try session.requireParticipant(try daemon.identity(ofName: caller))
        } catch {
            throw error.busError
        }
        try append(reply)
    }

    /// `org.freedesktop.DBus.ObjectManager.GetManagedObjects` on the manager path: every
    /// session that exists for the caller, with the standard interfaces sd-bus lists for each
    /// object, and the session's properties for the sessions it is a party to (as Properties
    /// answers it); for the others, the interface without them.
    private func getManagedObjects(_ call: MethodCall) {
        let caller = call.sender
        let identity = identity(of: caller)
        do {
            try reply(call) { r throws(BusError) in
                try r.write { w in
                    w.open("a", "{oa{sa{sv}}}")
                    for session in registry.sessions.values where exists(session, for: caller, identity) {
                        w.open("e", "oa{sa{sv}}")
                        w.append(objectPath: session.path)
                        writeInterfaces(of: session, withProperties: session.isParty(caller), to: &w)
                        w.close()
                    }
                    w.close()
                }
            }
        } catch {
            daemon.dispatcher.fail(call, error, action: "GetManagedObjects", session: nil, subject: nil)
        }
    }

    /// The `a{sa{sv}}` of one session object, as ObjectManager lists it.
    private func writeInterfaces(of session: Session, withProperties: Bool, to w: inout MessageWriter) {
        w.open("a", "{sa{sv}}")
        // sd-bus lists the standard interfaces of every object, each without properties.
        for standard in Self.standardInterfaces {
            w.open("e", "sa{sv}")
            w.append(standard)
            w.open("a", "{sv}")
            w.close()
            w.close()
        }
        w.open("e", "sa{sv}")
        w.append(BrokerNames.sessionInterface)
        writeProperties(of: session, withProperties ? properties : [], to: &w)
        w.close()
        w.close()
    }

    private static let standardInterfaces = ["org.freedesktop.DBus.Peer", "org.freedesktop.DBus.Introspectable", propertiesInterface]

    /// An `a{sv}` of the given properties' current values.
    private func writeProperties(of session: Session, _ properties: [Property], to w: inout MessageWriter) {
        w.open("a", "{sv}")
        for property in properties {
            w.open("e", "sv")
            w.append(property.name)
            w.openVariant(property.signature)
            property.value(session, &w)
            w.close()
            w.close()
        }
        w.close()
    }

    // MARK: Methods

    private func getItems(_ call: MethodCall, _ session: Session, _ caller: AppIdentity) throws {
        let items = session.visibleItems(for: caller, flow: registry.flow)
        try reply(call) { r throws(BusError) in
            try r.openContainer("a", VisibleItem.signature)
            for (_, item) in items { try item.encode(to: r) }
            try r.closeContainer()
        }
    }

    /// "hasItemsConforming": which items (as the caller numbers them) have a representation
    /// it can see that conforms to a MIME type, a wildcard or a UTI.
    private func conformingItems(_ call: MethodCall, _ session: Session, _ caller: AppIdentity) throws {
        let raw = try argument("type") { () throws(BusError) in try call.message.readString() }
        let pattern: TypePattern
        do {
            pattern = try TypePattern(raw)
        } catch {
            throw BrokerError.invalidArgument(error.message)
        }
        let types = registry.types
        let matching = session.visibleItems(for: caller, flow: registry.flow).enumerated().compactMap { viewIndex, entry -> UInt32? in
            types.select(among: entry.item.typeIdentifiers, for: [pattern]) != nil ? UInt32(viewIndex) : nil
        }
        try reply(call) { r throws(BusError) in
            try r.openContainer("a", "u")
            for index in matching { try r.append(index) }
            try r.closeContainer()
        }
    }

    private func addItems(_ call: MethodCall, _ session: Session, _ caller: AppIdentity) throws {
        let limits = registry.limits
        let items = try Items.normalize(try readItems(call.message, limit: limits.itemsPerSession), limits: limits)
        try session.addItems(items, by: caller, limit: limits.itemsPerSession, flow: registry.flow)
        try reply(call)
    }

    private func propose(_ call: MethodCall, _ session: Session, _ caller: AppIdentity, entering: Bool) throws {
        let name = try argument("proposal") { () throws(BusError) in try call.message.readString() }
        guard let proposal = DropOperation(rawValue: name) else {
            throw BrokerError.invalidArgument("Unknown proposal '\(name)': expected cancel, forbidden, copy or move")
        }
        let allowed = try session.propose(proposal, by: caller, entering: entering, flow: registry.flow)
        try reply(call) { r throws(BusError) in try r.append(allowed.rawValue) }
    }

    private func exit(_ call: MethodCall, _ session: Session, _ caller: AppIdentity) throws {
        try session.exit(by: caller)
        try reply(call)
    }

    private func performDrop(_ call: MethodCall, _ session: Session, _ caller: AppIdentity) throws {
        let operation = try session.performDrop(by: caller)
        try reply(call) { r throws(BusError) in try r.append(operation.rawValue) }
    }

    private func paste(_ call: MethodCall, _ entry: Session, _ caller: AppIdentity) throws {
        let paste = try registry.paste(entry, by: caller)
        try reply(call) { r throws(BusError) in try r.append(objectPath: paste.path) }
    }

    private func clearOffers(_ call: MethodCall, _ entry: Session, _ caller: AppIdentity) throws {
        let types = try entry.clearOffers(to: caller, flow: registry.flow, allowed: registry.policy.pasteboard.clearOffers)
        try reply(call) { r throws(BusError) in
            try r.openContainer("a", "s")
            for type in types { try r.append(type) }
            try r.closeContainer()
        }
    }

    /// Answered once the load is on record and under way (`Daemon.startLoad`), which for a
    /// file load is once the source handed the file over.
    private func load(_ call: MethodCall, _ session: Session, _ caller: AppIdentity) throws {
        let item = try argument("item") { () throws(BusError) in try call.message.readUInt32() }
        let type = try argument("type") { () throws(BusError) in try call.message.readString() }
        let dispatcher = daemon.dispatcher
        try daemon.startLoad(item: item, type: type, in: session, by: caller) { [weak session] started in
            do {
                let handover = try started.get()
                let sent = try reply(call) { r throws(BusError) in
                    try r.append(fileDescriptor: handover.descriptor.rawValue)
                    try r.append(handover.load)
                    try r.append(handover.kind.rawValue)
                }
                handover.replied(sent)
            } catch {
                dispatcher.fail(call, error, action: SessionMember.load.name, session: session, subject: type)
            }
        }
    }

    private func cancelLoad(_ call: MethodCall, _ session: Session, _ caller: AppIdentity) throws {
        let id = try argument("load") { () throws(BusError) in try call.message.readUInt32() }
        try session.cancelLoad(id, by: caller)
        try reply(call)
    }

    private func setExpectedSize(_ call: MethodCall, _ session: Session, _ caller: AppIdentity) throws {
        let id = try argument("load") { () throws(BusError) in try call.message.readUInt32() }
        let size = try argument("size") { () throws(BusError) in try call.message.readUInt64() }
        try session.setExpectedSize(size, load: id, by: caller)
        try reply(call)
    }

    private func conclude(_ call: MethodCall, _ session: Session, _ caller: AppIdentity) throws {
        try session.conclude(by: caller)
        try reply(call)
    }

    private func cancel(_ call: MethodCall, _ session: Session, _ caller: AppIdentity) throws {
        try session.cancel(by: caller)
        try reply(call)
    }

    // MARK: Signals, from the model's events

    func publish(_ session: Session, _ event: SessionEvent) {
        switch event {
        case .began:
            interfacesAdded(session)
        case .pastedFrom(let paste):
            let app = paste.owner.appID
            emit(session, .pasted, to: session.source.uniqueName) { m throws(BusError) in
                try m.append(objectPath: paste.path)
                try m.append(app)
            }
        case .itemsAdded:
            propertiesChanged(session, [.itemCount])
        case .dropped:
            propertiesChanged(session, [.state, .operation])
            let operation = session.operation.rawValue
            emit(session, .willEnd, to: session.source.uniqueName) { m throws(BusError) in try m.append(operation) }
        case .concluded:
            propertiesChanged(session, [.state, .operation])
            emitEnded(session, error: nil)
        case .loadProgressed(let load), .loadSizeAnnounced(let load):
            emitLoadProgress(session, load)
        case .loadFinished(let load, let error):
            let bytes = load.bytes
            for party in ends(of: load, in: session) where party != session.departed {
                emit(session, .loadFinished, to: party) { m throws(BusError) in
                    try m.append(load.id)
                    try m.append(bytes)
                    try m.append(error?.code.busName ?? "")
                    try m.append(error?.message ?? "")
                }
            }
            propertiesChanged(session, [.progress])
        case .transferFinished:
            emit(session, .transferFinished, to: session.source.uniqueName)
        case .ended(_, let error):
            if session.state != .concluded { emitEnded(session, error: error) }
            interfacesRemoved(session)
        case .proposed, .exited, .flowDenied, .loadStarted:
            break
        }
    }

    /// The values, to each party: sd-bus's own PropertiesChanged would be a broadcast, heard by
    /// every app on the bus whether or not the session exists for it.
    private func propertiesChanged(_ session: Session, _ members: [SessionMember]) {
        let properties = members.compactMap { member in self.properties.first { $0.member == member } }
        for party in parties(session) {
            emit(session, Self.propertiesInterface, "PropertiesChanged", to: party) { m throws(BusError) in
                try m.append(BrokerNames.sessionInterface)
                try m.write { w in writeProperties(of: session, properties, to: &w) }
                try m.openContainer("a", "s")
                try m.closeContainer()
            }
        }
    }

    /// ObjectManager's InterfacesAdded, to the parties it begins with (the source, and a
    /// paste's destination), for the same reason.
    private func interfacesAdded(_ session: Session) {
        for party in parties(session) {
            emit(session, "org.freedesktop.DBus.ObjectManager", "InterfacesAdded", to: party,
                 from: BrokerNames.managerPath) { m throws(BusError) in
                try m.append(objectPath: session.path)
                try m.write { w in writeInterfaces(of: session, withProperties: true, to: &w) }
            }
        }
    }

    private func interfacesRemoved(_ session: Session) {
        for party in parties(session) {
            emit(session, "org.freedesktop.DBus.ObjectManager", "InterfacesRemoved", to: party,
                 from: BrokerNames.managerPath) { m throws(BusError) in
                try m.append(objectPath: session.path)
                try m.openContainer("a", "s")
                for interface in Self.standardInterfaces + [BrokerNames.sessionInterface] { try m.append(interface) }
                try m.closeContainer()
            }
        }
    }

    /// A load's two ends, the destination first, which waits for the news; one when an app
    /// loads from its own drag.
    private func ends(of load: Load, in session: Session) -> [String] {
        let destination = load.destination.uniqueName, source = session.source.uniqueName
        return destination == source ? [destination] : [destination, source]
    }

    /// Those who hear the session's signals: the source, then the destinations, less any that left.
    private func parties(_ session: Session) -> [String] {
        ([session.source.uniqueName] + session.destinations.keys.filter { $0 != session.source.uniqueName }.sorted())
            .filter { $0 != session.departed }
    }

    private func emit(_ session: Session, _ signal: SessionMember, to destination: String, _ build: (Message) throws(BusError) -> Void = { _ in }) {
        emit(session, BrokerNames.sessionInterface, signal.name, to: destination, build)
    }

    private func emit(_ session: Session, _ interface: String, _ member: String, to destination: String, from path: String? = nil,
                      _ build: (Message) throws(BusError) -> Void = { _ in }) {
        // Without a bus nobody can be told: the loss is logged once, where it is noticed,
        // rather than once for every party of every session that then ends.
        guard bus.isOpen else { return }
        do {
            try bus.emitSignal(path: path ?? session.path, interface: interface, member: member,
                               destination: destination, build)
        } catch {
            daemon.logger.warning("Failed to emit \(member) to \(destination): \(error), ignoring")
        }
    }

    /// Tells the source and every destination that the session ended, and why when it failed.
    private func emitEnded(_ session: Session, error: BrokerError?) {
        let operation = error == nil ? session.operation : (session.state == .active ? .cancel : session.operation)
        for party in parties(session) {
            emit(session, .ended, to: party) { m throws(BusError) in
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
        for party in ends(of: load, in: session) {
            emit(session, .loadProgress, to: party) { m throws(BusError) in
                try m.append(load.id)
                try m.append(bytes)
                try m.append(expected)
            }
        }
        propertiesChanged(session, [.progress])
    }
}

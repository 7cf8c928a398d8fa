import BrokerProtocol
import BusKit
import Foundation
import SystemPackage

/// A connection to dragbrokerd. Both roles start here: `beginDrag` for a source,
/// `presentToken` for a destination.
///
/// The connection runs its own event loop thread; the actor's executor is that loop, so
/// bus callbacks and actor state meet on one thread without locks.
public actor BrokerConnection {
    let loop: EventLoop
    let bus: Bus
    /// The broker's unique name: the only peer allowed to call our providers.
    private var brokerName = ""
    private var providers: [String: ProviderExport] = [:]
    private var routes: [String: SessionRoute] = [:]
    private var nextProvider = 1
    private var monitorSlot: Slot?
    /// Load handlers running for each session path, by load ID, so a cancel can stop them.
    private var running: [String: [UInt32: Task<Void, Never>]] = [:]

    public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    private init(loop: EventLoop, bus: Bus) {
        self.loop = loop
        self.bus = bus
    }

    /// Connects to the bus at `address`, or to `$DRAGBROKER_BUS_ADDRESS`, or to the session bus.
    public static func connect(address: String? = nil) async throws(BrokerError) -> BrokerConnection {
        let connection: BrokerConnection
        do {
            let loop = try EventLoop()
            let address = address ?? ProcessInfo.processInfo.environment["DRAGBROKER_BUS_ADDRESS"]
            let bus = try Bus.connect(address: address, loop: loop, description: "dragbroker-client")
            loop.start(name: "dragbroker-client")
            connection = BrokerConnection(loop: loop, bus: bus)
        } catch {
            throw BrokerError(.disconnected, "Failed to connect to the bus: \(error.message)")
        }
        try await connection.locateBroker()
        return connection
    }

    private func locateBroker() async throws(BrokerError) {
        do {
            brokerName = try await bus.nameOwner(BrokerNames.busName)
        } catch {
            throw BrokerError(.disconnected, "dragbrokerd is not running on this bus (\(error.name))")
        }
    }

    /// The connection's unique bus name.
    public var uniqueName: String { bus.uniqueName }

    // MARK: Calls

    func call(path: String, interface: String, member: String,
              timeout: UInt64 = 0, _ build: @Sendable (Message) throws(BusError) -> Void = { _ in }) async throws(BrokerError) -> Message {
        do {
            let message = try bus.newMethodCall(destination: brokerName, path: path, interface: interface, member: member)
            try build(message)
            return try await bus.call(message, timeout: timeout)
        } catch {
            throw BrokerError(error)
        }
    }

    func decode<T>(_ read: () throws(BusError) -> T) throws(BrokerError) -> T {
        do {
            return try read()
        } catch {
            throw BrokerError(.failed, "Malformed reply from the broker: \(error.message)")
        }
    }

    /// The live sessions, as an operator sees them.
    public func listSessions() async throws(BrokerError) -> [SessionSummary] {
        let reply = try await call(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface, member: "ListSessions")
        return try decode { () throws(BusError) in
            var sessions: [SessionSummary] = []
            _ = try reply.enterContainer("a", SessionSummary.signature)
            while let summary = try SessionSummary.decode(from: reply) { sessions.append(summary) }
            try reply.exitContainer()
            return sessions
        }
    }

    /// Live events of every session this caller may inspect (`dragctl monitor`).
    public func monitor() async throws(BrokerError) -> AsyncStream<MonitorEvent> {
        let (stream, continuation) = AsyncStream.makeStream(of: MonitorEvent.self)
        do {
            monitorSlot = try bus.matchSignal(sender: brokerName, path: BrokerNames.managerPath, interface: BrokerNames.managerInterface,
                                              member: "MonitorEvent") { m in
                guard let session = try? m.readString(), let event = try? m.readString(), let detail = try? m.readString(),
                      let bytes = try? m.readUInt64(), let expected = try? m.readUInt64() else { return }
                continuation.yield(MonitorEvent(session: session, event: event, detail: detail, bytes: bytes, expected: expected))
            }
        } catch {
            throw BrokerError(.failed, "Failed to subscribe to monitor events: \(error.message)")
        }
        _ = try await call(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface, member: "Monitor")
        return stream
    }

    /// One session in detail, as an operator may see it.
    public func describeSession(_ id: String) async throws(BrokerError) -> SessionDetails {
        let reply = try await call(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface, member: "DescribeSession") { m throws(BusError) in
            try m.append(id)
        }
        return try decode { () throws(BusError) in try SessionDetails.decode(from: reply) }
    }

    /// Ends a session as an administrator; every party hears `Cancelled`.
    public func cancelSession(_ id: String) async throws(BrokerError) {
        _ = try await call(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface, member: "CancelSession") { m throws(BusError) in
            try m.append(id)
        }
    }

    /// Cancels one load of a session as an administrator.
    public func cancelLoad(session id: String, load: UInt32) async throws(BrokerError) {
        _ = try await call(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface, member: "CancelLoad") { m throws(BusError) in
            try m.append(id)
            try m.append(load)
        }
    }

    /// How the broker sees this app: identity comes from the kernel, never from the client.
    public func whoAmI() async throws(BrokerError) -> BrokerIdentity {
        let reply = try await call(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface, member: "WhoAmI")
        let fields = try decode { () throws(BusError) in try reply.readVariantDictionary() }
        return BrokerIdentity(fields)
    }

    /// The policy in effect, each entry with the file and line it came from.
    public func policy() async throws(BrokerError) -> String {
        let reply = try await call(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface, member: "GetPolicy")
        return try decode { () throws(BusError) in try reply.readString() }
    }

    /// Asks the broker to reload its policy files; a bad file is reported and changes nothing.
    public func reloadPolicy() async throws(BrokerError) {
        _ = try await call(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface, member: "ReloadPolicy")
    }

    // MARK: Source

    /// Begins a drag. The returned session's token is what the windowing system's drag carries
    /// to a destination. Data is produced only when the drop destination loads it.
    public func beginDrag(items: [DragItem], options: SessionOptions = SessionOptions()) async throws(BrokerError) -> DragSession {
        let providerPath = BrokerNames.providerPathPrefix + "p\(nextProvider)"
        nextProvider += 1
        let export = ProviderExport(items: items.map(\.itemProvider))
        do {
            export.object = try bus.export(path: providerPath, interface: BrokerInterfaces.provider,
                                           implementation: InterfaceImplementation(methods: [
                                               "Provide": { [unowned self] call throws(BusError) in
                                                   let result = self.assumeIsolated { connection in
                                                       Result { () throws(BusError) in try connection.provide(call) }
                                                   }
                                                   try result.get()
                                               },
                                               "ProvideFile": { [unowned self] call throws(BusError) in
                                                   let result = self.assumeIsolated { connection in
                                                       Result { () throws(BusError) in try connection.provideFile(call) }
                                                   }
                                                   try result.get()
                                               },
                                           ]))
        } catch {
            throw BrokerError(.failed, "Failed to export the item provider: \(error.message)")
        }
        let reply = try await call(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface, member: "BeginSession") { m throws(BusError) in
            try m.openContainer("a", ItemDescriptor.signature)
            for item in items { try item.itemProvider.descriptor.encode(to: m) }
            try m.closeContainer()
            try options.encode(to: m)
            try m.append(objectPath: providerPath)
        }
        let (path, token) = try decode { () throws(BusError) in (try reply.readObjectPath(), try reply.readString()) }
        providers[path] = export
        let session = DragSession(connection: self, path: path, token: token, items: items, export: export)
        try route(path, to: .source(session))
        return session
    }

    /// Serves the broker's request for one data representation: the handler runs now, its
    /// bytes go into the pipe the broker passed, and the reply says whether it succeeded.
    private func provide(_ call: MethodCall) throws(BusError) {
        let (sessionPath, item, type, load) = try loadRequest(call)
        let fd = try call.message.readFileDescriptor()
        guard let provision = provision(sessionPath, item, type) else {
            close(fd)
            throw BrokerError(.notFound, "No representation '\(type)' for item \(item)").busError
        }
        noteLoadRequested(sessionPath, load, item, type)
        let pending = PendingReply(call)
        let task = Task {
            let failure: BrokerError?
            do {
                switch provision {
                case .data(let handler):
                    let data = try await handler()
                    // Worth a message only when the destination will watch the bytes arrive.
                    if data.count >= 64 << 10 {
                        Task { await announce(sessionPath, load, UInt64(data.count)) }
                    }
                    try await DescriptorIO.write(data, consuming: fd)
                case .stream(let writer):
                    defer { close(fd) }
                    try await writer(DataWriter(fd: fd) { [weak self] size in await self?.announce(sessionPath, load, size) })
                case .file:
                    close(fd)
                    throw BrokerError(.failed, "'\(type)' is a file representation")
                }
                failure = nil
            } catch let error as BrokerError {
                failure = error
            } catch is CancellationError {
                failure = BrokerError(.cancelled, "The load was cancelled")
            } catch {
                failure = BrokerError(.providerFailed, "\(error)")
            }
            finish(pending, failure, sessionPath, load)
        }
        running[sessionPath, default: [:]][load] = task
    }

    /// Serves a file representation: the reply carries the descriptor, which sd-bus duplicates.
    private func provideFile(_ call: MethodCall) throws(BusError) {
        let (sessionPath, item, type, load) = try loadRequest(call)
        guard case .file(let handler) = provision(sessionPath, item, type) else {
            throw BrokerError(.notFound, "No file representation '\(type)' for item \(item)").busError
        }
        noteLoadRequested(sessionPath, load, item, type)
        let pending = PendingReply(call)
        let task = Task {
            do {
                let file = try await handler()
                replyWithFile(pending, file, sessionPath, load)
            } catch let error as BrokerError {
                finish(pending, error, sessionPath, load)
            } catch {
                finish(pending, BrokerError(.providerFailed, "\(error)"), sessionPath, load)
            }
        }
        running[sessionPath, default: [:]][load] = task
    }

    /// The arguments both provider methods start with, from the broker only.
    private func loadRequest(_ call: MethodCall) throws(BusError) -> (sessionPath: String, item: UInt32, type: String, load: UInt32) {
        guard call.sender == brokerName else {
            throw BrokerError(.accessDenied, "Only dragbrokerd may request data from this provider").busError
        }
        let m = call.message
        return (try m.readObjectPath(), try m.readUInt32(), try m.readString(), try m.readUInt32())
    }

    private func noteLoadRequested(_ sessionPath: String, _ load: UInt32, _ item: UInt32, _ type: String) {
        if case .source(let session) = routes[sessionPath]?.role {
            session.noteLoadRequested(load: load, item: Int(item), type: type)
        }
    }

    private func provision(_ sessionPath: String, _ item: UInt32, _ type: String) -> ItemProvider.Provision? {
        guard let export = providers[sessionPath], Int(item) < export.items.count else { return nil }
        return export.items[Int(item)].provision(for: type)
    }

    private func announce(_ sessionPath: String, _ load: UInt32, _ size: UInt64) async {
        _ = try? await call(path: sessionPath, interface: BrokerNames.sessionInterface, member: "SetExpectedSize") { m throws(BusError) in
            try m.append(load)
            try m.append(size)
        }
    }

    private func replyWithFile(_ pending: PendingReply, _ file: FileDescriptor, _ sessionPath: String, _ load: UInt32) {
        running[sessionPath]?[load] = nil
        defer { try? file.close() }
        guard !pending.call.answered else { return }
        do {
            try pending.call.reply { r throws(BusError) in try r.append(fileDescriptor: file.rawValue) }
        } catch {
            pending.call.fail(BrokerError(.failed, "Failed to send the file: \(error.message)").busError)
        }
    }

    private func finish(_ pending: PendingReply, _ failure: BrokerError?, _ sessionPath: String, _ load: UInt32) {
        running[sessionPath]?[load] = nil
        guard !pending.call.answered else { return }
        if let failure {
            pending.call.fail(failure.busError)
        } else {
            try? pending.call.reply()
        }
    }

    /// The broker ended a load this source is still producing (cancelled, timed out, the
    /// destination left): stop its handler.
    func loadEnded(_ sessionPath: String, _ load: UInt32) {
        running[sessionPath]?.removeValue(forKey: load)?.cancel()
    }

    // MARK: Destination

    /// Presents a drag's token: the destination may then see the items' visible types and
    /// propose, and after `performDrop` load.
    public func presentToken(_ token: String) async throws(BrokerError) -> DropSession {
        let reply = try await call(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface, member: "PresentToken") { m throws(BusError) in
            try m.append(token)
        }
        let path = try decode { () throws(BusError) in try reply.readObjectPath() }
        if case .destination(let existing) = routes[path]?.role { return existing }
        let session = DropSession(connection: self, path: path)
        try route(path, to: .destination(session))
        return session
    }

    // MARK: Signals

    /// Subscribes to the session's signals, which the broker sends to this connection only.
    private func route(_ path: String, to role: SessionRoute.Role) throws(BrokerError) {
        do {
            let slot = try bus.matchSignal(sender: brokerName, path: path, interface: BrokerNames.sessionInterface, member: nil) { [unowned self] m in
                self.assumeIsolated { $0.dispatch(m) }
            }
            routes[path] = SessionRoute(role: role, slot: slot)
        } catch {
            throw BrokerError(.failed, "Failed to subscribe to session signals: \(error.message)")
        }
    }

    private func dispatch(_ m: Message) {
        guard let path = m.path, let route = routes[path], let member = m.member else { return }
        switch route.role {
        case .source(let session):
            if member == "LoadFinished", let load = try? m.readUInt32() {
                loadEnded(path, load)
                try? m.rewind()
            }
            session.handle(signal: member, m)
        case .destination(let session): session.handle(signal: member, m)
        }
        if member == "Ended" || member == "TransferFinished" {
            let done: Bool
            switch route.role {
            case .source: done = member == "TransferFinished" || !(route.role.sourceAwaitsTransfer(m))
            case .destination: done = true
            }
            if done { forget(path) }
        }
    }

    /// Flocking: the provider learns the new items before the broker can ask for them.
    func addItems(_ items: [DragItem], to path: String, export: ProviderExport) async throws(BrokerError) {
        let before = export.items.count
        export.items += items.map(\.itemProvider)
        do {
            _ = try await call(path: path, interface: BrokerNames.sessionInterface, member: "AddItems") { m throws(BusError) in
                try m.openContainer("a", ItemDescriptor.signature)
                for item in items { try item.itemProvider.descriptor.encode(to: m) }
                try m.closeContainer()
            }
        } catch {
            export.items.removeSubrange(before...)
            throw error
        }
    }

    func forget(_ path: String) {
        routes[path] = nil
        providers[path] = nil
        running.removeValue(forKey: path)?.values.forEach { $0.cancel() }
    }
}

/// A call kept open while a load handler runs; sent back to the loop to answer.
private final class PendingReply: @unchecked Sendable {
    let call: MethodCall
    init(_ call: MethodCall) { self.call = call }
}

final class ProviderExport: @unchecked Sendable {
    /// Grows only on the connection's loop, through `BrokerConnection.addItems`.
    var items: [ItemProvider]
    var object: ExportedObject?
    init(items: [ItemProvider]) { self.items = items }
}

private struct SessionRoute {
    enum Role {
        case source(DragSession)
        case destination(DropSession)

        /// After a successful `Ended`, the source still hears `TransferFinished`.
        func sourceAwaitsTransfer(_ ended: Message) -> Bool {
            try? ended.rewind()
            _ = try? ended.readString()
            return (try? ended.readString())?.isEmpty ?? false
        }
    }
    let role: Role
    let slot: Slot
}

import BrokerProtocol
import BusKit
import Foundation
import Synchronization
import SystemCalls

/// A connection to dragbrokerd. Every role starts here: `beginDrag` and `copy` for a source,
/// `presentToken` for a destination, whether the token came from a drag or the clipboard.
///
/// The connection runs its own event loop thread; the actor's executor is that loop, so
/// bus callbacks and actor state meet on one thread without locks. Messages never leave
/// that thread: every reply is decoded by the caller's `decode` closure there, signals are
/// decoded into `SessionSignal`s there, and only the decoded values reach the sessions.
public actor BrokerConnection {
    let loop: EventLoop
    let bus: Bus
    /// The broker's unique name, and why every call fails from now on once it left the bus.
    /// Read by every call, on the loop, also by sessions that do not enter the actor.
    private nonisolated let broker = Mutex(BrokerPeer())
    /// The broker's unique name: the only peer allowed to call our providers.
    private nonisolated var brokerName: String { broker.withLock { $0.name } }
    /// What each drag's provider serves, by session path.
    private var providers: [String: ProviderExport] = [:]
    private var routes: [String: SessionRoute] = [:]
    private var nextProvider = 1
    private var monitor: MonitorSubscription?
    private var nextMonitor = 1
    /// Load handlers running for each session path, by load ID, so a cancel can stop them.
    private var running: [String: [UInt32: Task<Void, Never>]] = [:]
    /// Tells when the broker's connection goes away.
    private var brokerWatch: Slot?

    public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    /// The connection's event loop, as a task executor. Called from an arbitrary task, each
    /// call to the broker hops to the loop's thread to be sent and hops back once its reply
    /// came: two thread wake-ups. Code that makes call after call (a destination handling a
    /// drop: enter, update, perform, load) makes none inside
    /// `withTaskExecutorPreference(connection.taskExecutor) { … }`: the call is sent, and its
    /// reply resumes the task, on the thread that read it, as a C client on sd-bus does on its
    /// own thread. What blocks or computes for long belongs elsewhere: on the loop it holds up
    /// every reply and event of this connection. Either way, a data load waits for its pipe
    /// on the loop and reads its first chunk there; other descriptor reads and writes run off
    /// the loop. Code isolated to an actor (the main actor) runs on that actor's
    /// executor whatever the preference.
    public nonisolated var taskExecutor: any TaskExecutor { loop.taskExecutor }

    private init(loop: EventLoop, bus: Bus) {
        self.loop = loop
        self.bus = bus
    }

    /// Runs on the loop whichever thread let go of the connection last, so the bus, its slots
    /// and exported objects are released there; then the loop's thread ends.
    isolated deinit {
        loop.exit()
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
            let name = try await bus.nameOwner(BrokerNames.busName)
            broker.withLock { $0.name = name }
            // The unique name is this broker's connection: when it loses its owner, that
            // broker is gone, whether or not another one takes the well-known name.
            brokerWatch = try bus.watchOwner(of: name) { [unowned self] owner in
                guard owner.isEmpty else { return }
                assumeIsolated { $0.brokerVanished() }
            }
        } catch {
            throw BrokerError(.disconnected, "dragbrokerd is not running on this bus (\(error.name))")
        }
    }

    /// The broker's connection is gone: every session, load and event stream ends with
    /// `Disconnected` now, rather than with a broken pipe or an end of file that says nothing.
    private func brokerVanished() {
        let error = BrokerError(.disconnected, "dragbrokerd went away: its connection \(brokerName) left the bus")
        broker.withLock { $0.gone = error }
        for (path, route) in routes {
            switch route.role {
            case .source(let session): _ = session.handle(.ended(.cancel, error))
            case .destination(let session): session.brokerVanished(error)
            case .pasteboard(let entry): _ = entry.handle(.ended(.cancel, error))
            case .paste(let entry): _ = entry.handlePaste(path, .ended(.cancel, error))
            }
            forget(path)
        }
        monitor?.continuation.finish()
        monitor = nil
    }

    /// The connection's unique bus name.
    public var uniqueName: String { bus.uniqueName }

    // MARK: Calls

    /// Calls a broker method. `build` appends the arguments here, and `decode` reads the reply
    /// as it arrives, both on the loop, where the messages live: only the decoded value leaves.
    func call<T: Sendable, Member: InterfaceTable>(path: String, _ member: Member, timeout: UInt64 = 0,
                                                   build: (Message) throws(BusError) -> Void = { _ in },
                                                   decode: @escaping @Sendable (Message) throws(BusError) -> T) async throws(BrokerError) -> T {
        try await send(path: path, member, timeout: timeout, build: build, decode: decode)
    }

    /// A call in the caller's isolation (a session's: `DropSession`, `DragSession`,
    /// `PasteboardEntry`). On the loop's thread it is sent right here, whatever the caller's
    /// isolation, since the reply is decoded as it arrives and no message follows the caller
    /// wherever it resumes. A task that prefers `taskExecutor` resumes on the loop: no thread
    /// hop at all, where entering the actor would cost two more trips through the loop's
    /// queue and four executor switches per call. From any other thread it enters the actor.
    nonisolated(nonsending) func sessionCall<T: Sendable, Member: InterfaceTable>(path: String, _ member: Member, timeout: UInt64 = 0,
                                                                                  build: @Sendable (Message) throws(BusError) -> Void = { _ in },
                                                                                  decode: @escaping @Sendable (Message) throws(BusError) -> T) async throws(BrokerError) -> T {
        guard loop.isCurrent else { return try await call(path: path, member, timeout: timeout, build: build, decode: decode) }
        return try await send(path: path, member, timeout: timeout, build: build, decode: decode)
    }

    /// Builds and sends one call, on the loop's thread; `decode` reads the reply in sd-bus's
    /// reply callback, and only its result resumes the caller, in the caller's isolation.
    nonisolated(nonsending) private func send<T: Sendable, Member: InterfaceTable>(path: String, _ member: Member, timeout: UInt64,
                                                                                   build: (Message) throws(BusError) -> Void,
                                                                                   decode: @escaping @Sendable (Message) throws(BusError) -> T) async throws(BrokerError) -> T {
        let result = await withUnsafeContinuation { (continuation: UnsafeContinuation<Result<T, BrokerError>, Never>) in
            // The message is made, sent and released before the caller suspends.
            let (destination, gone) = broker.withLock { ($0.name, $0.gone) }
            if let gone { return continuation.resume(returning: .failure(gone)) }
            do throws(BusError) {
                let message = try bus.newMethodCall(destination: destination, path: path, interface: Member.interfaceName, member: member.name)
                try build(message)
                // The row is the contract: arguments that drift from it fail every test that makes the call.
                assert(message.signature == member.signature, "\(member.name) built (\(message.signature)), its row says (\(member.signature))")
                try bus.send(message, timeout: timeout, replyTo: DecodingReply(continuation, decode))
            } catch {
                continuation.resume(returning: .failure(BrokerError(error)))
            }
        }
        return try result.get()
    }

    /// A session's call whose reply carries nothing to read.
    nonisolated(nonsending) func sessionCall<Member: InterfaceTable>(path: String, _ member: Member, timeout: UInt64 = 0,
                                                                     build: @Sendable (Message) throws(BusError) -> Void = { _ in }) async throws(BrokerError) {
        try await sessionCall(path: path, member, timeout: timeout, build: build, decode: { _ throws(BusError) in })
    }

    /// Calls a broker method whose reply carries nothing to read.
    func call<Member: InterfaceTable>(path: String, _ member: Member, timeout: UInt64 = 0,
                                      build: (Message) throws(BusError) -> Void = { _ in }) async throws(BrokerError) {
        try await call(path: path, member, timeout: timeout, build: build, decode: { _ throws(BusError) in })
    }

    private func callManager<T: Sendable>(_ member: ManagerMember, build: (Message) throws(BusError) -> Void = { _ in },
                                          decode: @escaping @Sendable (Message) throws(BusError) -> T) async throws(BrokerError) -> T {
        try await call(path: BrokerNames.managerPath, member, build: build, decode: decode)
    }

    private func callManager(_ member: ManagerMember, build: (Message) throws(BusError) -> Void = { _ in }) async throws(BrokerError) {
        try await call(path: BrokerNames.managerPath, member, build: build)
    }

    /// The live sessions, as an operator sees them.
    public func listSessions() async throws(BrokerError) -> [SessionSummary] {
        try await callManager(.listSessions, decode: { reply throws(BusError) in
            var sessions: [SessionSummary] = []
            _ = try reply.enterContainer("a", SessionSummary.signature)
            while let summary = try SessionSummary.decode(from: reply) { sessions.append(summary) }
            try reply.exitContainer()
            return sessions
        })
    }

    /// Live events of every session this caller may inspect (`dragctl monitor`). One stream
    /// per connection: asking again ends the previous one. A reader that falls behind finds
    /// the newest `unreadMonitorEventLimit` events; older ones are dropped.
    public func monitor() async throws(BrokerError) -> AsyncStream<MonitorEvent> {
        let (stream, continuation) = AsyncStream.makeStream(of: MonitorEvent.self,
                                                            bufferingPolicy: .bufferingNewest(Self.unreadMonitorEventLimit))
        let slot: Slot
        do {
            // Subscribed before asking, so no event falls between the two.
            slot = try bus.matchSignal(sender: brokerName, path: BrokerNames.managerPath, interface: BrokerNames.managerInterface,
                                       member: ManagerMember.monitorEvent.name) { m in
                guard let session = try? m.readString(), let event = try? m.readString(), let detail = try? m.readString(),
                      let bytes = try? m.readUInt64(), let expected = try? m.readUInt64() else { return }
                continuation.yield(MonitorEvent(session: session, event: event, detail: detail, bytes: bytes, expected: expected))
            }
        } catch {
            throw BrokerError(.failed, "Failed to subscribe to monitor events: \(error.message)")
        }
        let generation = nextMonitor
        nextMonitor += 1
        monitor?.continuation.finish()
        monitor = MonitorSubscription(generation: generation, slot: slot, continuation: continuation)
        // A consumer that stops listening unsubscribes; the slot is dropped here, on the loop.
        continuation.onTermination = { [weak self] _ in
            Task { await self?.endMonitor(generation) }
        }
        do {
            try await callManager(.monitor)
        } catch {
            endMonitor(generation)
            throw error
        }
        return stream
    }

    /// Larger than a session's bound: every session's events come through this one stream, and
    /// a burst (a source with thousands of sessions quitting) may outrun a terminal.
    static let unreadMonitorEventLimit = 4096

    private func endMonitor(_ generation: Int) {
        guard let current = monitor, current.generation == generation else { return }
        monitor = nil
        current.continuation.finish()
    }

    /// One session in detail, as an operator may see it.
    public func describeSession(_ id: String) async throws(BrokerError) -> SessionDetails {
        try await callManager(.describeSession, build: { m throws(BusError) in try m.append(id) },
                              decode: { reply throws(BusError) in try SessionDetails.decode(from: reply) })
    }

    /// Ends a session as an administrator; every party hears `Cancelled`.
    public func cancelSession(_ id: String) async throws(BrokerError) {
        try await callManager(.cancelSession, build: { m throws(BusError) in try m.append(id) })
    }

    /// Cancels one load of a session as an administrator.
    public func cancelLoad(session id: String, load: UInt32) async throws(BrokerError) {
        try await callManager(.cancelLoad, build: { m throws(BusError) in
            try m.append(id)
            try m.append(load)
        })
    }

    /// How the broker sees this app: identity comes from the kernel, never from the client.
    public func whoAmI() async throws(BrokerError) -> BrokerIdentity {
        BrokerIdentity(try await callManager(.whoAmI, decode: { reply throws(BusError) in try reply.readVariantDictionary() }))
    }

    /// The policy in effect, each entry with the file and line it came from.
    public func policy() async throws(BrokerError) -> String {
        try await callManager(.getPolicy, decode: { reply throws(BusError) in try reply.readString() })
    }

    /// What the broker holds now, per app and user (administrators only).
    public func usage() async throws(BrokerError) -> UsageReport {
        try await callManager(.getUsage, decode: { reply throws(BusError) in try UsageReport.decode(from: reply) })
    }

    /// Asks the broker to reload its policy files; a bad file is reported and changes nothing.
    public func reloadPolicy() async throws(BrokerError) {
        try await callManager(.reloadPolicy)
    }

    // MARK: Source

    /// Begins a drag. The returned session's token is what the windowing system's drag carries
    /// to a destination. Data is produced only when the drop destination loads it.
    public func beginDrag(items: [DragItem], options: SessionOptions = SessionOptions()) async throws(BrokerError) -> DragSession {
        let (path, token) = try await offer(items, through: .beginSession) { m throws(BusError) in try options.encode(to: m) }
        let session = DragSession(connection: self, path: path, token: token, items: items)
        try route(path, to: .source(session))
        return session
    }

    /// Puts items on the broker's pasteboard, after iOS's `setItemProviders(_:localOnly:expirationDate:)`:
    /// the same lazy promises as a drag. The entry's token is what the window system's clipboard
    /// carries (`BrokerNames.pasteboardTokenType`); data is produced only when a paste loads it.
    public func copy(items: [DragItem], options: PasteOptions = PasteOptions()) async throws(BrokerError) -> PasteboardEntry {
        let (path, token) = try await offer(items, through: .copy) { m throws(BusError) in try options.encode(to: m) }
        let entry = PasteboardEntry(connection: self, path: path, token: token, items: items)
        try route(path, to: .pasteboard(entry))
        return entry
    }

    /// Offers items through a drag or the pasteboard (`BeginSession`, `Copy`: the same
    /// arguments) with a provider object of their own, which serves them from then on.
    private func offer(_ items: [DragItem], through member: ManagerMember,
                       options: (Message) throws(BusError) -> Void) async throws(BrokerError) -> (path: String, token: String) {
        let (providerPath, object) = try exportProvider()
        let (path, token) = try await callManager(member, build: { m throws(BusError) in
            try m.openContainer("a", ItemDescriptor.signature)
            for item in items { try item.itemProvider.descriptor.encode(to: m) }
            try m.closeContainer()
            try options(m)
            try m.append(objectPath: providerPath)
        }, decode: { reply throws(BusError) in (try reply.readObjectPath(), try reply.readString()) })
        providers[path] = ProviderExport(items: items.map(\.itemProvider), object: object)
        return (path, token)
    }

    /// The provider object one drag or pasteboard entry is served by, at a path of its own.
    private func exportProvider() throws(BrokerError) -> (path: String, object: ExportedObject) {
        let providerPath = BrokerNames.providerPathPrefix + "p\(nextProvider)"
        nextProvider += 1
        do {
            let object = try bus.export(path: providerPath, interface: BrokerInterfaces.provider,
                                        implementation: InterfaceImplementation(ProviderMember.self) { member in
                                            switch member {
                                            case .provide:
                                                .method { [unowned self] call throws(BusError) in
                                                    try serve(call) { connection, call throws(BusError) in try connection.provide(call) }
                                                }
                                            case .provideFile:
                                                .method { [unowned self] call throws(BusError) in
                                                    try serve(call) { connection, call throws(BusError) in try connection.provideFile(call) }
                                                }
                                            }
                                        })
            return (providerPath, object)
        } catch {
            throw BrokerError(.failed, "Failed to export the item provider: \(error.message)")
        }
    }

    /// An app pasted one of this connection's entries (`Pasted`, which comes before the
    /// paste's first `Provide`): its loads are served from the entry's providers.
    private func servePaste(at pastePath: String, of entryPath: String, for entry: PasteboardEntry) {
        guard let export = providers[entryPath] else { return }
        providers[pastePath] = export
        do {
            try route(pastePath, to: .paste(entry))
        } catch {
            providers[pastePath] = nil
        }
    }

    /// Runs a provider method's handler in the actor: sd-bus calls it on the loop, the actor's
    /// executor, and the call travels into the actor's isolation checked, as a `LoopBound`.
    private nonisolated func serve(_ call: MethodCall,
                                   _ handler: @Sendable (isolated BrokerConnection, MethodCall) throws(BusError) -> Void) throws(BusError) {
        let call = LoopBound(call, loop: loop)
        // assumeIsolated rethrows untyped errors: the BusError travels in a Result.
        try assumeIsolated { connection in
            Result { () throws(BusError) in try handler(connection, call.value) }
        }.get()
    }

    /// Serves the broker's request for one data representation: the handler runs now, its
    /// bytes go into the pipe the broker passed, and the reply says whether it succeeded.
    private func provide(_ call: MethodCall) throws(BusError) {
        let (sessionPath, item, type, load) = try loadRequest(call)
        let fd = FileDescriptor(rawValue: try call.message.readFileDescriptor())
        guard let provision = provision(sessionPath, item, type) else {
            fd.closeQuietly()
            throw BrokerError(.notFound, "No representation '\(type)' for item \(item)").busError
        }
        // The app hears of the request once the bytes are on their way: the event is no part
        // of serving them, and yielding it (a generic stream's locked buffer, a waiting reader
        // woken) would delay every load by as much.
        let note = loadRequestedNote(sessionPath, load, item, type)
        defer { note.map(loop.execute) }
        // Bytes already held that the fresh pipe takes at once: written and answered now, on
        // the loop, with no task and no thread hop.
        if case .bytes(let data) = provision, data.count < Self.announcedSize {
            do {
                if try DescriptorIO.writeWithoutWaiting(data, toPipe: fd) {
                    fd.closeQuietly()
                    return finish(call, nil, sessionPath, load)
                }
            } catch {
                fd.closeQuietly()
                return finish(call, Self.providerFailure(error), sessionPath, load)
            }
        }
        // The task inherits this actor: `call` stays on the loop, answered there once the
        // handler (which runs off the loop) is done.
        let task = Task {
            let failure: BrokerError?
            do {
                // Closed before the reply: the broker sees end of data, then the verdict.
                defer { fd.closeQuietly() }
                switch provision {
                case .data(let handler):
                    try await write(try await handler(), to: fd, sessionPath, load)
                case .bytes(let data):
                    try await write(data, to: fd, sessionPath, load)
                case .stream(let writer):
                    let thread = WriterThread()
                    defer { thread.finish() }
                    try await withTaskExecutorPreference(thread) {
                        try await writer(DataWriter(fd: fd, thread: thread) { [weak self] size in await self?.announce(sessionPath, load, size) })
                    }
                case .file, .heldFile:
                    throw BrokerError(.failed, "'\(type)' is a file representation")
                }
                failure = nil
            } catch {
                failure = Self.providerFailure(error)
            }
            finish(call, failure, sessionPath, load)
        }
        running[sessionPath, default: [:]][load] = task
    }

    /// From this size on, a load's size is announced: only then will the destination watch
    /// the bytes arrive.
    private static let announcedSize = 64 << 10

    private func write(_ data: Data, to fd: FileDescriptor, _ sessionPath: String, _ load: UInt32) async throws {
        if data.count >= Self.announcedSize {
            Task { await announce(sessionPath, load, UInt64(data.count)) }
        }
        try await DescriptorIO.writeAll(data, toPipe: fd)
    }

    /// What the broker hears when a provider's handler or its writing failed.
    private static func providerFailure(_ error: any Error) -> BrokerError {
        switch error {
        case let error as BrokerError: error
        case is CancellationError: BrokerError(.cancelled, "The load was cancelled")
        default: BrokerError(.providerFailed, "\(error)")
        }
    }

    /// Serves a file representation: the reply carries the descriptor, which sd-bus duplicates.
    private func provideFile(_ call: MethodCall) throws(BusError) {
        let (sessionPath, item, type, load) = try loadRequest(call)
        let handler: ItemProvider.FileHandler
        switch provision(sessionPath, item, type) {
        case .file(let fileHandler):
            handler = fileHandler
        case .heldFile(let held):
            // Answered now, on the loop: sd-bus sends a duplicate, and the provider keeps its own.
            replyWithFile(call, held.descriptor, sessionPath, load)
            loadRequestedNote(sessionPath, load, item, type)?()
            return
        case .data, .stream, .bytes, nil:
            throw BrokerError(.notFound, "No file representation '\(type)' for item \(item)").busError
        }
        // As for data (`provide`): the handler's task, queued on the loop first, starts first.
        let note = loadRequestedNote(sessionPath, load, item, type)
        defer { note.map(loop.execute) }
        let task = Task {
            do {
                let file = try await handler()
                defer { file.closeQuietly() }
                replyWithFile(call, file, sessionPath, load)
            } catch {
                finish(call, Self.providerFailure(error), sessionPath, load)
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

    /// Tells the app's session (its `events`) that the broker asked for a load, when called.
    private func loadRequestedNote(_ sessionPath: String, _ load: UInt32, _ item: UInt32, _ type: String) -> (@Sendable () -> Void)? {
        switch routes[sessionPath]?.role {
        case .source(let session): { session.noteLoadRequested(load: load, item: Int(item), type: type) }
        case .paste(let entry): { entry.noteLoadRequested(paste: sessionPath, load: load, item: Int(item), type: type) }
        case .pasteboard, .destination, nil: nil
        }
    }

    private func provision(_ sessionPath: String, _ item: UInt32, _ type: String) -> ItemProvider.Provision? {
        guard let export = providers[sessionPath], Int(item) < export.items.count else { return nil }
        return export.items[Int(item)].provision(for: type)
    }

    private func announce(_ sessionPath: String, _ load: UInt32, _ size: UInt64) async {
        try? await call(path: sessionPath, SessionMember.setExpectedSize, build: { m throws(BusError) in
            try m.append(load)
            try m.append(size)
        })
    }

    /// Sends `file` (sd-bus sends a duplicate; the caller still owns `file`).
    private func replyWithFile(_ call: MethodCall, _ file: FileDescriptor, _ sessionPath: String, _ load: UInt32) {
        running[sessionPath]?[load] = nil
        guard !call.answered else { return }
        do {
            try call.reply { r throws(BusError) in try r.append(fileDescriptor: file.rawValue) }
        } catch {
            call.fail(BrokerError(.failed, "Failed to send the file: \(error.message)").busError)
        }
    }

    private func finish(_ call: MethodCall, _ failure: BrokerError?, _ sessionPath: String, _ load: UInt32) {
        running[sessionPath]?[load] = nil
        guard !call.answered else { return }
        if let failure {
            call.fail(failure.busError)
        } else {
            _ = try? call.reply()
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
        let path = try await callManager(.presentToken, build: { m throws(BusError) in try m.append(token) },
                                         decode: { reply throws(BusError) in try reply.readObjectPath() })
        return try join(at: path)
    }

    /// The destination's side of a session this connection takes part in: one it presented
    /// the token of, or its own paste of an entry.
    func join(at path: String) throws(BrokerError) -> DropSession {
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
                // sd-bus calls this on the loop, the actor's executor (both checked).
                let m = LoopBound(m, loop: loop)
                assumeIsolated { $0.dispatch(m.value) }
            }
            routes[path] = SessionRoute(role: role, slot: slot)
        } catch {
            throw BrokerError(.failed, "Failed to subscribe to session signals: \(error.message)")
        }
    }

    /// Decodes a session signal here, where it arrived, and hands the session the values.
    private func dispatch(_ m: Message) {
        guard let path = m.path, let route = routes[path], let member = m.member,
              let signal = SessionSignal(member: member, m) else { return }
        let listening: Bool
        switch route.role {
        case .source(let session):
            if case .loadFinished(let load, _) = signal { loadEnded(path, load) }
            listening = session.handle(signal)
        case .destination(let session):
            listening = session.handle(signal)
        case .pasteboard(let entry):
            if case .pasted(let pastePath, let app) = signal {
                servePaste(at: pastePath, of: path, for: entry)
                entry.notePasted(pastePath, by: app)
            }
            listening = entry.handle(signal)
        case .paste(let entry):
            if case .loadFinished(let load, _) = signal { loadEnded(path, load) }
            listening = entry.handlePaste(path, signal)
        }
        if !listening { forget(path) }
    }

    /// Flocking: the provider learns the new items before the broker can ask for them.
    func addItems(_ items: [DragItem], to path: String) async throws(BrokerError) {
        let added = items.map(\.itemProvider)
        providers[path]?.items += added
        do {
            try await call(path: path, SessionMember.addItems, build: { m throws(BusError) in
                try m.openContainer("a", ItemDescriptor.signature)
                for item in items { try item.itemProvider.descriptor.encode(to: m) }
                try m.closeContainer()
            })
        } catch {
            // Exactly these providers: another AddItems may have gone in meanwhile.
            let refused = Set(added.map(ObjectIdentifier.init))
            providers[path]?.items.removeAll { refused.contains(ObjectIdentifier($0)) }
            throw error
        }
    }

    func forget(_ path: String) {
        routes[path] = nil
        providers[path] = nil
        running.removeValue(forKey: path)?.values.forEach { $0.cancel() }
    }
}

/// The broker this connection found: its unique name, and why it failed once it left the bus.
private struct BrokerPeer {
    var name = ""
    var gone: BrokerError?
}

/// A broker call's reply, decoded where it arrives, on the loop, by the caller's `decode`; an
/// error reply, or one `decode` cannot read, as the `BrokerError` the caller throws.
private final class DecodingReply<T: Sendable>: ReplyHandler {
    let continuation: UnsafeContinuation<Result<T, BrokerError>, Never>
    let decode: @Sendable (Message) throws(BusError) -> T

    init(_ continuation: UnsafeContinuation<Result<T, BrokerError>, Never>, _ decode: @escaping @Sendable (Message) throws(BusError) -> T) {
        self.continuation = continuation
        self.decode = decode
    }

    override func received(_ reply: Result<Message, BusError>) {
        switch reply {
        case .failure(let error):
            continuation.resume(returning: .failure(BrokerError(error)))
        case .success(let message):
            do {
                continuation.resume(returning: .success(try decode(message)))
            } catch {
                continuation.resume(returning: .failure(BrokerError(.failed, "Malformed reply from the broker: \(error.message)")))
            }
        }
    }
}

/// What this connection serves the broker for one drag: the items' providers, numbered as
/// the broker numbers them, and the exported provider object. Actor state, so it is touched
/// on the loop only.
private struct ProviderExport {
    var items: [ItemProvider]
    let object: ExportedObject
}

/// The subscription behind `monitor()`'s stream.
private struct MonitorSubscription {
    let generation: Int
    let slot: Slot
    let continuation: AsyncStream<MonitorEvent>.Continuation
}

private struct SessionRoute {
    enum Role {
        case source(DragSession)
        case destination(DropSession)
        /// This connection's own entry on the pasteboard.
        case pasteboard(PasteboardEntry)
        /// A paste of one of its entries, which it serves.
        case paste(PasteboardEntry)
    }
    let role: Role
    let slot: Slot
}

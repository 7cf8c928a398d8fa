import CSystemd
import Glibc

/// Owns an `sd_bus` connection attached to an `EventLoop`. Every use happens on the loop
/// thread (or while no thread runs the loop), and every use checks it: the `Bus` object may be
/// shared, what it does may not.
public final class Bus: @unchecked Sendable {
    private let bound: LoopBound<OpaquePointer>
    public let loop: EventLoop

    /// The `sd_bus*`; reading it off the loop's thread traps.
    public var handle: OpaquePointer { bound.value }

    private init(consuming handle: OpaquePointer, loop: EventLoop) {
        bound = LoopBound(handle, loop: loop)
        self.loop = loop
    }

    deinit {
        loop.preconditionCurrentOrIdle("sd_bus released")
        sd_bus_flush_close_unref(bound.value)
    }

    /// Connects as a client to `address`, or to the session bus when `address` is nil, and
    /// attaches to `loop`. Call before the loop starts or on the loop thread.
    public static func connect(address: String?, loop: EventLoop, description: String) throws(BusError) -> Bus {
        var raw: OpaquePointer?
        if let address {
            try check(sd_bus_new(&raw), "sd_bus_new")
            let bus = Bus(consuming: raw!, loop: loop)
            try check(sd_bus_set_address(raw, address), "sd_bus_set_address(\(address))")
            try check(sd_bus_set_bus_client(raw, 1), "sd_bus_set_bus_client")
            try check(sd_bus_negotiate_fds(raw, 1), "sd_bus_negotiate_fds")
            try check(sd_bus_set_description(raw, description), "sd_bus_set_description")
            try check(sd_bus_start(raw), "connecting to \(address)")
            try bus.attach()
            return bus
        }
        try check(sd_bus_open_user_with_description(&raw, description), "connecting to the session bus")
        let bus = Bus(consuming: raw!, loop: loop)
        try bus.attach()
        return bus
    }

    private func attach() throws(BusError) {
        try check(sd_bus_attach_event(handle, loop.handle, 0), "sd_bus_attach_event")
    }

    public var uniqueName: String {
        var name: UnsafePointer<CChar>?
        sd_bus_get_unique_name(handle, &name)
        return name.map { String(cString: $0) } ?? ""
    }

    /// Requests a well-known name without queueing: fails if someone else owns it.
    public func requestName(_ name: String) throws(BusError) {
        let r = sd_bus_request_name(handle, name, 0)
        if r == -EEXIST {
            throw BusError(name: "org.freedesktop.DBus.Error.AddressInUse", message: "The name \(name) is already owned")
        }
        try check(r, "requesting the name \(name)")
    }

    public func releaseName(_ name: String) throws(BusError) {
        try check(sd_bus_release_name(handle, name), "releasing the name \(name)")
    }

    // MARK: Messages

    public func newMethodCall(destination: String, path: String, interface: String, member: String) throws(BusError) -> Message {
        var m: OpaquePointer?
        // withCString lends each native string's own storage; passing the strings as pointers
        // directly would copy each into a new array, four allocations on every call.
        let handle = handle
        let r = destination.withCString { destination in
            path.withCString { path in
                interface.withCString { interface in
                    member.withCString { member in sd_bus_message_new_method_call(handle, &m, destination, path, interface, member) }
                }
            }
        }
        try check(r, "new method call \(interface).\(member)")
        return Message(consuming: m!, loop: loop)
    }

    /// Sends a method call; `completion` runs on the loop thread with the reply or the error.
    /// Dropping the returned slot cancels the call: `completion` then never runs.
    public func callAsync(_ message: Message, timeout: UInt64 = 0,
                          completion: @escaping (Result<Message, BusError>) -> Void) throws(BusError) -> Slot {
        let box = Unmanaged.passRetained(ReplyBox(loop: loop, completion))
        var slot: OpaquePointer?
        let r = sd_bus_call_async(handle, &slot, message.handle, { reply, userdata, _ in
            let box = Unmanaged<ReplyBox>.fromOpaque(userdata!).takeUnretainedValue()
            box.deliver(reply!)
            return 0
        }, box.toOpaque(), timeout)
        if r < 0 {
            box.release()
            throw BusError.system(r, "sd_bus_call_async")
        }
        sd_bus_slot_set_destroy_callback(slot) { userdata in
            Unmanaged<ReplyBox>.fromOpaque(userdata!).release()
        }
        return Slot(consuming: slot!, loop: loop)
    }

    /// Sends a method call and suspends until its reply; an error reply is thrown as `BusError`.
    /// `timeout` is in microseconds, 0 meaning sd-bus's default (25 s).
    ///
    /// Await it only where `loop.holdsTask(isolatedTo: #isolation)`: from an actor whose
    /// executor is the loop, or a task that prefers the loop as its executor. It runs in the
    /// caller's isolation, the reply resumes it there, on the loop, and a message must stay on
    /// its loop: decode it there and let only the decoded values leave. A nonisolated task
    /// that does not prefer the loop may be on its thread for a while (see `holdsTask`), but
    /// its reply would resume it anywhere, the message with it.
    nonisolated(nonsending) public func call(_ message: Message, timeout: UInt64 = 0) async throws(BusError) -> Message {
        precondition(loop.isCurrent, "Bus.call awaited off its event loop: call it from an actor whose executor is the loop")
        // The full check reads the task's executor preference under its status lock: the
        // caller made it already, and the tests (debug builds) make it again.
        let callerIsolation = #isolation
        assert(loop.holdsTask(isolatedTo: callerIsolation), "Bus.call awaited by a nonisolated task that does not prefer the loop: its reply would resume it elsewhere")
        return try await reply(to: message, timeout: timeout).get()
    }

    nonisolated(nonsending) private func reply(to message: Message, timeout: UInt64) async -> Result<Message, BusError> {
        // One allocation per call: the pending reply holds the continuation itself, and sd-bus
        // holds the pending reply until it calls back exactly once.
        await withUnsafeContinuation { continuation in
            do throws(BusError) {
                try send(message, timeout: timeout, replyTo: PendingReply(continuation))
            } catch {
                continuation.resume(returning: .failure(error))
            }
        }
    }

    /// Sends a method call whose reply `handler` receives, on the loop, in sd-bus's reply
    /// callback: exactly once unless this throws, and then never. The call cannot be cancelled.
    public func send(_ message: Message, timeout: UInt64 = 0, replyTo handler: ReplyHandler) throws(BusError) {
        handler.loop = loop
        let pending = Unmanaged.passRetained(handler)
        let r = sd_bus_call_async(handle, nil, message.handle, { reply, userdata, _ in
            let handler = Unmanaged<ReplyHandler>.fromOpaque(userdata!).takeRetainedValue()
            handler.received(methodResult(borrowing: reply!, loop: handler.loop))
            return 0
        }, pending.toOpaque(), timeout)
        if r < 0 {
            pending.release()
            throw BusError.system(r, "sd_bus_call_async")
        }
    }

    /// Messages sent but not yet written to the bus socket (sd_bus_get_n_queued_write): at 0,
    /// every message sent so far, and every descriptor in it, is in the kernel's hands.
    public var queuedWrites: UInt64 {
        var count: UInt64 = 0
        sd_bus_get_n_queued_write(handle, &count)
        return count
    }

    /// Writes every queued message out, e.g. the last signals before exiting.
    public func flush() {
        sd_bus_flush(handle)
    }

    /// Sends a message with no reply expected (signals, replies built by hand).
    public func send(_ message: Message) throws(BusError) {
        try check(sd_bus_send(handle, message.handle, nil), "sd_bus_send")
    }

    /// Emits a signal, unicast to `destination` when one is given so only that peer receives it.
    public func emitSignal(path: String, interface: String, member: String, destination: String? = nil,
                           _ build: (Message) throws(BusError) -> Void = { _ in }) throws(BusError) {
        var m: OpaquePointer?
        let handle = handle
        let r = path.withCString { path in
            interface.withCString { interface in
                member.withCString { member in sd_bus_message_new_signal(handle, &m, path, interface, member) }
            }
        }
        try check(r, "new signal \(interface).\(member)")
        let message = Message(consuming: m!, loop: loop)
        if let destination {
            let m = message.handle
            try check(destination.withCString { sd_bus_message_set_destination(m, $0) }, "set signal destination")
        }
        try build(message)
        try send(message)
    }

    public func emitPropertiesChanged(path: String, interface: String, properties: [String]) throws(BusError) {
        var pointers: [UnsafeMutablePointer<CChar>?] = properties.map { strdup($0) }
        pointers.append(nil)
        defer { pointers.forEach { free($0) } }
        try check(sd_bus_emit_properties_changed_strv(handle, path, interface, &pointers), "emit PropertiesChanged")
    }

    public func emitObjectAdded(path: String) throws(BusError) {
        try check(sd_bus_emit_object_added(handle, path), "emit InterfacesAdded")
    }

    public func emitObjectRemoved(path: String) throws(BusError) {
        try check(sd_bus_emit_object_removed(handle, path), "emit InterfacesRemoved")
    }

    /// Serves `org.freedesktop.DBus.ObjectManager` for the subtree at `path`.
    public func addObjectManager(path: String) throws(BusError) -> Slot {
        var slot: OpaquePointer?
        try check(sd_bus_add_object_manager(handle, &slot, path), "sd_bus_add_object_manager")
        return Slot(consuming: slot!, loop: loop)
    }

    /// Offers every method call under `prefix` to `handler` before any exported object sees it;
    /// the handler returns true when it answered the call itself.
    public func addFallback(prefix: String, handler: @escaping (MethodCall) -> Bool) throws(BusError) -> Slot {
        try addFilter(path: prefix, fallback: true, handler: handler)
    }

    /// Offers every method call on `path` itself to `handler` before sd-bus's own handling
    /// (vtables, Properties, ObjectManager); the handler returns true when it answered.
    public func addObjectFilter(path: String, handler: @escaping (MethodCall) -> Bool) throws(BusError) -> Slot {
        try addFilter(path: path, fallback: false, handler: handler)
    }

    private func addFilter(path: String, fallback: Bool, handler: @escaping (MethodCall) -> Bool) throws(BusError) -> Slot {
        let box = Unmanaged.passRetained(FallbackBox(handler))
        var slot: OpaquePointer?
        let callback: sd_bus_message_handler_t = { m, userdata, _ in
            let box = Unmanaged<FallbackBox>.fromOpaque(userdata!).takeUnretainedValue()
            let bus = box.bus!
            return box.handler(MethodCall(message: Message(borrowing: m!, loop: bus.loop), bus: bus)) ? 1 : 0
        }
        let r = fallback ? sd_bus_add_fallback(handle, &slot, path, callback, box.toOpaque())
                         : sd_bus_add_object(handle, &slot, path, callback, box.toOpaque())
        if r < 0 {
            box.release()
            throw BusError.system(r, fallback ? "sd_bus_add_fallback" : "sd_bus_add_object")
        }
        box.takeUnretainedValue().bus = self
        sd_bus_slot_set_destroy_callback(slot) { userdata in
            Unmanaged<FallbackBox>.fromOpaque(userdata!).release()
        }
        return Slot(consuming: slot!, loop: loop)
    }

    /// Whether the connection still works: false once the bus has gone away.
    public var isOpen: Bool {
        sd_bus_is_open(handle) > 0
    }

    /// Calls `handler` when the connection to the bus is lost: sd-bus's local `Disconnected`
    /// signal. Without it a process keeps running with no connection, alive but useless.
    public func onDisconnect(_ handler: @escaping () -> Void) throws(BusError) -> Slot {
        try matchSignal(sender: "org.freedesktop.DBus.Local", path: "/org/freedesktop/DBus/Local",
                        interface: "org.freedesktop.DBus.Local", member: "Disconnected") { _ in handler() }
    }

    /// Calls `handler` with the new owner (empty when none) each time `name` changes owner;
    /// the bus sends this connection only that name's changes.
    public func watchOwner(of name: String, handler: @escaping (String) -> Void) throws(BusError) -> Slot {
        try addMatch(Self.rule(sender: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                               member: "NameOwnerChanged") + ",arg0='\(name)'") { m in
            guard (try? m.readString()) == name, (try? m.readString()) != nil, let owner = try? m.readString() else { return }
            handler(owner)
        }
    }

    /// Calls `handler` for each signal matching the given fields (nil = any).
    public func matchSignal(sender: String?, path: String?, interface: String?, member: String?,
                            handler: @escaping (Message) -> Void) throws(BusError) -> Slot {
        try addMatch(Self.rule(sender: sender, path: path, interface: interface, member: member), handler)
    }

    private static func rule(sender: String?, path: String?, interface: String?, member: String?) -> String {
        (["type='signal'"] + [("sender", sender), ("path", path), ("interface", interface), ("member", member)]
            .compactMap { key, value in value.map { "\(key)='\($0)'" } }).joined(separator: ",")
    }

    private func addMatch(_ rule: String, _ handler: @escaping (Message) -> Void) throws(BusError) -> Slot {
        let box = Unmanaged.passRetained(SignalBox(loop: loop, handler))
        var slot: OpaquePointer?
        let r = sd_bus_add_match(handle, &slot, rule, { m, userdata, _ in
            let box = Unmanaged<SignalBox>.fromOpaque(userdata!).takeUnretainedValue()
            box.handler(Message(borrowing: m!, loop: box.loop))
            return 0
        }, box.toOpaque())
        if r < 0 {
            box.release()
            throw BusError.system(r, "sd_bus_add_match(\(rule))")
        }
        sd_bus_slot_set_destroy_callback(slot) { userdata in
            Unmanaged<SignalBox>.fromOpaque(userdata!).release()
        }
        return Slot(consuming: slot!, loop: loop)
    }

    /// Asks the bus driver, now, for the PID and EUID of the connection owning `name`.
    public func credentials(ofName name: String) throws(BusError) -> Credentials {
        var creds: OpaquePointer?
        try check(sd_bus_get_name_creds(handle, name, shim_creds_pid_euid_unique(), &creds), "querying the credentials of \(name)")
        defer { sd_bus_creds_unref(creds) }
        var pid: pid_t = 0
        var euid: uid_t = 0
        try check(sd_bus_creds_get_pid(creds, &pid), "reading the PID of \(name)")
        try check(sd_bus_creds_get_euid(creds, &euid), "reading the EUID of \(name)")
        return Credentials(uniqueName: name, pid: pid, euid: euid)
    }

    /// Asks the bus driver for the current owner of a name.
    nonisolated(nonsending) public func nameOwner(_ name: String) async throws(BusError) -> String {
        let m = try newMethodCall(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                  interface: "org.freedesktop.DBus", member: "GetNameOwner")
        try m.append(name)
        let reply = try await call(m)
        return try reply.readString()
    }
}

/// Kernel-verified facts about a bus peer, as the bus driver reports them.
public struct Credentials: Sendable, Equatable {
    public var uniqueName: String
    public var pid: pid_t
    public var euid: uid_t
}

/// Owns an `sd_bus_slot`; dropping it removes the match, object or call it stands for, so it
/// is dropped on its loop's thread like everything else of the bus (checked).
public final class Slot: @unchecked Sendable {
    private let loop: EventLoop
    private let handle: OpaquePointer
    init(consuming handle: OpaquePointer, loop: EventLoop) {
        self.handle = handle
        self.loop = loop
    }
    deinit {
        loop.preconditionCurrentOrIdle("sd_bus_slot released")
        sd_bus_slot_unref(handle)
    }
}

/// Where a method reply goes, reached from sd-bus's callback through `userdata`.
private final class ReplyBox {
    let loop: EventLoop
    let completion: (Result<Message, BusError>) -> Void
    init(loop: EventLoop, _ completion: @escaping (Result<Message, BusError>) -> Void) {
        self.loop = loop
        self.completion = completion
    }

    func deliver(_ reply: OpaquePointer) {
        completion(methodResult(borrowing: reply, loop: loop))
    }
}

/// Wraps the reply sd-bus lends to a reply callback, an error reply as its error.
private func methodResult(borrowing reply: OpaquePointer, loop: EventLoop) -> Result<Message, BusError> {
    let message = Message(borrowing: reply, loop: loop)
    if let error = message.error { return .failure(error) }
    return .success(message)
}

/// What receives a method call's reply sent with `Bus.send(_:timeout:replyTo:)`. A subclass
/// reads the reply in `received`, on the loop, where the message lives, and lets only what it
/// read leave: the caller waiting for it may resume anywhere.
open class ReplyHandler {
    /// The sending bus's loop, set as the call is sent.
    fileprivate unowned(unsafe) var loop: EventLoop!

    public init() {}

    /// The reply, an error reply as its error. Like every message it belongs to the loop:
    /// read it here.
    open func received(_ reply: Result<Message, BusError>) {}
}

/// A call awaited by `Bus.call`: the reply is wrapped on the loop and resumed in the caller's
/// isolation, which is on the loop too (checked there), so it never leaves the loop's thread.
private final class PendingReply: ReplyHandler {
    let continuation: UnsafeContinuation<Result<Message, BusError>, Never>
    init(_ continuation: UnsafeContinuation<Result<Message, BusError>, Never>) {
        self.continuation = continuation
    }

    override func received(_ reply: Result<Message, BusError>) {
        nonisolated(unsafe) let reply = reply
        continuation.resume(returning: reply)
    }
}

private final class SignalBox {
    let loop: EventLoop
    let handler: (Message) -> Void
    init(loop: EventLoop, _ handler: @escaping (Message) -> Void) {
        self.loop = loop
        self.handler = handler
    }
}

private final class FallbackBox {
    let handler: (MethodCall) -> Bool
    weak var bus: Bus?
    init(_ handler: @escaping (MethodCall) -> Bool) { self.handler = handler }
}

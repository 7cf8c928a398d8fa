import CSystemd
import Glibc

/// A declarative description of one D-Bus interface: the member table sd-bus's vtable is
/// built from. Argument names matter: they appear in introspection.
public struct InterfaceDescription: Sendable {
    public let name: String
    public let methods: [Method]
    public let properties: [Property]
    public let signals: [Signal]

    public init(name: String, methods: [Method] = [], properties: [Property] = [], signals: [Signal] = []) {
        self.name = name
        self.methods = methods
        self.properties = properties
        self.signals = signals
    }

    public struct Argument: Sendable {
        public let name: String
        public let signature: String
        public init(_ name: String, _ signature: String) {
            self.name = name
            self.signature = signature
        }
    }

    public struct Method: Sendable {
        public let name: String
        public let input: [Argument]
        public let output: [Argument]
        public init(_ name: String, in input: [Argument] = [], out output: [Argument] = []) {
            self.name = name
            self.input = input
            self.output = output
        }
    }

    public struct Property: Sendable {
        /// How its changes are announced: never, with the new value, or as invalidated only
        /// (for a value that differs per caller, which a broadcast cannot carry).
        public enum Change: Sendable { case constant, emitsChange, emitsInvalidation }
        public let name: String
        public let signature: String
        public let change: Change
        public init(_ name: String, _ signature: String, _ change: Change) {
            self.name = name
            self.signature = signature
            self.change = change
        }
    }

    public struct Signal: Sendable {
        public let name: String
        public let arguments: [Argument]
        public init(_ name: String, _ arguments: [Argument] = []) {
            self.name = name
            self.arguments = arguments
        }
    }

    public func method(_ name: String) -> Method? { methods.first { $0.name == name } }
}

/// An incoming method call. Reply now, or keep it and reply later (exactly once). Like its
/// `Message` it belongs to the loop: not `Sendable`, so keeping it for later means keeping it
/// in the loop's isolation (an actor on the loop, a task that inherits that actor).
public final class MethodCall {
    public let message: Message
    public let bus: Bus
    public private(set) var answered = false

    init(message: Message, bus: Bus) {
        self.message = message
        self.bus = bus
    }

    /// The caller's unique bus name.
    public var sender: String { message.sender ?? "" }

    /// Builds and sends the reply, and returns it: a caller that put a descriptor in it may
    /// keep it, so that sd-bus does not close its copy of the descriptor (see `Bus.queuedWrites`).
    @discardableResult
    public func reply(_ build: (Message) throws(BusError) -> Void = { _ in }) throws(BusError) -> Message {
        precondition(!answered, "method call answered twice")
        var r: OpaquePointer?
        try check(sd_bus_message_new_method_return(message.handle, &r), "new method return")
        let reply = Message(consuming: r!, loop: bus.loop)
        try build(reply)
        try bus.send(reply)
        answered = true
        return reply
    }

    public func fail(_ error: BusError) {
        precondition(!answered, "method call answered twice")
        answered = true
        var e = sd_bus_error(name: nil, message: nil, _need_free: 0)
        _ = error.fill(&e)
        sd_bus_reply_method_error(message.handle, &e)
        sd_bus_error_free(&e)
    }
}

/// Handlers for one exported interface, keyed by member name.
public struct InterfaceImplementation {
    public typealias MethodHandler = (MethodCall) throws(BusError) -> Void
    /// Appends the value to the reply; `path` says which object, for handlers a subtree shares.
    /// The reply's `destination` is the caller (sd-bus addresses a reply to the call's sender);
    /// it is nil when sd-bus builds a signal itself, which nobody in particular receives.
    public typealias PropertyGetter = (_ reply: Message, _ path: String) throws(BusError) -> Void

    public var methods: [String: MethodHandler]
    public var properties: [String: PropertyGetter]

    public init(methods: [String: MethodHandler] = [:], properties: [String: PropertyGetter] = [:]) {
        self.methods = methods
        self.properties = properties
    }
}

/// The handlers of one exported object, reached from sd-bus callbacks through `userdata`.
public final class ObjectHandlers: @unchecked Sendable {
    let implementation: InterfaceImplementation
    unowned let bus: Bus

    init(implementation: InterfaceImplementation, bus: Bus) {
        self.implementation = implementation
        self.bus = bus
    }

    fileprivate func dispatch(_ message: Message, _ error: UnsafeMutablePointer<sd_bus_error>?) -> Int32 {
        guard let member = message.member, let handler = implementation.methods[member] else {
            return BusError(name: "org.freedesktop.DBus.Error.UnknownMethod", message: "Unknown method").fill(error)
        }
        let call = MethodCall(message: message, bus: bus)
        do {
            try handler(call)
            return 1
        } catch let failure {
            if call.answered { return 1 }
            return failure.fill(error)
        }
    }

    fileprivate func get(_ name: String, _ reply: Message, _ path: String, _ error: UnsafeMutablePointer<sd_bus_error>?) -> Int32 {
        guard let getter = implementation.properties[name] else {
            return BusError(name: "org.freedesktop.DBus.Error.UnknownProperty", message: "Unknown property \(name)").fill(error)
        }
        do {
            try getter(reply, path)
            return 1
        } catch let failure {
            return failure.fill(error)
        }
    }
}

/// An sd-bus vtable built from a description, with the C strings it points to. The method
/// and property trampolines find their `ObjectHandlers` in `userdata`.
final class VTable {
    private(set) var table: UnsafeMutablePointer<sd_bus_vtable>?
    private var cStrings: [UnsafeMutablePointer<CChar>] = []

    init(_ interface: InterfaceDescription, implementation: InterfaceImplementation) {
        for method in interface.methods where implementation.methods[method.name] == nil {
            preconditionFailure("\(interface.name).\(method.name) has no handler")
        }
        for property in interface.properties where implementation.properties[property.name] == nil {
            preconditionFailure("\(interface.name).\(property.name) has no getter")
        }
        var entries: [sd_bus_vtable] = [shim_vtable_start(0)]
        for method in interface.methods {
            entries.append(shim_vtable_method(
                keep(method.name),
                keep(method.input.map(\.signature).joined()),
                keep(method.output.map(\.signature).joined()),
                keepNames(method.input + method.output),
                { m, userdata, error in
                    let handlers = Unmanaged<ObjectHandlers>.fromOpaque(userdata!).takeUnretainedValue()
                    return handlers.dispatch(Message(borrowing: m!, loop: handlers.bus.loop), error)
                },
                // Authorisation is the daemon's own, per caller identity, not sd-bus's UID check.
                shim_vtable_flag_unprivileged()))
        }
        for property in interface.properties {
            let flags = switch property.change {
            case .constant: shim_vtable_flag_property_const()
            case .emitsChange: shim_vtable_flag_property_emits_change()
            case .emitsInvalidation: shim_vtable_flag_property_emits_invalidation()
            }
            entries.append(shim_vtable_property(keep(property.name), keep(property.signature), { _, path, _, name, reply, userdata, error in
                let handlers = Unmanaged<ObjectHandlers>.fromOpaque(userdata!).takeUnretainedValue()
                return handlers.get(String(cString: name!), Message(borrowing: reply!, loop: handlers.bus.loop), String(cString: path!), error)
            }, flags))
        }
        for signal in interface.signals {
            entries.append(shim_vtable_signal(keep(signal.name), keep(signal.arguments.map(\.signature).joined()),
                                              keepNames(signal.arguments), 0))
        }
        entries.append(shim_vtable_end())
        let table = UnsafeMutablePointer<sd_bus_vtable>.allocate(capacity: entries.count)
        table.initialize(from: entries, count: entries.count)
        self.table = table
    }

    deinit {
        table?.deallocate()
        cStrings.forEach { free($0) }
    }

    private func keep(_ string: String) -> UnsafeMutablePointer<CChar> {
        let p = strdup(string)!
        cStrings.append(p)
        return p
    }

    /// sd-bus reads parameter names as consecutive NUL-terminated strings.
    private func keepNames(_ arguments: [InterfaceDescription.Argument]) -> UnsafeMutablePointer<CChar> {
        var bytes: [CChar] = []
        for argument in arguments {
            bytes.append(contentsOf: argument.name.utf8CString)
        }
        bytes.append(0)
        let p = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count)
        p.initialize(from: bytes, count: bytes.count)
        cStrings.append(p)
        return p
    }
}

/// One interface exported at one path. Dropping it unregisters the object.
public final class ExportedObject: @unchecked Sendable {
    public let path: String
    public let interface: InterfaceDescription
    private let loop: EventLoop
    private let handlers: ObjectHandlers
    private let vtable: VTable
    private var slot: OpaquePointer?

    init(bus: Bus, path: String, interface: InterfaceDescription, implementation: InterfaceImplementation) throws(BusError) {
        loop = bus.loop
        self.path = path
        self.interface = interface
        handlers = ObjectHandlers(implementation: implementation, bus: bus)
        vtable = VTable(interface, implementation: implementation)
        let r = sd_bus_add_object_vtable(bus.handle, &slot, path, interface.name, vtable.table,
                                         Unmanaged.passUnretained(handlers).toOpaque())
        try check(r, "exporting \(interface.name) at \(path)")
    }

    deinit {
        loop.preconditionCurrentOrIdle("exported object \(path) released")
        sd_bus_slot_unref(slot)
    }
}

/// One interface served for a family of objects under a prefix, which exist per caller:
/// `find` decides whether the path exists for the message being handled (nil while emitting
/// our own signals), and `enumerate` which children each peer sees in introspection and
/// ObjectManager. What a peer may not see does not exist for it.
public final class ExportedSubtree: @unchecked Sendable {
    public typealias Find = (_ path: String, _ message: Message?) -> ObjectHandlers?
    public typealias Enumerate = (_ caller: String?) -> [String]
    private let vtable: VTable
    private let find: Find
    private let enumerate: Enumerate
    fileprivate unowned let bus: Bus
    private let loop: EventLoop
    private var vtableSlot: OpaquePointer?
    private var enumeratorSlot: OpaquePointer?

    init(bus: Bus, prefix: String, interface: InterfaceDescription, template: InterfaceImplementation,
         find: @escaping Find, enumerate: @escaping Enumerate) throws(BusError) {
        self.bus = bus
        loop = bus.loop
        self.find = find
        self.enumerate = enumerate
        vtable = VTable(interface, implementation: template)
        let me = Unmanaged.passUnretained(self).toOpaque()
        var r = sd_bus_add_fallback_vtable(bus.handle, &vtableSlot, prefix, interface.name, vtable.table, { bus, path, _, userdata, found, _ in
            let subtree = Unmanaged<ExportedSubtree>.fromOpaque(userdata!).takeUnretainedValue()
            guard let handlers = subtree.find(String(cString: path!), subtree.bus.currentMessage) else { return 0 }
            found!.pointee = Unmanaged.passUnretained(handlers).toOpaque()
            return 1
        }, me)
        try check(r, "exporting \(interface.name) under \(prefix)")
        r = sd_bus_add_node_enumerator(bus.handle, &enumeratorSlot, prefix, { _, _, userdata, nodes, _ in
            let subtree = Unmanaged<ExportedSubtree>.fromOpaque(userdata!).takeUnretainedValue()
            let paths = subtree.enumerate(subtree.bus.currentMessage?.sender)
            // sd-bus frees the array and its strings with free(3), so both come from malloc(3).
            let size = MemoryLayout<UnsafeMutablePointer<CChar>?>.stride * (paths.count + 1)
            guard let raw = malloc(size) else { return -ENOMEM }
            let array = raw.bindMemory(to: UnsafeMutablePointer<CChar>?.self, capacity: paths.count + 1)
            for (i, path) in paths.enumerated() { array[i] = strdup(path) }
            array[paths.count] = nil
            nodes!.pointee = array
            return 1
        }, me)
        try check(r, "enumerating \(prefix)")
    }

    deinit {
        loop.preconditionCurrentOrIdle("exported subtree released")
        sd_bus_slot_unref(enumeratorSlot)
        sd_bus_slot_unref(vtableSlot)
    }
}

extension Bus {
    /// The message sd-bus is handling now, if any: the same one for its filters, its find
    /// callbacks, the method handler and property getters it runs for that message.
    public var currentMessage: Message? {
        sd_bus_get_current_message(handle).map { Message(borrowing: $0, loop: loop) }
    }

    /// Exports `interface` at `path`, dispatching to `implementation`'s handlers on the loop thread.
    public func export(path: String, interface: InterfaceDescription,
                       implementation: InterfaceImplementation) throws(BusError) -> ExportedObject {
        try ExportedObject(bus: self, path: path, interface: interface, implementation: implementation)
    }

    /// Serves `interface` for objects under `prefix` that exist per caller (see `ExportedSubtree`).
    /// `template` only fixes the member table; each object's handlers come from `find`.
    public func exportSubtree(prefix: String, interface: InterfaceDescription, template: InterfaceImplementation,
                              find: @escaping ExportedSubtree.Find, enumerate: @escaping ExportedSubtree.Enumerate) throws(BusError) -> ExportedSubtree {
        try ExportedSubtree(bus: self, prefix: prefix, interface: interface, template: template, find: find, enumerate: enumerate)
    }

    /// The handlers for one object of a subtree; keep them alive as long as the object exists.
    public func handlers(for implementation: InterfaceImplementation) -> ObjectHandlers {
        ObjectHandlers(implementation: implementation, bus: self)
    }
}

import CSystemd
import SystemCalls

/// Owns one reference to an `sd_bus_message`. Appends and reads mirror
/// `sd_bus_message_append_basic` / `sd_bus_message_read_basic` one to one.
///
/// A message belongs to its bus's event loop: the last unref of a message unrefs its
/// `sd_bus`, which is not thread-safe. So it is not `Sendable` (the compiler keeps it in the
/// isolation it was made in: decode it there and send the values), and every use, its
/// release included, checks that it happens on the loop's thread (or while no thread runs
/// the loop), in release builds too.
public final class Message {
    private let bound: LoopBound<OpaquePointer>

    /// The `sd_bus_message*`; reading it off the loop's thread traps.
    public var handle: OpaquePointer { bound.value }

    /// Takes over a reference the caller already owns.
    init(consuming handle: OpaquePointer, loop: EventLoop) {
        bound = LoopBound(handle, loop: loop)
    }

    /// Takes a new reference, for messages sd-bus lends to a callback.
    init(borrowing handle: OpaquePointer, loop: EventLoop) {
        bound = LoopBound(sd_bus_message_ref(handle), loop: loop)
    }

    deinit {
        bound.loop.preconditionCurrentOrIdle("sd_bus_message released")
        sd_bus_message_unref(bound.value)
    }

    public var sender: String? { sd_bus_message_get_sender(handle).map { String(cString: $0) } }
    /// For a reply being built, the peer it goes to.
    public var destination: String? { sd_bus_message_get_destination(handle).map { String(cString: $0) } }
    public var member: String? { sd_bus_message_get_member(handle).map { String(cString: $0) } }
    public var path: String? { sd_bus_message_get_path(handle).map { String(cString: $0) } }
    /// The sender's serial number for the message: with the sender, it names the message.
    public var cookie: UInt64 {
        var cookie: UInt64 = 0
        _ = sd_bus_message_get_cookie(handle, &cookie)
        return cookie
    }
    /// The signature of everything the message carries.
    public var signature: String { sd_bus_message_get_signature(handle, 1).map { String(cString: $0) } ?? "" }
    public var interface: String? { sd_bus_message_get_interface(handle).map { String(cString: $0) } }

    /// The error this message carries, when it is an error reply.
    public var error: BusError? {
        guard let error = sd_bus_message_get_error(handle), sd_bus_error_is_set(error) != 0 else { return nil }
        return BusError(error)
    }

    // MARK: Appending

    public func append(_ value: String) throws(BusError) {
        try write { $0.append(value) }
    }

    public func append(objectPath value: String) throws(BusError) {
        try write { $0.append(objectPath: value) }
    }

    public func append(_ value: Bool) throws(BusError) {
        var v: Int32 = value ? 1 : 0
        try check(sd_bus_message_append_basic(handle, CChar(UInt8(ascii: "b")), &v), "append boolean")
    }

    public func append(_ value: UInt32) throws(BusError) { try appendTrivial(value, "u") }
    public func append(_ value: Int32) throws(BusError) { try appendTrivial(value, "i") }
    public func append(_ value: UInt64) throws(BusError) { try appendTrivial(value, "t") }
    public func append(_ value: Int64) throws(BusError) { try appendTrivial(value, "x") }
    public func append(_ value: Double) throws(BusError) { try appendTrivial(value, "d") }

    /// Appends a descriptor; sd-bus duplicates it, so the caller keeps its own.
    public func append(fileDescriptor fd: Int32) throws(BusError) { try appendTrivial(fd, "h") }

    /// An `a{sv}`, in the order given.
    public func append(variantDictionary entries: [(key: String, value: VariantValue)]) throws(BusError) {
        try openContainer("a", "{sv}")
        for (key, value) in entries {
            try openContainer("e", "sv")
            try append(key)
            switch value {
            case .string(let v): try openContainer("v", "s"); try append(v)
            case .bool(let v): try openContainer("v", "b"); try append(v)
            case .uint32(let v): try openContainer("v", "u"); try append(v)
            case .uint64(let v): try openContainer("v", "t"); try append(v)
            case .int32(let v): try openContainer("v", "i"); try append(v)
            case .int64(let v): try openContainer("v", "x"); try append(v)
            case .double(let v): try openContainer("v", "d"); try append(v)
            case .other(let type): throw .invalidArguments("cannot write a variant of type '\(type)'")
            }
            try closeContainer()
            try closeContainer()
        }
        try closeContainer()
    }

    private func appendTrivial<T: BitwiseCopyable>(_ value: T, _ type: Unicode.Scalar) throws(BusError) {
        var v = value
        try check(sd_bus_message_append_basic(handle, CChar(UInt8(ascii: type)), &v), "append \(type)")
    }

    public func openContainer(_ type: Unicode.Scalar, _ contents: String) throws(BusError) {
        let handle = handle
        try check(contents.withCString { sd_bus_message_open_container(handle, CChar(UInt8(ascii: type)), $0) },
                  "open container \(type)\(contents)")
    }

    public func closeContainer() throws(BusError) {
        try check(sd_bus_message_close_container(handle), "close container")
    }

    // MARK: Reading

    public func readString() throws(BusError) -> String { try readStringLike("s") }
    public func readObjectPath() throws(BusError) -> String { try readStringLike("o") }

    /// An `as`.
    public func readStrings() throws(BusError) -> [String] {
        var strings: [String] = []
        _ = try enterContainer("a", "s")
        while try peekType() != nil { strings.append(try readString()) }
        try exitContainer()
        return strings
    }

    public func readBool() throws(BusError) -> Bool {
        let v: Int32 = try readTrivial("b", 0)
        return v != 0
    }

    public func readUInt32() throws(BusError) -> UInt32 { try readTrivial("u", 0) }
    public func readInt32() throws(BusError) -> Int32 { try readTrivial("i", 0) }
    public func readUInt64() throws(BusError) -> UInt64 { try readTrivial("t", 0) }
    public func readInt64() throws(BusError) -> Int64 { try readTrivial("x", 0) }
    public func readDouble() throws(BusError) -> Double { try readTrivial("d", 0) }

    /// Reads a descriptor. It belongs to the message: dup it to keep it beyond the message's life.
    public func readBorrowedFileDescriptor() throws(BusError) -> Int32 { try readTrivial("h", -1) }

    /// Reads a descriptor and returns a duplicate the caller owns (close-on-exec).
    public func readFileDescriptor() throws(BusError) -> Int32 {
        let borrowed = try readBorrowedFileDescriptor()
        do {
            return try FileDescriptor(rawValue: borrowed).duplicateCloseOnExec().rawValue
        } catch {
            throw BusError.system(-error.rawValue, "F_DUPFD_CLOEXEC")
        }
    }

    private func readStringLike(_ type: Unicode.Scalar) throws(BusError) -> String {
        var p: UnsafePointer<CChar>?
        let r = sd_bus_message_read_basic(handle, CChar(UInt8(ascii: type)), &p)
        try checkRead(r, type)
        return String(cString: p!)
    }

    private func readTrivial<T: BitwiseCopyable>(_ type: Unicode.Scalar, _ initial: T) throws(BusError) -> T {
        var v = initial
        let r = sd_bus_message_read_basic(handle, CChar(UInt8(ascii: type)), &v)
        try checkRead(r, type)
        return v
    }

    private func checkRead(_ r: Int32, _ type: Unicode.Scalar) throws(BusError) {
        if r == 0 { throw BusError.invalidArguments("missing argument of type '\(type)'") }
        if r < 0 { throw BusError.invalidArguments("expected an argument of type '\(type)'") }
    }

    /// Enters a container; returns false at the end of an enclosing array.
    public func enterContainer(_ type: Unicode.Scalar, _ contents: String) throws(BusError) -> Bool {
        let r = sd_bus_message_enter_container(handle, CChar(UInt8(ascii: type)), contents)
        if r < 0 { throw BusError.invalidArguments("expected a container '\(type)' of '\(contents)'") }
        return r > 0
    }

    public func exitContainer() throws(BusError) {
        let r = sd_bus_message_exit_container(handle)
        if r < 0 { throw BusError.invalidArguments("malformed container") }
    }

    /// The type and contents of the next element, or nil at the end of the current container.
    public func peekType() throws(BusError) -> (type: Unicode.Scalar, contents: String?)? {
        var type: CChar = 0
        var contents: UnsafePointer<CChar>?
        let r = sd_bus_message_peek_type(handle, &type, &contents)
        if r < 0 { throw BusError.system(r, "sd_bus_message_peek_type") }
        if r == 0 { return nil }
        return (Unicode.Scalar(UInt8(bitPattern: type)), contents.map { String(cString: $0) })
    }

    public func skip(_ types: String) throws(BusError) {
        try check(sd_bus_message_skip(handle, types), "skip \(types)")
    }

    public func rewind() throws(BusError) {
        try check(sd_bus_message_rewind(handle, 1), "rewind")
    }
}

extension BusError {
    /// sd-bus's own name for malformed arguments, used before the caller's interface is known.
    public static func invalidArguments(_ message: String) -> BusError {
        BusError(name: "org.freedesktop.DBus.Error.InvalidArgs", message: message)
    }
}

/// The basic values a variant in an `a{sv}` can carry that this project uses.
public enum VariantValue: Sendable, Equatable {
    case string(String), bool(Bool), uint32(UInt32), uint64(UInt64), int32(Int32), int64(Int64), double(Double)
    /// A type this reader does not decode; skipped.
    case other(String)

    public var string: String? { if case .string(let v) = self { v } else { nil } }
    public var bool: Bool? { if case .bool(let v) = self { v } else { nil } }
    public var uint32: UInt32? { if case .uint32(let v) = self { v } else { nil } }
}

extension Message {
    /// Reads an `a{sv}` of basic values.
    public func readVariantDictionary() throws(BusError) -> [String: VariantValue] {
        var result: [String: VariantValue] = [:]
        _ = try enterContainer("a", "{sv}")
        while try enterContainer("e", "sv") {
            let key = try readString()
            guard let (_, contents) = try peekType(), let contents else { throw .invalidArguments("variant without contents") }
            _ = try enterContainer("v", contents)
            switch contents {
            case "s": result[key] = .string(try readString())
            case "b": result[key] = .bool(try readBool())
            case "u": result[key] = .uint32(try readUInt32())
            case "t": result[key] = .uint64(try readUInt64())
            case "i": result[key] = .int32(try readInt32())
            case "x": result[key] = .int64(try readInt64())
            case "d": result[key] = .double(try readDouble())
            default:
                try skip(contents)
                result[key] = .other(contents)
            }
            try exitContainer()
            try exitContainer()
        }
        try exitContainer()
        return result
    }
}

/// Appends to one message through its raw pointer, with one loop check for the whole body
/// and no reference counting per call: for replies of thousands of elements, where the typed
/// `Message` API's per-call overhead outweighs sd-bus's own work. The first failure stops
/// every later append and is thrown when the body returns.
public struct MessageWriter: ~Copyable {
    private let handle: OpaquePointer
    private var failure: (result: Int32, what: String)?

    fileprivate init(_ handle: OpaquePointer) { self.handle = handle }

    private var failed: Bool { failure != nil }

    private mutating func record(_ result: Int32, _ what: @autoclosure () -> String) {
        if result < 0 { failure = (result, what()) }
    }

    public mutating func open(_ type: Unicode.Scalar, _ contents: StaticString) {
        guard !failed else { return }
        let contentsPointer = UnsafeRawPointer(contents.utf8Start).assumingMemoryBound(to: CChar.self)
        record(sd_bus_message_open_container(handle, CChar(UInt8(ascii: type)), contentsPointer), "open container \(type)\(contents)")
    }

    /// A variant whose signature is known only at run time, such as a property's from its table
    /// row. Not an overload of `open`: a literal would take a `String` overload over the
    /// `StaticString` one.
    public mutating func openVariant(_ signature: String) {
        guard !failed else { return }
        let handle = handle
        let r = signature.withCString { sd_bus_message_open_container(handle, CChar(UInt8(ascii: "v")), $0) }
        record(r, "open container v\(signature)")
    }

    public mutating func close() {
        guard !failed else { return }
        record(sd_bus_message_close_container(handle), "close container")
    }

    // Strings go through `withCString`, which lends a native string's own NUL-terminated
    // storage; the implicit conversion to a pointer would copy each one into a new array.

    public mutating func append(_ value: String) {
        guard !failed else { return }
        let handle = handle
        record(value.withCString { sd_bus_message_append_basic(handle, CChar(UInt8(ascii: "s")), $0) }, "append string")
    }

    public mutating func append(objectPath value: String) {
        guard !failed else { return }
        let handle = handle
        record(value.withCString { sd_bus_message_append_basic(handle, CChar(UInt8(ascii: "o")), $0) }, "append object path")
    }

    public mutating func append(_ value: UInt32) {
        guard !failed else { return }
        var v = value
        record(sd_bus_message_append_basic(handle, CChar(UInt8(ascii: "u")), &v), "append u")
    }

    public mutating func append(_ value: UInt64) {
        guard !failed else { return }
        var v = value
        record(sd_bus_message_append_basic(handle, CChar(UInt8(ascii: "t")), &v), "append t")
    }

    fileprivate consuming func finish() throws(BusError) {
        if let failure { throw BusError.system(failure.result, failure.what) }
    }
}

extension Message {
    /// Runs `body` with a `MessageWriter` on this message (see there).
    public func write(_ body: (inout MessageWriter) -> Void) throws(BusError) {
        var writer = MessageWriter(handle)
        body(&writer)
        try writer.finish()
    }
}

import BrokerProtocol
import BusKit
import Foundation

/// A raw bus client for tests that speak the wire protocol directly, as a non-Swift client would.
///
/// No thread of its own: each call runs the probe's loop on the calling thread until the
/// reply is in. Between calls nothing runs the loop, so the test's thread may read the replies
/// and let them go, as BusKit requires of everything that belongs to a loop.
final class BusProbe {
    let loop: EventLoop
    let bus: Bus

    init(address: String) throws {
        loop = try EventLoop()
        bus = try Bus.connect(address: address, loop: loop, description: "test-probe")
    }

    /// Calls a method and waits for its reply or error.
    func call(_ destination: String, _ path: String, _ interface: String, _ member: String,
              _ build: @escaping @Sendable (Message) throws(BusError) -> Void = { _ in }) -> Result<Message, BusError> {
        var result: Result<Message, BusError>?
        do throws(BusError) {
            let m = try bus.newMethodCall(destination: destination, path: path, interface: interface, member: member)
            try build(m)
            // Dropped once the reply is in, so the slot's closure lets go of the reply too.
            let slot = try bus.callAsync(m, timeout: 10_000_000) { result = $0 }
            try loop.run { result != nil }
            withExtendedLifetime(slot) {}
        } catch {
            result = .failure(error)
        }
        return result!
    }

    /// The unique name of the connection that process `pid` holds on this bus.
    func uniqueName(ofProcess pid: pid_t) throws -> String {
        let driver = ("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus")
        let reply = try call(driver.0, driver.1, driver.2, "ListNames").get()
        var names: [String] = []
        _ = try reply.enterContainer("a", "s")
        while try reply.peekType() != nil { names.append(try reply.readString()) }
        try reply.exitContainer()
        for name in names where name.hasPrefix(":") {
            let owner = call(driver.0, driver.1, driver.2, "GetConnectionUnixProcessID") { m throws(BusError) in try m.append(name) }
            if case .success(let m) = owner, (try? m.readUInt32()) == UInt32(pid) { return name }
        }
        throw HarnessError("process \(pid) has no connection on this bus")
    }

    /// Calls `Provide` on `peer`'s provider as a stranger would, with a pipe of its own:
    /// the call's result, and every byte the provider wrote into the pipe.
    func provideAsStranger(_ peer: String, path: String, session: String, item: UInt32, type: String) throws -> (Result<Message, BusError>, Data) {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw HarnessError("pipe: \(errno)") }
        let (readEnd, writeEnd) = (fds[0], fds[1])
        let result = call(peer, path, "org.dragbroker.Provider1", "Provide") { m throws(BusError) in
            try m.append(objectPath: session)
            try m.append(item)
            try m.append(type)
            try m.append(UInt32(1))
            try m.append(fileDescriptor: writeEnd)
        }
        close(writeEnd)
        let bytes = FileHandle(fileDescriptor: readEnd, closeOnDealloc: true).readDataToEndOfFile()
        return (result, bytes)
    }

    func introspect(_ destination: String, _ path: String) throws -> String {
        let reply = try call(destination, path, "org.freedesktop.DBus.Introspectable", "Introspect").get()
        return try reply.readString()
    }
}

extension BusProbe {
    /// `BeginSession`, or with `member` `Copy`, which takes the same arguments.
    func begin(items: Int = 1, kind: String = "data", member: ManagerMember = .beginSession,
               options: [(String, String, @Sendable (Message) throws(BusError) -> Void)] = []) -> Result<Message, BusError> {
        call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, member.name) { m throws(BusError) in
            try m.openContainer("a", ItemDescriptor.signature)
            for _ in 0..<items {
                try m.openContainer("r", "sdda(sss)")
                try m.append("x")
                try m.append(0.0)
                try m.append(0.0)
                try m.openContainer("a", "(sss)")
                try m.openContainer("r", "sss")
                try m.append("text/plain")
                try m.append("all")
                try m.append(kind)
                try m.closeContainer()
                try m.closeContainer()
                try m.closeContainer()
            }
            try m.closeContainer()
            try m.openContainer("a", "{sv}")
            for (key, type, append) in options {
                try m.openContainer("e", "sv")
                try m.append(key)
                try m.openContainer("v", type)
                try append(m)
                try m.closeContainer()
                try m.closeContainer()
            }
            try m.closeContainer()
            try m.append(objectPath: "/org/dragbroker/Provider1/p1")
        }
    }
}

extension Result where Failure == BusError {
    /// The error, or nil on success.
    var failure: BusError? {
        if case .failure(let error) = self { return error }
        return nil
    }

    /// The error name, or "OK" — what tests compare.
    var errorName: String {
        switch self {
        case .success: "OK"
        case .failure(let error): error.name
        }
    }
}

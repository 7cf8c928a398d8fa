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

    func introspect(_ destination: String, _ path: String) throws -> String {
        let reply = try call(destination, path, "org.freedesktop.DBus.Introspectable", "Introspect").get()
        return try reply.readString()
    }
}

extension Result where Failure == BusError {
    /// The error name, or "OK" — what tests compare.
    var errorName: String {
        switch self {
        case .success: "OK"
        case .failure(let error): error.name
        }
    }
}

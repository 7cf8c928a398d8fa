import BusKit
import Foundation

/// A raw bus client for tests that speak the wire protocol directly, as a non-Swift client would.
final class BusProbe: @unchecked Sendable {
    let loop: EventLoop
    let bus: Bus

    init(address: String) throws {
        loop = try EventLoop()
        bus = try Bus.connect(address: address, loop: loop, description: "test-probe")
        loop.start(name: "test-probe")
    }

    deinit { loop.stop() }

    /// Calls a method and waits for its reply or error.
    func call(_ destination: String, _ path: String, _ interface: String, _ member: String,
              _ build: @escaping @Sendable (Message) throws(BusError) -> Void = { _ in }) -> Result<Message, BusError> {
        let done = DispatchSemaphore(value: 0)
        let box = ResultBox()
        loop.execute { [bus] in
            do throws(BusError) {
                let m = try bus.newMethodCall(destination: destination, path: path, interface: interface, member: member)
                try build(m)
                box.slot = try bus.callAsync(m, timeout: 10_000_000) { result in
                    box.result = result
                    done.signal()
                }
            } catch {
                box.result = .failure(error)
                done.signal()
            }
        }
        done.wait()
        let result = box.result!
        // The slot's reply closure holds the box: let go of both on the loop, where sd-bus lives,
        // so the reply (and any descriptor it carries) is freed once the caller is done with it.
        box.result = nil
        loop.execute { box.slot = nil }
        return result
    }

    func introspect(_ destination: String, _ path: String) throws -> String {
        let reply = try call(destination, path, "org.freedesktop.DBus.Introspectable", "Introspect").get()
        return try reply.readString()
    }
}

private final class ResultBox: @unchecked Sendable {
    var result: Result<Message, BusError>?
    var slot: Slot?
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

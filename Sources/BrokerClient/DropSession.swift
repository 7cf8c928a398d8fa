import BrokerProtocol
import BusKit
import Foundation

/// What a destination hears about a session it joined.
public enum DropSessionEvent: Sendable, Equatable {
    /// The session ended; `error` says why when it was cut short (source gone, cancelled).
    case ended(DropOperation, BrokerError?)
}

/// The destination's side of a drag it was handed. Before the drop it can only see the
/// items' visible types; after `performDrop` it alone may load.
public final class DropSession: Sendable {
    public let path: String
    public let events: AsyncStream<DropSessionEvent>
    private let continuation: AsyncStream<DropSessionEvent>.Continuation
    private let connection: BrokerConnection
    private let loads = Locked(LoadResults())

    init(connection: BrokerConnection, path: String) {
        self.connection = connection
        self.path = path
        (events, continuation) = AsyncStream.makeStream()
    }

    private func call(_ member: String, _ build: @Sendable (Message) throws(BusError) -> Void = { _ in }) async throws(BrokerError) -> Message {
        try await connection.call(path: path, interface: BrokerNames.sessionInterface, member: member, build)
    }

    /// The items, with only the types this app may see: enough for "can handle" decisions.
    public func items() async throws(BrokerError) -> [VisibleItem] {
        let reply = try await call("GetItems")
        return try await connection.decode { () throws(BusError) in
            var items: [VisibleItem] = []
            _ = try reply.enterContainer("a", VisibleItem.signature)
            while let item = try VisibleItem.decode(from: reply) { items.append(item) }
            try reply.exitContainer()
            return items
        }
    }

    /// The indices of items with a representation visible to this app that conforms to
    /// `type`: a MIME type (`text/plain` covers `text/x-python`), a wildcard (`image/*`) or a
    /// UTI (`public.image`). Answered before the drop, from the system's MIME database.
    public func items(conformingTo type: String) async throws(BrokerError) -> [Int] {
        let reply = try await call("ConformingItems") { m throws(BusError) in try m.append(type) }
        return try await connection.decode { () throws(BusError) in
            var indices: [Int] = []
            _ = try reply.enterContainer("a", "u")
            while try reply.peekType() != nil { indices.append(Int(try reply.readUInt32())) }
            try reply.exitContainer()
            return indices
        }
    }

    /// `hasItemsConforming(toTypeIdentifiers:)`: can this drop be handled at all?
    public func hasItems(conformingTo type: String) async throws(BrokerError) -> Bool {
        try await !items(conformingTo: type).isEmpty
    }

    /// The drag entered this destination with a proposal; returns what the broker allows.
    public func enter(proposing proposal: DropOperation) async throws(BrokerError) -> DropOperation {
        try await propose("Enter", proposal)
    }

    /// The drag moved; returns what the broker allows for the new proposal.
    public func update(proposing proposal: DropOperation) async throws(BrokerError) -> DropOperation {
        try await propose("Update", proposal)
    }

    public func exit() async throws(BrokerError) {
        _ = try await call("Exit")
    }

    /// Performs the drop with the current proposal; from now on this destination alone may load.
    public func performDrop() async throws(BrokerError) -> DropOperation {
        let reply = try await call("PerformDrop")
        return try await operation(from: reply)
    }

    /// Loads one representation's bytes; the source's load handler runs only now.
    public func loadData(item: Int, typeIdentifier: String) async throws(BrokerError) -> Data {
        guard let index = UInt32(exactly: item) else { throw .invalidArgument("Item index \(item) is out of range") }
        let reply = try await call("Load") { m throws(BusError) in
            try m.append(index)
            try m.append(typeIdentifier)
        }
        let (fd, id) = try await connection.decode { () throws(BusError) in (try reply.readFileDescriptor(), try reply.readUInt32()) }
        let data: Data
        do {
            data = try await DescriptorIO.readToEnd(consuming: fd)
        } catch {
            throw BrokerError(.failed, "Failed to read the load's pipe: \(error)")
        }
        let outcome = await withCheckedContinuation { continuation in
            loads.withLock { $0.await(id, continuation) }
        }
        if let error = outcome.error { throw error }
        guard outcome.bytes == UInt64(data.count) else {
            throw BrokerError(.failed, "The broker reported \(outcome.bytes) bytes but \(data.count) arrived")
        }
        return data
    }

    /// Ends the session after the drop: the source learns the operation, and when the
    /// transfers finish.
    public func conclude() async throws(BrokerError) {
        _ = try await call("Conclude")
    }

    private func propose(_ member: String, _ proposal: DropOperation) async throws(BrokerError) -> DropOperation {
        let reply = try await call(member) { m throws(BusError) in try m.append(proposal.rawValue) }
        return try await operation(from: reply)
    }

    private func operation(from reply: Message) async throws(BrokerError) -> DropOperation {
        let name = try await connection.decode { () throws(BusError) in try reply.readString() }
        guard let operation = DropOperation(rawValue: name) else {
            throw BrokerError(.failed, "The broker answered an unknown operation '\(name)'")
        }
        return operation
    }

    func handle(signal: String, _ m: Message) {
        switch signal {
        case "LoadFinished":
            guard let id = try? m.readUInt32(), let bytes = try? m.readUInt64(),
                  let name = try? m.readString(), let message = try? m.readString() else { return }
            let outcome = LoadOutcome(bytes: bytes, error: name.isEmpty ? nil : BrokerError(BusError(name: name, message: message)))
            loads.withLock { $0.deliver(id, outcome) }
        case "Ended":
            guard let (operation, error) = decodeEnded(m) else { return }
            continuation.yield(.ended(operation, error))
            continuation.finish()
        default:
            break
        }
    }
}

struct LoadOutcome: Sendable {
    var bytes: UInt64
    var error: BrokerError?
}

/// Matches `LoadFinished` signals to waiting loads, whichever comes first.
struct LoadResults: Sendable {
    private var finished: [UInt32: LoadOutcome] = [:]
    private var waiting: [UInt32: CheckedContinuation<LoadOutcome, Never>] = [:]

    mutating func await(_ id: UInt32, _ continuation: CheckedContinuation<LoadOutcome, Never>) {
        if let outcome = finished.removeValue(forKey: id) {
            continuation.resume(returning: outcome)
        } else {
            waiting[id] = continuation
        }
    }

    mutating func deliver(_ id: UInt32, _ outcome: LoadOutcome) {
        if let continuation = waiting.removeValue(forKey: id) {
            continuation.resume(returning: outcome)
        } else {
            finished[id] = outcome
        }
    }
}

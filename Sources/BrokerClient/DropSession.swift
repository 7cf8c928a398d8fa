import BrokerProtocol
import BusKit
import Foundation
import Glibc
import SystemPackage

/// What a destination hears about a session it joined.
public enum DropSessionEvent: Sendable, Equatable {
    /// Bytes of a load received so far for an item (as this app numbers items), and the
    /// total if the source announced it: enough for a placeholder's progress bar.
    case loadProgress(item: Int, load: UInt32, bytes: UInt64, expected: UInt64?)
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

    /// Loads one representation's bytes into memory; the source's load handler runs only
    /// now. `progress` hears (bytes so far, expected total if known). Cancelling the task
    /// cancels the load, and the source hears of it.
    public func loadData(item: Int, typeIdentifier: String,
                         progress: (@Sendable (UInt64, UInt64?) -> Void)? = nil) async throws(BrokerError) -> Data {
        let collected = Locked(Data())
        _ = try await load(item: item, typeIdentifier: typeIdentifier, progress: progress) { fd, kind in
            if kind == .file {
                defer { close(fd) }
                let data = try await DescriptorIO.readToEnd(consuming: dup(fd))
                collected.withLock { $0 = data }
                return UInt64(data.count)
            }
            let data = try await DescriptorIO.readToEnd(consuming: fd)
            collected.withLock { $0 = data }
            return UInt64(data.count)
        }
        return collected.withLock { $0 }
    }

    /// Loads a representation as a stream of chunks, for data too large to hold at once.
    public func loadStream(item: Int, typeIdentifier: String) -> AsyncThrowingStream<Data, Error> {
        AsyncThrowingStream { continuation in
            let task = Task {
                do {
                    _ = try await load(item: item, typeIdentifier: typeIdentifier, progress: nil) { fd, _ in
                        try await DescriptorIO.readChunks(consuming: fd) { continuation.yield($0) }
                    }
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// Loads a representation into `output` (a file, a pipe, a socket); returns the byte count.
    public func load(item: Int, typeIdentifier: String, into output: FileDescriptor,
                     progress: (@Sendable (UInt64, UInt64?) -> Void)? = nil) async throws(BrokerError) -> UInt64 {
        try await load(item: item, typeIdentifier: typeIdentifier, progress: progress) { fd, _ in
            try await DescriptorIO.copy(consuming: fd, to: output.rawValue)
        }
    }

    /// Loads a file representation as the descriptor the source handed over (read-only, or a
    /// sealed memfd): no byte is copied. The caller owns and closes it.
    public func loadFile(item: Int, typeIdentifier: String) async throws(BrokerError) -> FileDescriptor {
        let file = Locked<Int32>(-1)
        _ = try await load(item: item, typeIdentifier: typeIdentifier, progress: nil) { fd, kind in
            guard kind == .file else {
                close(fd)
                throw BrokerError(.wrongState, "'\(typeIdentifier)' is a data representation: use loadData or loadStream")
            }
            var info = stat()
            fstat(fd, &info)
            file.withLock { $0 = fd }
            return UInt64(info.st_size)
        }
        return FileDescriptor(rawValue: file.withLock { $0 })
    }

    /// The common path: ask for the load, consume its descriptor, then check the broker's
    /// verdict (`LoadFinished`) against what arrived.
    private func load(item: Int, typeIdentifier: String, progress: (@Sendable (UInt64, UInt64?) -> Void)?,
                      consume: @escaping @Sendable (Int32, RepresentationKind) async throws -> UInt64) async throws(BrokerError) -> UInt64 {
        guard let index = UInt32(exactly: item) else { throw .invalidArgument("Item index \(item) is out of range") }
        try Self.checkCancellation()
        let reply = try await call("Load") { m throws(BusError) in
            try m.append(index)
            try m.append(typeIdentifier)
        }
        let (fd, id, kindName) = try await connection.decode { () throws(BusError) in
            (try reply.readFileDescriptor(), try reply.readUInt32(), try reply.readString())
        }
        let kind = RepresentationKind(rawValue: kindName) ?? .data
        loads.withLock { $0.watch(id, item: item, progress: progress) }
        let received: UInt64
        do {
            received = try await withTaskCancellationHandler {
                try await consume(fd, kind)
            } onCancel: {
                Task { [connection, path] in
                    _ = try? await connection.call(path: path, interface: BrokerNames.sessionInterface, member: "CancelLoad") { m throws(BusError) in
                        try m.append(id)
                    }
                }
            }
        } catch let error as BrokerError {
            throw error
        } catch {
            // The verdict explains a broken pipe better than the pipe does.
            let outcome = await outcome(of: id)
            throw outcome.error ?? BrokerError(.failed, "Failed to read the load: \(error)")
        }
        let outcome = await outcome(of: id)
        if let error = outcome.error { throw error }
        guard outcome.bytes == received else {
            throw BrokerError(.failed, "The broker reported \(outcome.bytes) bytes but \(received) arrived")
        }
        // Progress always ends at 100 %, however fast the load was.
        progress?(received, received)
        return received
    }

    private func outcome(of id: UInt32) async -> LoadOutcome {
        await withCheckedContinuation { continuation in
            loads.withLock { $0.await(id, continuation) }
        }
    }

    private static func checkCancellation() throws(BrokerError) {
        if Task.isCancelled { throw BrokerError(.cancelled, "The load was cancelled before it started") }
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
        case "LoadProgress":
            guard let id = try? m.readUInt32(), let bytes = try? m.readUInt64(), let expected = try? m.readUInt64() else { return }
            let watcher = loads.withLock { $0.watcher(id) }
            watcher?.progress?(bytes, expected == 0 ? nil : expected)
            if let item = watcher?.item {
                continuation.yield(.loadProgress(item: item, load: id, bytes: bytes, expected: expected == 0 ? nil : expected))
            }
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

/// Matches `LoadFinished` signals to waiting loads, whichever comes first, and routes progress.
struct LoadResults: Sendable {
    struct Watcher: Sendable {
        var item: Int
        var progress: (@Sendable (UInt64, UInt64?) -> Void)?
    }

    private var finished: [UInt32: LoadOutcome] = [:]
    private var waiting: [UInt32: CheckedContinuation<LoadOutcome, Never>] = [:]
    private var watchers: [UInt32: Watcher] = [:]

    mutating func watch(_ id: UInt32, item: Int, progress: (@Sendable (UInt64, UInt64?) -> Void)?) {
        watchers[id] = Watcher(item: item, progress: progress)
    }

    func watcher(_ id: UInt32) -> Watcher? { watchers[id] }

    mutating func await(_ id: UInt32, _ continuation: CheckedContinuation<LoadOutcome, Never>) {
        if let outcome = finished.removeValue(forKey: id) {
            continuation.resume(returning: outcome)
        } else {
            waiting[id] = continuation
        }
    }

    mutating func deliver(_ id: UInt32, _ outcome: LoadOutcome) {
        watchers[id] = nil
        if let continuation = waiting.removeValue(forKey: id) {
            continuation.resume(returning: outcome)
        } else {
            finished[id] = outcome
        }
    }
}

import BrokerProtocol
import BusKit
import Foundation
import SystemCalls

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
///
/// Replies are decoded on the connection's event loop, where they arrive; this class only
/// ever holds the decoded values.
public final class DropSession: Sendable {
    public let path: String
    /// The session's events; a reader that comes late finds the newest `unreadEventLimit`,
    /// the end among them (progress is superseded by later progress anyway).
    public let events: AsyncStream<DropSessionEvent>
    private let continuation: AsyncStream<DropSessionEvent>.Continuation
    private let connection: BrokerConnection
    private let loads = Locked(LoadLedger<CheckedContinuation<LoadOutcome, Never>>())

    init(connection: BrokerConnection, path: String) {
        self.connection = connection
        self.path = path
        (events, continuation) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(unreadEventLimit))
    }

    /// Calls a session method; `decode` reads the reply on the event loop.
    ///
    /// The session's calls are `nonisolated(nonsending)`: they run in the caller's isolation. A
    /// plain nonisolated async function would first switch to the generic executor and back
    /// again on return, each switch a lookup of the task's executor preference under its
    /// status lock, six per `update` from a task on the loop; from the main actor, a trip
    /// through the concurrency pool on the way to the loop and another on the way back.
    nonisolated(nonsending) private func call<T: Sendable>(_ member: SessionMember, _ build: @Sendable (Message) throws(BusError) -> Void = { _ in },
                                                           decode: @escaping @Sendable (Message) throws(BusError) -> T) async throws(BrokerError) -> T {
        try await connection.sessionCall(path: path, member, build: build, decode: decode)
    }

    /// Pastes a pasteboard entry (one whose token came from the clipboard): the user's explicit
    /// act, as `performDrop` is for a drag. The returned session is this paste's own: load from
    /// it, then `conclude`. Each call is another paste, with its own record.
    public func paste() async throws(BrokerError) -> DropSession {
        let path = try await call(.paste, decode: { reply throws(BusError) in try reply.readObjectPath() })
        return try await connection.join(at: path)
    }

    /// The items, with only the types this app may see: enough for "can handle" decisions.
    nonisolated(nonsending) public func items() async throws(BrokerError) -> [VisibleItem] {
        try await call(.getItems, decode: { reply throws(BusError) in
            var items: [VisibleItem] = []
            _ = try reply.enterContainer("a", VisibleItem.signature)
            while let item = try VisibleItem.decode(from: reply) { items.append(item) }
            try reply.exitContainer()
            return items
        })
    }

    /// The indices of items with a representation visible to this app that conforms to
    /// `type`: a MIME type (`text/plain` covers `text/x-python`), a wildcard (`image/*`) or a
    /// UTI (`public.image`). Answered before the drop, from the system's MIME database.
    nonisolated(nonsending) public func items(conformingTo type: String) async throws(BrokerError) -> [Int] {
        try await call(.conformingItems, { m throws(BusError) in try m.append(type) }, decode: { reply throws(BusError) in
            var indices: [Int] = []
            _ = try reply.enterContainer("a", "u")
            while try reply.peekType() != nil { indices.append(Int(try reply.readUInt32())) }
            try reply.exitContainer()
            return indices
        })
    }

    /// `hasItemsConforming(toTypeIdentifiers:)`: can this drop be handled at all?
    nonisolated(nonsending) public func hasItems(conformingTo type: String) async throws(BrokerError) -> Bool {
        try await !items(conformingTo: type).isEmpty
    }

    /// The drag entered this destination with a proposal; returns what the broker allows.
    nonisolated(nonsending) public func enter(proposing proposal: DropOperation) async throws(BrokerError) -> DropOperation {
        try await propose(.enter, proposal)
    }

    /// The drag moved; returns what the broker allows for the new proposal.
    nonisolated(nonsending) public func update(proposing proposal: DropOperation) async throws(BrokerError) -> DropOperation {
        try await propose(.update, proposal)
    }

    nonisolated(nonsending) public func exit() async throws(BrokerError) {
        try await call(.exit, decode: { _ throws(BusError) in })
    }

    /// Performs the drop with the current proposal; from now on this destination alone may load.
    nonisolated(nonsending) public func performDrop() async throws(BrokerError) -> DropOperation {
        try await operation(from: call(.performDrop, decode: { reply throws(BusError) in try reply.readString() }))
    }

    /// Loads one representation's bytes into memory; the source's load handler runs only
    /// now. `progress` hears (bytes so far, expected total if known). Cancelling the task
    /// cancels the load, and the source hears of it.
    public func loadData(item: Int, typeIdentifier: String,
                         progress: (@Sendable (UInt64, UInt64?) -> Void)? = nil) async throws(BrokerError) -> Data {
        let collected = Locked(Data())
        _ = try await load(item: item, typeIdentifier: typeIdentifier, progress: progress) { [loop = connection.loop] fd, kind in
            // A file arrives as its own read-only descriptor: read it like a pipe, off the loop.
            let data = try await DescriptorIO.readToEnd(consuming: fd, pipeOn: kind == .data ? loop : nil)
            collected.withLock { $0 = data }
            return UInt64(data.count)
        }
        return collected.withLock { $0 }
    }

    /// Loads a representation as a stream of chunks, for data too large to hold at once. The
    /// load starts at the first `next()`, and the stream reads only as fast as it is read:
    /// see `LoadStream`.
    public func loadStream(item: Int, typeIdentifier: String) -> LoadStream {
        LoadStream(session: self, item: item, typeIdentifier: typeIdentifier)
    }

    /// Loads a representation into `output` (a file, a pipe, a socket); returns the byte count.
    public func load(item: Int, typeIdentifier: String, into output: FileDescriptor,
                     progress: (@Sendable (UInt64, UInt64?) -> Void)? = nil) async throws(BrokerError) -> UInt64 {
        try await load(item: item, typeIdentifier: typeIdentifier, progress: progress) { fd, _ in
            try await DescriptorIO.copy(consuming: fd, to: output)
        }
    }

    /// Loads a file representation as the descriptor the source handed over (read-only, or a
    /// sealed memfd): no byte is copied. The caller owns and closes it.
    public func loadFile(item: Int, typeIdentifier: String) async throws(BrokerError) -> FileDescriptor {
        let file = Locked<FileDescriptor?>(nil)
        _ = try await load(item: item, typeIdentifier: typeIdentifier, progress: nil) { fd, kind in
            guard kind == .file else {
                fd.closeQuietly()
                throw BrokerError(.wrongState, "'\(typeIdentifier)' is a data representation: use loadData or loadStream")
            }
            let size: UInt64
            do {
                size = try fd.status().size
            } catch {
                fd.closeQuietly()
                throw error
            }
            file.withLock { $0 = fd }
            return size
        }
        return file.withLock { $0! }
    }

    /// The common path: ask for the load, consume its descriptor, then check the broker's
    /// verdict (`LoadFinished`) against what arrived.
    private func load(item: Int, typeIdentifier: String, progress: LoadLedger<CheckedContinuation<LoadOutcome, Never>>.Progress?,
                      consume: @escaping @Sendable (FileDescriptor, RepresentationKind) async throws -> UInt64) async throws(BrokerError) -> UInt64 {
        let (fd, id, kind) = try await beginLoad(item: item, typeIdentifier: typeIdentifier, progress: progress)
        let received: UInt64
        do {
            received = try await withTaskCancellationHandler {
                try await consume(fd, kind)
            } onCancel: {
                cancelLoadSoon(id)
            }
        } catch let error as BrokerError {
            abandonLoad(id)
            throw error
        } catch {
            throw await failedRead(id, error)
        }
        try await finishLoad(id, kind: kind, received: received)
        progress?(received, received)
        return received
    }

    /// Asks the broker for a load: its descriptor, its ID (claimed in the ledger, so its
    /// signals find it) and its kind.
    nonisolated(nonsending) func beginLoad(item: Int, typeIdentifier: String, progress: LoadLedger<CheckedContinuation<LoadOutcome, Never>>.Progress? = nil)
        async throws(BrokerError) -> (FileDescriptor, UInt32, RepresentationKind) {
        guard let index = UInt32(exactly: item) else { throw .invalidArgument("Item index \(item) is out of range") }
        try Self.checkCancellation()
        let (fd, id, kindName) = try await call(.load, { m throws(BusError) in
            try m.append(index)
            try m.append(typeIdentifier)
        }, decode: { [self] reply throws(BusError) in
            let fd = FileDescriptor(rawValue: try reply.readFileDescriptor())
            let id: UInt32, kindName: String
            do throws(BusError) {
                id = try reply.readUInt32()
                kindName = try reply.readString()
            } catch {
                fd.closeQuietly()
                throw error
            }
            // Claimed here, on the loop, in bus order with the load's own signals.
            if let early = loads.withLock({ $0.claim(id, item: item, progress: progress) }) { report(early) }
            return (fd, id, kindName)
        })
        return (fd, id, RepresentationKind(rawValue: kindName) ?? .data)
    }

    /// All of a load's bytes are in (`received`): checks them against the broker's verdict.
    /// A file's reply is its verdict: the broker answers with the descriptor only once the
    /// load is on record and the file judged, and nothing after that can fail it. Waiting for
    /// `LoadFinished` as well would cost the caller one more wake-up.
    nonisolated(nonsending) func finishLoad(_ id: UInt32, kind: RepresentationKind, received: UInt64) async throws(BrokerError) {
        if kind == .file {
            abandonLoad(id)
            return
        }
        let outcome = await outcome(of: id)
        if let error = outcome.error { throw error }
        guard outcome.bytes == received else {
            throw BrokerError(.failed, "The broker reported \(outcome.bytes) bytes but \(received) arrived")
        }
    }

    /// Reading a load's descriptor failed: the verdict explains a broken pipe better than the
    /// pipe does.
    nonisolated(nonsending) func failedRead(_ id: UInt32, _ error: any Error) async -> BrokerError {
        await outcome(of: id).error ?? BrokerError(.failed, "Failed to read the load: \(error)")
    }

    /// The load's verdict will not be waited for: the ledger forgets it.
    func abandonLoad(_ id: UInt32) {
        loads.withLock { $0.abandon(id) }
    }

    /// Asks the broker to cancel a load, without waiting: the load then ends with `Cancelled`.
    func cancelLoadSoon(_ id: UInt32) {
        Task { [connection, path] in
            try? await connection.sessionCall(path: path, SessionMember.cancelLoad, build: { m throws(BusError) in try m.append(id) })
        }
    }

    /// The connection's event loop, where a data load's pipe is waited for.
    var loop: EventLoop { connection.loop }

    nonisolated(nonsending) private func outcome(of id: UInt32) async -> LoadOutcome {
        await withCheckedContinuation { continuation in
            if let outcome = loads.withLock({ $0.collect(id, waiter: continuation) }) {
                continuation.resume(returning: outcome)
            }
        }
    }

    private func report(_ report: LoadLedger<CheckedContinuation<LoadOutcome, Never>>.Report) {
        report.progress?(report.bytes, report.expected)
        continuation.yield(.loadProgress(item: report.item, load: report.load, bytes: report.bytes, expected: report.expected))
    }

    private static func checkCancellation() throws(BrokerError) {
        if Task.isCancelled { throw BrokerError(.cancelled, "The load was cancelled before it started") }
    }

    /// Ends the session after the drop: the source learns the operation, and when the
    /// transfers finish.
    nonisolated(nonsending) public func conclude() async throws(BrokerError) {
        try await call(.conclude, decode: { _ throws(BusError) in })
    }

    nonisolated(nonsending) private func propose(_ member: SessionMember, _ proposal: DropOperation) async throws(BrokerError) -> DropOperation {
        try await operation(from: call(member, { m throws(BusError) in try m.append(proposal.rawValue) },
                                       decode: { reply throws(BusError) in try reply.readString() }))
    }

    private func operation(from name: String) throws(BrokerError) -> DropOperation {
        guard let operation = DropOperation(rawValue: name) else {
            throw BrokerError(.failed, "The broker answered an unknown operation '\(name)'")
        }
        return operation
    }

    /// A signal for this session, on the event loop. Returns whether the session still needs
    /// its signals.
    /// The broker's name lost its owner: the session ends with `error`, and so does every load
    /// still waiting for its verdict.
    func brokerVanished(_ error: BrokerError) {
        _ = handle(.ended(.cancel, error))
        for waiter in loads.withLock({ $0.brokerVanished(LoadOutcome(bytes: 0, error: error)) }) {
            waiter.resume(returning: LoadOutcome(bytes: 0, error: error))
        }
    }

    func handle(_ signal: SessionSignal) -> Bool {
        switch signal {
        case .loadProgress(let id, let bytes, let expected):
            if let progress = loads.withLock({ $0.progressed(id, bytes: bytes, expected: expected) }) { report(progress) }
        case .loadFinished(let id, let outcome):
            loads.withLock { $0.finished(id, outcome) }?.resume(returning: outcome)
        case .ended(let operation, let error):
            continuation.yield(.ended(operation, error))
            continuation.finish()
            loads.withLock { $0.sessionEnded() }
        case .willEnd, .transferFinished, .pasted:
            break
        }
        return loads.withLock { $0.needsSignals }
    }
}

extension DropSession {
    /// `canLoadObjects(ofClass:)`: whether some item has a representation this app may see
    /// that conforms to one of `type`'s readable identifiers, by the broker's conformance
    /// rules. Answered before the drop.
    public func canLoadObjects<T: ItemProviderReading>(ofType type: T.Type) async throws(BrokerError) -> Bool {
        for identifier in T.readableTypeIdentifiers where try await hasItems(conformingTo: identifier) {
            return true
        }
        return false
    }

    /// `loadObjects(ofClass:)`: after the drop, one value per item that `type` can read, in
    /// item order. An item with no visible representation `type` reads is skipped, so the
    /// result may be shorter than `items()` and its indices are not item numbers. Each item's
    /// best readable representation is loaded, one item after another; if a load fails, or
    /// its bytes do not make a value, the call throws, and the temporary files made for the
    /// values before it are removed.
    public func loadObjects<T: ItemProviderReading>(ofType type: T.Type) async throws(BrokerError) -> [T] {
        let visible = try await items()
        let chosen = ObjectSelection.representations(readable: T.readableTypeIdentifiers, items: visible)
        var objects: [T] = []
        var files: [URL] = []
        do {
            for (index, item) in visible.enumerated() {
                guard let typeIdentifier = chosen[index] else { continue }
                objects.append(try await loadObject(T.self, item: index, typeIdentifier: typeIdentifier,
                                                    suggestedName: item.suggestedName, files: &files))
            }
        } catch {
            // The caller never gets those values, so nothing else would ever remove their files.
            files.forEach(TemporaryItemFile.remove)
            throw error
        }
        return objects
    }

    /// Loads one item as `type`. A temporary file it makes is added to `files` at once, so a
    /// failure at any later step leaves it for `loadObjects` to remove.
    private func loadObject<T: ItemProviderReading>(_ type: T.Type, item: Int, typeIdentifier: String, suggestedName: String,
                                                   files: inout [URL]) async throws(BrokerError) -> T {
        func make(_ body: () throws -> T) throws(BrokerError) -> T {
            do {
                return try body()
            } catch let error as BrokerError {
                throw error
            } catch {
                throw BrokerError(.failed, "Item \(item)'s '\(typeIdentifier)' does not make a \(T.self): \(error)")
            }
        }
        switch T.readingDelivery {
        case .data:
            let data = try await loadData(item: item, typeIdentifier: typeIdentifier)
            return try make { try T.object(withItemProviderData: data, typeIdentifier: typeIdentifier) }
        case .temporaryFile:
            let url: URL, file: FileDescriptor
            do {
                url = try TemporaryItemFile.makeURL(suggestedName: suggestedName)
            } catch {
                throw BrokerError(.failed, "Failed to create a temporary directory for item \(item): \(error)")
            }
            files.append(url)
            do {
                file = try FileDescriptor.open(url.path, .writeOnly, options: [.create, .exclusiveCreate, .closeOnExec],
                                               permissions: [.ownerReadWrite])
            } catch {
                throw BrokerError(.failed, "Failed to create the temporary file \(url.path) for item \(item): \(error)")
            }
            do {
                defer { file.closeQuietly() }
                _ = try await load(item: item, typeIdentifier: typeIdentifier, into: file)
            }
            return try make { try T.object(withTemporaryFile: url, typeIdentifier: typeIdentifier) }
        }
    }
}

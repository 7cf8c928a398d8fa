import BrokerProtocol
import BusKit

/// What the source hears about its drag, in order.
public enum DragSessionEvent: Sendable, Equatable {
    /// The destination asked for a representation; its load handler is running.
    case loadRequested(load: UInt32, item: Int, typeIdentifier: String)
    /// Bytes of a load that reached the broker so far, and the total if it is known.
    case loadProgress(load: UInt32, bytes: UInt64, expected: UInt64?)
    /// A load ended; `error` says why when it did not complete (e.g. the destination cancelled).
    case loadFinished(load: UInt32, bytes: UInt64, error: BrokerError?)
    /// The user dropped: the session will end with this operation (`sessionWillEnd`).
    case willEnd(DropOperation)
    /// The session ended (`sessionDidEnd`); `error` says why when it did not complete.
    case ended(DropOperation, BrokerError?)
    /// Every load is done (`sessionDidTransferItems`). After a move, delete the originals now.
    case transferFinished
}

/// The source's side of a live drag.
public final class DragSession: Sendable {
    public let path: String
    /// Hand this to the windowing system's drag; whoever presents it may join the session.
    public let token: String
    public var items: [DragItem] { lock.withLock { $0 } }
    private let lock: Locked<[DragItem]>
    private let export: ProviderExport
    /// The session's events; the stream finishes after the last one.
    public let events: AsyncStream<DragSessionEvent>
    private let continuation: AsyncStream<DragSessionEvent>.Continuation
    private let connection: BrokerConnection

    init(connection: BrokerConnection, path: String, token: String, items: [DragItem], export: ProviderExport) {
        self.connection = connection
        self.path = path
        self.token = token
        self.lock = Locked(items)
        self.export = export
        (events, continuation) = AsyncStream.makeStream()
    }

    /// Adds items to the live drag ("flocking"); only the app that began it may.
    public func addItems(_ newItems: [DragItem]) async throws(BrokerError) {
        try await connection.addItems(newItems, to: path, export: export)
        lock.withLock { $0 += newItems }
    }

    /// Cancels one load this source is producing; the destination hears `Cancelled`.
    public func cancelLoad(_ load: UInt32) async throws(BrokerError) {
        _ = try await connection.call(path: path, interface: BrokerNames.sessionInterface, member: "CancelLoad") { m throws(BusError) in
            try m.append(load)
        }
    }

    /// Cancels the drag (released over nothing). Loads in flight stop.
    public func cancel() async throws(BrokerError) {
        _ = try await connection.call(path: path, interface: BrokerNames.sessionInterface, member: "Cancel")
    }

    func noteLoadRequested(load: UInt32, item: Int, type: String) {
        continuation.yield(.loadRequested(load: load, item: item, typeIdentifier: type))
    }

    func handle(signal: String, _ m: Message) {
        switch signal {
        case "WillEnd":
            if let operation = try? m.readString(), let op = DropOperation(rawValue: operation) {
                continuation.yield(.willEnd(op))
            }
        case "Ended":
            guard let (operation, error) = decodeEnded(m) else { return }
            continuation.yield(.ended(operation, error))
            if error != nil { continuation.finish() }
        case "LoadProgress":
            guard let load = try? m.readUInt32(), let bytes = try? m.readUInt64(), let expected = try? m.readUInt64() else { return }
            continuation.yield(.loadProgress(load: load, bytes: bytes, expected: expected == 0 ? nil : expected))
        case "LoadFinished":
            guard let load = try? m.readUInt32(), let bytes = try? m.readUInt64(),
                  let name = try? m.readString(), let message = try? m.readString() else { return }
            continuation.yield(.loadFinished(load: load, bytes: bytes, error: name.isEmpty ? nil : BrokerError(BusError(name: name, message: message))))
        case "TransferFinished":
            continuation.yield(.transferFinished)
            continuation.finish()
        default:
            break
        }
    }
}

/// Decodes `Ended(operation, error, message)`; an empty error name means success.
func decodeEnded(_ m: Message) -> (DropOperation, BrokerError?)? {
    guard let operation = try? m.readString(), let op = DropOperation(rawValue: operation),
          let name = try? m.readString(), let message = try? m.readString() else { return nil }
    return (op, name.isEmpty ? nil : BrokerError(BusError(name: name, message: message)))
}

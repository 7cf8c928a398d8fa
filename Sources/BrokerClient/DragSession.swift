import BrokerProtocol
import BusKit

/// What the source hears about its drag, in order.
public enum DragSessionEvent: Sendable, Equatable {
    /// The destination asked for a representation; its load handler is running, or what was
    /// registered ready (bytes, a file) is on its way already. Before the load's `loadFinished`.
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
    /// The source heard `WillEnd`: a destination performed the drop.
    private let wasDropped = Locked(false)
    /// The session's events; the stream finishes after the last one. A reader that comes late
    /// finds the newest `unreadEventLimit`, the end among them.
    public let events: AsyncStream<DragSessionEvent>
    private let continuation: AsyncStream<DragSessionEvent>.Continuation
    private let connection: BrokerConnection

    init(connection: BrokerConnection, path: String, token: String, items: [DragItem]) {
        self.connection = connection
        self.path = path
        self.token = token
        self.lock = Locked(items)
        (events, continuation) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(unreadEventLimit))
    }

    /// Adds items to the live drag ("flocking"); only the app that began it may.
    public func addItems(_ newItems: [DragItem]) async throws(BrokerError) {
        try await connection.addItems(newItems, to: path)
        lock.withLock { $0 += newItems }
    }

    /// Cancels one load this source is producing; the destination hears `Cancelled`.
    nonisolated(nonsending) public func cancelLoad(_ load: UInt32) async throws(BrokerError) {
        try await connection.sessionCall(path: path, SessionMember.cancelLoad,
                                  build: { m throws(BusError) in try m.append(load) })
    }

    /// Cancels the drag (released over nothing). Loads in flight stop.
    nonisolated(nonsending) public func cancel() async throws(BrokerError) {
        try await connection.sessionCall(path: path, SessionMember.cancel)
    }

    /// The windowing system's drag ended: GTK's `drag-end` or `drag-failed`, GTK 4's
    /// `drag-cancel`, Qt's `QDrag::exec` returning, XDND's finish. Without a drop the session
    /// is cancelled at once, so its token and items die with the drag rather than at the broker's
    /// `DragTimeoutSec=`. With one, nothing changes: the destination's drop and loads go on.
    /// Call it from the toolkit's callback on any thread; it does not wait. A session whose
    /// drop this source has already heard of (`willEnd`) is left alone.
    public func dragEnded(dropped: Bool) {
        guard !dropped else { return }
        Task { [self] in
            // A drop heard by now wins; the broker's answer to a drop still on its way cannot.
            guard !wasDropped.withLock({ $0 }) else { return }
            // Refused only when the session is already over: nothing left to cancel.
            try? await connection.sessionCall(path: path, SessionMember.cancel)
        }
    }

    func noteLoadRequested(load: UInt32, item: Int, type: String) {
        continuation.yield(.loadRequested(load: load, item: item, typeIdentifier: type))
    }

    /// A signal for this session, on the event loop. Returns whether the session still needs
    /// its signals: after a successful `Ended` the source still hears `TransferFinished`.
    func handle(_ signal: SessionSignal) -> Bool {
        switch signal {
        case .willEnd(let operation):
            wasDropped.withLock { $0 = true }
            continuation.yield(.willEnd(operation))
        case .ended(let operation, let error):
            continuation.yield(.ended(operation, error))
            if error != nil {
                continuation.finish()
                return false
            }
        case .loadProgress(let load, let bytes, let expected):
            continuation.yield(.loadProgress(load: load, bytes: bytes, expected: expected))
        case .loadFinished(let load, let outcome):
            continuation.yield(.loadFinished(load: load, bytes: outcome.bytes, error: outcome.error))
        case .transferFinished:
            continuation.yield(.transferFinished)
            continuation.finish()
            return false
        case .pasted:
            break
        }
        return true
    }
}

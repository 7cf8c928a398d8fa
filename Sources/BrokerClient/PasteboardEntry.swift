import BrokerProtocol
import BusKit

/// What the source hears about its entry on the pasteboard, in order.
public enum PasteboardEntryEvent: Sendable, Equatable {
    /// An app pasted the entry: each paste is a session of its own (`paste`, its path).
    case pasted(paste: String, app: String)
    /// A paste asked for a representation; its load handler is running, or what was registered
    /// ready (bytes, a file) is on its way already. Before the load's `loadFinished`.
    case loadRequested(paste: String, load: UInt32, item: Int, typeIdentifier: String)
    /// A paste's load ended; `error` says why when it did not complete.
    case loadFinished(paste: String, load: UInt32, bytes: UInt64, error: BrokerError?)
    /// The entry left the pasteboard: withdrawn, expired (`Timeout`) or cut short. Pastes
    /// already made go on to their end.
    case ended(BrokerError?)
}

/// The source's side of an entry on the broker's pasteboard (`BrokerConnection.copy`). Put
/// `token` on the window system's clipboard under `BrokerNames.pasteboardTokenType`, and call
/// `ownershipLost()` when the toolkit says another app took the clipboard.
public final class PasteboardEntry: Sendable {
    public let path: String
    /// What the clipboard carries; whoever presents it may look at the items and paste them.
    public let token: String
    public let items: [DragItem]
    /// The entry's events; the stream finishes once the entry and every paste of it ended. A
    /// reader that comes late finds the newest `unreadEventLimit`, the end among them.
    public let events: AsyncStream<PasteboardEntryEvent>
    private let continuation: AsyncStream<PasteboardEntryEvent>.Continuation
    private let connection: BrokerConnection
    /// Pastes not yet ended, and whether the entry itself has.
    private let live = Locked((pastes: Set<String>(), ended: false))

    init(connection: BrokerConnection, path: String, token: String, items: [DragItem]) {
        self.connection = connection
        self.path = path
        self.token = token
        self.items = items
        (events, continuation) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(unreadEventLimit))
    }

    /// The types of the first item this app may also put on the window system's clipboard in
    /// the clear, for apps that do not speak the protocol, as the broker decides: only those
    /// any app may see and that flow rules let reach an unknown app. Offer nothing else in the
    /// clear; pastes of what is offered so are not recorded.
    nonisolated(nonsending) public func clearOffers() async throws(BrokerError) -> [String] {
        try await connection.sessionCall(path: path, SessionMember.clearOffers, decode: { reply throws(BusError) in try reply.readStrings() })
    }

    /// Takes the entry off the pasteboard now; pastes already made go on.
    nonisolated(nonsending) public func withdraw() async throws(BrokerError) {
        try await connection.sessionCall(path: path, SessionMember.cancel)
    }

    /// The toolkit says this app no longer owns the clipboard: GTK 4's `GdkClipboard::changed`
    /// with the clipboard no longer local, GTK 3's `owner-change`, Qt's `QClipboard::dataChanged`
    /// with other data, X11's `SelectionClear`, Wayland's `wl_data_source.cancelled`. The entry
    /// is withdrawn, as `dragEnded(dropped: false)` cancels a drag. Call it from any thread; it
    /// does not wait.
    public func ownershipLost() {
        Task { [self] in
            // Refused only when the entry is already gone: nothing left to withdraw.
            try? await connection.sessionCall(path: path, SessionMember.cancel)
        }
    }

    func notePasted(_ paste: String, by app: String) {
        live.withLock { _ = $0.pastes.insert(paste) }
        continuation.yield(.pasted(paste: paste, app: app))
    }

    func noteLoadRequested(paste: String, load: UInt32, item: Int, type: String) {
        continuation.yield(.loadRequested(paste: paste, load: load, item: item, typeIdentifier: type))
    }

    /// A signal for the entry itself. Returns whether it still needs its signals.
    func handle(_ signal: SessionSignal) -> Bool {
        guard case .ended(_, let error) = signal else { return true }
        continuation.yield(.ended(error))
        finishIfDone { $0.ended = true }
        return false
    }

    /// A signal for one of its pastes. Returns whether that paste still needs its signals.
    func handlePaste(_ paste: String, _ signal: SessionSignal) -> Bool {
        switch signal {
        case .loadFinished(let load, let outcome):
            continuation.yield(.loadFinished(paste: paste, load: load, bytes: outcome.bytes, error: outcome.error))
            return true
        case .ended(_, let error) where error != nil:
            finishIfDone { _ = $0.pastes.remove(paste) }
            return false
        case .transferFinished:
            finishIfDone { _ = $0.pastes.remove(paste) }
            return false
        case .ended, .willEnd, .loadProgress, .pasted:
            return true
        }
    }

    private func finishIfDone(_ change: (inout (pastes: Set<String>, ended: Bool)) -> Void) {
        let done = live.withLock { state in
            change(&state)
            return state.ended && state.pastes.isEmpty
        }
        if done { continuation.finish() }
    }
}

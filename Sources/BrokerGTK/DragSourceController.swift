import BrokerClient
import BrokerProtocol
import CGtk
import Dispatch
import Synchronization

/// Makes a widget a drag source, as `UIDragInteraction` does a view. When the pointer drags it,
/// the controller begins a broker session with the items `items` returns and offers the GTK
/// drag only the session's token. A drag that ends without a drop cancels the session at once.
/// The session's events (`willEnd`, loads, `ended`, `transferFinished`) reach `onEvent` on the
/// main thread.
@MainActor
public final class DragSourceController {
    public typealias ItemsProvider = @MainActor () -> [DragItem]

    public let connection: BrokerConnection
    public var options: SessionOptions
    /// The live session's events, in order.
    public var onEvent: ((DragSessionEvent) -> Void)?
    /// Why a drag could not begin (the broker refused, or did not answer in time).
    public var onError: ((BrokerError) -> Void)?
    /// The session of the drag under way, or of the last one.
    public private(set) var session: DragSession?
    private let items: ItemsProvider
    private let gesture: OpaquePointer

    /// GTK needs the drag's content before `prepare` returns, so the controller waits that
    /// long for `BeginSession`: one bus round trip, bounded by this.
    static let beginTimeout = DispatchTimeInterval.seconds(2)

    /// `widget` owns the controller from now on; keep a reference only to read `session`.
    public init(widget: UnsafeMutablePointer<GtkWidget>, connection: BrokerConnection,
                options: SessionOptions = SessionOptions(), items: @escaping ItemsProvider) {
        GtkMainActor.install()
        self.connection = connection
        self.options = options
        self.items = items
        gesture = gtk_drag_source_new()
        let actions = options.allowsMove ? GdkDragAction(GDK_ACTION_COPY.rawValue | GDK_ACTION_MOVE.rawValue) : GDK_ACTION_COPY
        gtk_drag_source_set_actions(gesture, actions)
        connect(gesture, "prepare", self, unsafeBitCast(prepareTrampoline, to: GCallback.self))
        connect(gesture, "drag-cancel", self, unsafeBitCast(cancelTrampoline, to: GCallback.self))
        gtk_widget_add_controller(widget, gesture)
    }

    /// The drag is starting: begin the session and offer its token, or refuse the drag (nil).
    fileprivate func prepare() -> MainThreadPointer {
        let items = items()
        guard !items.isEmpty, let session = beginSession(items) else { return MainThreadPointer(raw: nil) }
        self.session = session
        Task { [weak self] in
            for await event in session.events { self?.onEvent?(event) }
        }
        let token = Array(session.token.utf8)
        let bytes = g_bytes_new(token, gsize(token.count))
        defer { g_bytes_unref(bytes) }
        return MainThreadPointer(raw: OpaquePointer(gdk_content_provider_new_for_bytes(DragProtocol.tokenType, bytes)))
    }

    /// Released over nothing, cancelled with Escape, or refused by every target.
    fileprivate func cancelled() {
        session?.dragEnded(dropped: false)
    }

    private func beginSession(_ items: [DragItem]) -> DragSession? {
        let outcome = BeginOutcome()
        let done = DispatchSemaphore(value: 0)
        Task.detached { [connection, options] in
            do throws(BrokerError) {
                let session = try await connection.beginDrag(items: items, options: options)
                // Too late for this drag: nobody will ever drop it.
                if !outcome.deliver(.success(session)) { try? await session.cancel() }
            } catch {
                _ = outcome.deliver(.failure(error))
            }
            done.signal()
        }
        guard done.wait(timeout: .now() + Self.beginTimeout) == .success, let result = outcome.take() else {
            onError?(BrokerError(.timeout, "dragbrokerd did not answer BeginSession within 2 s: the drag was refused"))
            return nil
        }
        switch result {
        case .success(let session):
            return session
        case .failure(let error):
            onError?(error)
            return nil
        }
    }
}

/// The answer to BeginSession, handed from the task that waits for it to the main thread that
/// may have stopped waiting.
private final class BeginOutcome: Sendable {
    private let state = Mutex<(result: Result<DragSession, BrokerError>?, abandoned: Bool)>((nil, false))

    /// Returns false when the main thread gave up waiting.
    func deliver(_ result: Result<DragSession, BrokerError>) -> Bool {
        state.withLock { state in
            guard !state.abandoned else { return false }
            state.result = result
            return true
        }
    }

    func take() -> Result<DragSession, BrokerError>? {
        state.withLock { state in
            state.abandoned = true
            return state.result
        }
    }
}

private let prepareTrampoline: @convention(c) (OpaquePointer?, Double, Double, gpointer?) -> OpaquePointer? = { _, _, _, data in
    let controller = Unmanaged<DragSourceController>.fromOpaque(data!).takeUnretainedValue()
    return MainActor.assumeIsolated { controller.prepare() }.raw
}

private let cancelTrampoline: @convention(c) (OpaquePointer?, OpaquePointer?, GdkDragCancelReason, gpointer?) -> gboolean = { _, _, _, data in
    let controller = Unmanaged<DragSourceController>.fromOpaque(data!).takeUnretainedValue()
    MainActor.assumeIsolated { controller.cancelled() }
    return 0  // GTK's own cancel animation
}

import BrokerClient
import BrokerProtocol
import CGtk
import UniformTypes

/// Makes a widget a drop target, as `UIDropInteraction` does a view, and a paste target, with
/// one declaration of what it takes for both (`PasteConfiguration`, iOS's
/// `UIPasteConfiguration`). Following the drag protocol, on the first motion it reads the
/// token, presents it and looks for items it can handle; it proposes copy, and the broker's
/// answer is the drop status GTK shows. On a drop, or on `paste()` (its shortcut, or a menu)
/// when the clipboard carries a pasteboard entry's token, it loads every item it can handle at
/// once, each with its own progress, and concludes; a drop then finishes the GTK drop with the
/// broker's operation. The same callbacks receive the items of either. Everything reaches the
/// app on the main thread.
@MainActor
public final class DropTargetController {
    /// An item the target will load: the destination's own item number, and the type chosen.
    public struct Item: Sendable, Equatable {
        public let index: Int
        public let suggestedName: String
        public let typeIdentifier: String
        public let preferredWidth: Double
        public let preferredHeight: Double
    }

    public let connection: BrokerConnection
    /// What the widget takes, as a drop or as a paste.
    public let configuration: PasteConfiguration
    /// The broker's answer to the proposal while the drag is over the widget, and `cancel` when
    /// it leaves: for highlighting. `copy` or `move`: a release drops. `forbidden`: the
    /// administrator's policy refuses this drop here. `cancel` while over the widget: nothing
    /// the app handles, as a drop target on iOS that cannot handle the session.
    public var onProposal: ((DropOperation) -> Void)?
    /// The drop happened: these items are about to load; show a placeholder for each.
    public var onItemsIncoming: (([Item]) -> Void)?
    public var onItemProgress: ((Item, _ bytes: UInt64, _ expected: UInt64?) -> Void)?
    /// One item's bytes, or why they did not come; in the order the loads end.
    public var onItemLoaded: ((Item, Result<[UInt8], BrokerError>) -> Void)?
    /// The drop or the paste is over: the operation performed (a paste's is copy), or why
    /// there was none.
    public var onDropEnded: ((DropOperation, BrokerError?) -> Void)?

    private let widget: UnsafeMutablePointer<GtkWidget>
    private let target: OpaquePointer
    private var hover: Hover?
    /// GTK 3 sends a leave right before the drop; the Exit waits this long for one.
    static let exitDelayMilliseconds: UInt32 = 200

    public convenience init(widget: UnsafeMutablePointer<GtkWidget>, connection: BrokerConnection, acceptedTypes: [String]) {
        self.init(widget: widget, connection: connection, configuration: PasteConfiguration(acceptableTypeIdentifiers: acceptedTypes))
    }

    /// `widget` owns the controller from now on.
    public init(widget: UnsafeMutablePointer<GtkWidget>, connection: BrokerConnection, configuration: PasteConfiguration) {
        GtkMainActor.install()
        self.connection = connection
        self.configuration = configuration
        self.widget = widget
        let formats = gdk_content_formats_new(TokenReader.dragType, 1)
        target = gtk_drop_target_async_new(formats, Self.anyAction)
        connect(target, "accept", self, unsafeBitCast(acceptTrampoline, to: GCallback.self))
        connect(target, "drag-enter", self, unsafeBitCast(enterTrampoline, to: GCallback.self))
        connect(target, "drag-motion", self, unsafeBitCast(motionTrampoline, to: GCallback.self))
        connect(target, "drag-leave", self, unsafeBitCast(leaveTrampoline, to: GCallback.self))
        connect(target, "drop", self, unsafeBitCast(dropTrampoline, to: GCallback.self))
        gtk_widget_add_controller(widget, target)
    }

    /// One GTK drag over the widget, from its first motion to its drop or its end.
    final class Hover {
        let drop: OpaquePointer
        var session: DropSession?
        var items: [Item] = []
        var answer: DropOperation = .forbidden
        var inside = true
        var exited = false
        var dropped = false

        init(drop: OpaquePointer) {
            self.drop = drop
            g_object_ref(UnsafeMutableRawPointer(drop))
        }

        deinit {
            g_object_unref(UnsafeMutableRawPointer(drop))
        }
    }

    // MARK: GTK's signals

    fileprivate func accept(_ drop: OpaquePointer) -> Bool {
        gdk_content_formats_contain_mime_type(gdk_drop_get_formats(drop), DragProtocol.tokenType) != 0
    }

    fileprivate func enter(_ drop: OpaquePointer) -> GdkDragAction {
        if let hover, hover.drop == drop {
            // Back over the widget during the same drag: propose again if the Exit went out.
            hover.inside = true
            if hover.exited, let session = hover.session {
                hover.exited = false
                Task { await propose(session, in: hover) }
            }
            return Self.action(hover.answer)
        }
        let hover = Hover(drop: drop)
        self.hover = hover
        Task { await join(hover) }
        return Self.action(.forbidden)  // refused until the broker answers
    }

    fileprivate func motion(_ drop: OpaquePointer) -> GdkDragAction {
        guard let hover, hover.drop == drop else { return Self.action(.forbidden) }
        return Self.action(hover.answer)
    }

    fileprivate func leave(_ drop: OpaquePointer) {
        guard let hover, hover.drop == drop else { return }
        hover.inside = false
        onProposal?(.cancel)
        let box = Unmanaged.passRetained(DeferredExit(controller: self, hover: hover))
        g_timeout_add(Self.exitDelayMilliseconds, { data in
            let deferred = Unmanaged<DeferredExit>.fromOpaque(data!).takeRetainedValue()
            MainActor.assumeIsolated { deferred.run() }
            return 0  // G_SOURCE_REMOVE
        }, box.toOpaque())
    }

    fileprivate func exitIfStillOutside(_ hover: Hover) {
        guard !hover.inside, !hover.dropped, !hover.exited, let session = hover.session else { return }
        hover.exited = true
        Task { try? await session.exit() }
    }

    fileprivate func drop(_ drop: OpaquePointer) -> Bool {
        guard let hover, hover.drop == drop, let session = hover.session,
              hover.answer == .copy || hover.answer == .move else { return false }
        hover.dropped = true
        hover.inside = true
        Task { await perform(session, in: hover) }
        return true
    }

    // MARK: The broker

    /// Reads the token, presents it, picks the items the app can take, and proposes copy.
    private func join(_ hover: Hover) async {
        do throws(BrokerError) {
            let token = try await readToken(hover.drop)
            let session = try await connection.presentToken(token)
            hover.session = session
            hover.items = try await acceptedItems(in: session)
            // With nothing the app can handle it proposes cancel, and the broker's answer says
            // whether that is all (cancel) or the administrator's policy refused it (forbidden).
            await propose(session, in: hover)
        } catch {
            answer(.forbidden, in: hover)
        }
    }

    private func propose(_ session: DropSession, in hover: Hover) async {
        do {
            answer(try await session.enter(proposing: hover.items.isEmpty ? .cancel : .copy), in: hover)
        } catch {
            answer(.forbidden, in: hover)
        }
    }

    private func answer(_ operation: DropOperation, in hover: Hover) {
        hover.answer = operation
        guard self.hover === hover, hover.inside, !hover.dropped else { return }
        // Copy and move both allowed, the answer preferred: with a move-only offer (X11 while
        // Shift is held) GDK refuses a status that allows copy alone.
        gdk_drop_status(hover.drop, operation == .forbidden || operation == .cancel ? GdkDragAction(0) : Self.anyAction,
                        Self.action(operation))
        onProposal?(operation)
    }

    /// PerformDrop, every load at once, Conclude, then GTK's finish with the broker's operation.
    private func perform(_ session: DropSession, in hover: Hover) async {
        let operation: DropOperation
        do {
            operation = try await session.performDrop()
        } catch {
            gdk_drop_finish(hover.drop, GdkDragAction(0))
            onDropEnded?(.cancel, error)
            return
        }
        let concluded = await transfer(hover.items, from: session)
        gdk_drop_finish(hover.drop, Self.action(operation))
        if self.hover === hover { self.hover = nil }
        onDropEnded?(operation, concluded)
    }

    /// The items the configuration takes, as this app numbers them, each with the type to load.
    private func acceptedItems(in session: DropSession) async throws(BrokerError) -> [Item] {
        configuration.accepted(try await session.items()).map {
            Item(index: $0.index, suggestedName: $0.item.suggestedName, typeIdentifier: $0.typeIdentifier,
                 preferredWidth: $0.item.preferredWidth, preferredHeight: $0.item.preferredHeight)
        }
    }

    /// After a drop or a paste: every item at once, each with its progress, then Conclude.
    private func transfer(_ items: [Item], from session: DropSession) async -> BrokerError? {
        onItemsIncoming?(items)
        await withTaskGroup(of: Void.self) { group in
            for item in items {
                group.addTask { [weak self] in
                    let progress: @Sendable (UInt64, UInt64?) -> Void = { [weak self] bytes, expected in
                        Task { @MainActor in self?.onItemProgress?(item, bytes, expected) }
                    }
                    let result: Result<[UInt8], BrokerError>
                    do throws(BrokerError) {
                        let data = try await session.loadData(item: item.index, typeIdentifier: item.typeIdentifier, progress: progress)
                        result = .success(Array(data))
                    } catch {
                        result = .failure(error)
                    }
                    await MainActor.run { self?.onItemLoaded?(item, result) }
                }
            }
        }
        do {
            try await session.conclude()
            return nil
        } catch {
            return error
        }
    }

    // MARK: Paste

    /// Binds `trigger` (GTK's syntax) to `paste()`. For a text widget, whose own paste GTK
    /// binds, pass `brokerEntriesOnly`: the shortcut then acts only when the clipboard carries a
    /// pasteboard entry's token, and leaves the keys to the widget's own paste otherwise.
    public func installShortcut(_ trigger: String = "<Control>v", on widget: UnsafeMutablePointer<GtkWidget>,
                                brokerEntriesOnly: Bool = false) {
        addShortcut(trigger, to: widget, scope: brokerEntriesOnly ? GTK_SHORTCUT_SCOPE_LOCAL : GTK_SHORTCUT_SCOPE_GLOBAL, self) {
            brokerEntriesOnly && !$0.clipboardHasEntry ? false : $0.paste()
        }
    }

    /// Whether the clipboard now carries a pasteboard entry's token: enough to enable a Paste
    /// menu item before asking the broker anything.
    public var clipboardHasEntry: Bool {
        gdk_content_formats_contain_mime_type(gdk_clipboard_get_formats(clipboard), BrokerNames.pasteboardTokenType) != 0
    }

    private var clipboard: OpaquePointer { gtk_widget_get_clipboard(widget) }

    /// Paste: through the broker when the clipboard carries a pasteboard entry's token (each
    /// call is one paste, recorded); else, when the configuration takes plain text, the
    /// clipboard's text in the clear, as item 0 of type `text/plain;charset=utf-8`, which the
    /// broker never sees. The items reach the same callbacks as a drop's. Returns whether there
    /// was anything to paste.
    @discardableResult
    public func paste() -> Bool {
        if clipboardHasEntry {
            Task { await pasteEntry() }
            return true
        }
        let clearText = VisibleItem(suggestedName: "", preferredWidth: 0, preferredHeight: 0, typeIdentifiers: [Self.clearTextType])
        let takesText = !configuration.accepted([clearText]).isEmpty
        guard takesText, shim_formats_contain_text(gdk_clipboard_get_formats(clipboard)) != 0 else { return false }
        Task { await pasteClearText() }
        return true
    }

    static let clearTextType = "text/plain;charset=utf-8"

    private func pasteEntry() async {
        do throws(BrokerError) {
            let bytes = await TokenReader.read { reader in
                gdk_clipboard_read_async(clipboard, TokenReader.pasteboardType, G_PRIORITY_DEFAULT, nil, { object, result, data in
                    let reader = Unmanaged<TokenReader>.fromOpaque(data!).takeRetainedValue()
                    reader.opened(gdk_clipboard_read_finish(OpaquePointer(object), result, nil, nil))
                }, reader)
            }
            guard let bytes, let token = DragProtocol.token(from: bytes) else {
                throw BrokerError(.invalidArgument, "The clipboard offered no valid \(BrokerNames.pasteboardTokenType)")
            }
            let entry = try await connection.presentToken(token)
            let items = try await acceptedItems(in: entry)
            guard !items.isEmpty else {
                onDropEnded?(.cancel, BrokerError(.notFound, "Nothing on the clipboard is of a type this widget takes"))
                return
            }
            let paste = try await entry.paste()
            onDropEnded?(.copy, await transfer(items, from: paste))
        } catch {
            onDropEnded?(.cancel, error)
        }
    }

    private func pasteClearText() async {
        let text: String? = await withCheckedContinuation { continuation in
            let box = Unmanaged.passRetained(TextWaiter(continuation)).toOpaque()
            gdk_clipboard_read_text_async(clipboard, nil, { object, result, data in
                let waiter = Unmanaged<TextWaiter>.fromOpaque(data!).takeRetainedValue()
                let text = gdk_clipboard_read_text_finish(OpaquePointer(object), result, nil)
                defer { g_free(text) }
                waiter.continuation.resume(returning: text.map { String(cString: $0) })
            }, box)
        }
        guard let text else {
            onDropEnded?(.cancel, BrokerError(.notFound, "The clipboard's text could not be read"))
            return
        }
        let item = Item(index: 0, suggestedName: "", typeIdentifier: Self.clearTextType, preferredWidth: 0, preferredHeight: 0)
        onItemsIncoming?([item])
        onItemLoaded?(item, .success(Array(text.utf8)))
        onDropEnded?(.copy, nil)
    }

    static let anyAction = GdkDragAction(GDK_ACTION_COPY.rawValue | GDK_ACTION_MOVE.rawValue)

    static func action(_ operation: DropOperation) -> GdkDragAction {
        switch operation {
        case .copy: GDK_ACTION_COPY
        case .move: GDK_ACTION_MOVE
        case .cancel, .forbidden: GdkDragAction(0)
        }
    }

    // MARK: Reading the token

    /// GDK hands the offer over as a stream that the main loop fills: read it without blocking.
    private func readToken(_ drop: OpaquePointer) async throws(BrokerError) -> String {
        let bytes = await TokenReader.read { reader in
            gdk_drop_read_async(drop, TokenReader.dragType, G_PRIORITY_DEFAULT, nil, { object, result, data in
                let reader = Unmanaged<TokenReader>.fromOpaque(data!).takeRetainedValue()
                reader.opened(gdk_drop_read_finish(OpaquePointer(object), result, nil, nil))
            }, reader)
        }
        guard let bytes, let token = DragProtocol.token(from: bytes) else {
            throw BrokerError(.invalidArgument, "The drag offered no valid \(DragProtocol.tokenType)")
        }
        return token
    }
}

/// Reads the whole offer of a drag or a clipboard (64 bytes, and at most a little more
/// before it refuses).
private final class TokenReader {
    nonisolated(unsafe) static let dragType = mimeTypes(DragProtocol.tokenType)
    nonisolated(unsafe) static let pasteboardType = mimeTypes(BrokerNames.pasteboardTokenType)
    static let limit = 4096

    /// GDK's NULL-terminated list of one type, made once per type for the process's life.
    private static func mimeTypes(_ type: String) -> UnsafeMutablePointer<UnsafePointer<CChar>?> {
        let types = UnsafeMutablePointer<UnsafePointer<CChar>?>.allocate(capacity: 2)
        types[0] = UnsafePointer(strdup(type))
        types[1] = nil
        return types
    }

    /// `open` starts GDK's read with the reader as its callback's data (retained), and the
    /// callback hands `opened` the stream.
    @MainActor static func read(_ open: (UnsafeMutableRawPointer) -> Void) async -> [UInt8]? {
        await withCheckedContinuation { continuation in
            open(Unmanaged.passRetained(TokenReader(continuation)).toOpaque())
        }
    }

    private let continuation: CheckedContinuation<[UInt8]?, Never>
    private var bytes: [UInt8] = []
    private var stream: UnsafeMutablePointer<GInputStream>?

    init(_ continuation: CheckedContinuation<[UInt8]?, Never>) {
        self.continuation = continuation
    }

    func opened(_ stream: UnsafeMutablePointer<GInputStream>?) {
        self.stream = stream
        readMore()
    }

    private func readMore() {
        guard let stream, bytes.count <= Self.limit else { return finish(nil) }
        g_input_stream_read_bytes_async(stream, 256, G_PRIORITY_DEFAULT, nil, { object, result, data in
            let reader = Unmanaged<TokenReader>.fromOpaque(data!).takeRetainedValue()
            reader.chunk(g_input_stream_read_bytes_finish(UnsafeMutablePointer<GInputStream>(OpaquePointer(object)), result, nil))
        }, Unmanaged.passRetained(self).toOpaque())
    }

    private func chunk(_ chunk: OpaquePointer?) {
        guard let chunk else { return finish(nil) }
        defer { g_bytes_unref(chunk) }
        var size: gsize = 0
        let data = g_bytes_get_data(chunk, &size)
        if size == 0 { return finish(bytes) }
        bytes += UnsafeRawBufferPointer(start: data, count: Int(size))
        readMore()
    }

    private func finish(_ result: [UInt8]?) {
        if let stream { g_object_unref(stream) }
        stream = nil
        continuation.resume(returning: result)
    }
}

/// Waits for the clipboard's text.
private final class TextWaiter {
    let continuation: CheckedContinuation<String?, Never>
    init(_ continuation: CheckedContinuation<String?, Never>) { self.continuation = continuation }
}

/// The Exit a leave schedules, run unless the drag came back or dropped meanwhile.
private final class DeferredExit {
    let controller: DropTargetController
    let hover: DropTargetController.Hover

    init(controller: DropTargetController, hover: DropTargetController.Hover) {
        self.controller = controller
        self.hover = hover
    }

    @MainActor func run() {
        controller.exitIfStillOutside(hover)
    }
}

private func controller(_ data: gpointer?) -> DropTargetController {
    Unmanaged<DropTargetController>.fromOpaque(data!).takeUnretainedValue()
}

private let acceptTrampoline: @convention(c) (OpaquePointer?, OpaquePointer?, gpointer?) -> gboolean = { _, drop, data in
    let target = controller(data)
    let pointer = MainThreadPointer(raw: drop)
    return MainActor.assumeIsolated { target.accept(pointer.raw!) } ? 1 : 0
}

private let enterTrampoline: @convention(c) (OpaquePointer?, OpaquePointer?, Double, Double, gpointer?) -> GdkDragAction = { _, drop, _, _, data in
    let target = controller(data)
    let pointer = MainThreadPointer(raw: drop)
    return GdkDragAction(MainActor.assumeIsolated { target.enter(pointer.raw!).rawValue })
}

private let motionTrampoline: @convention(c) (OpaquePointer?, OpaquePointer?, Double, Double, gpointer?) -> GdkDragAction = { _, drop, _, _, data in
    let target = controller(data)
    let pointer = MainThreadPointer(raw: drop)
    return GdkDragAction(MainActor.assumeIsolated { target.motion(pointer.raw!).rawValue })
}

private let leaveTrampoline: @convention(c) (OpaquePointer?, OpaquePointer?, gpointer?) -> Void = { _, drop, data in
    let target = controller(data)
    let pointer = MainThreadPointer(raw: drop)
    MainActor.assumeIsolated { target.leave(pointer.raw!) }
}

private let dropTrampoline: @convention(c) (OpaquePointer?, OpaquePointer?, Double, Double, gpointer?) -> gboolean = { _, drop, _, _, data in
    let target = controller(data)
    let pointer = MainThreadPointer(raw: drop)
    return MainActor.assumeIsolated { target.drop(pointer.raw!) } ? 1 : 0
}

import BrokerClient
import BrokerProtocol
import CGtk
import Foundation

/// Makes a widget a copy source through the broker, as `UIPasteboard.setItemProviders` does:
/// Copy (its shortcut, or `copy()` from a menu) puts the items `items` returns on the broker's
/// pasteboard and the GTK clipboard (`GdkClipboard`) carries the entry's token, plus, for apps
/// that do not speak the protocol, only what the broker says may go in the clear
/// (`PasteboardEntry.clearOffers`). When another app takes the clipboard the entry is
/// withdrawn. Everything reaches the app on the main thread.
@MainActor
public final class CopySourceController {
    public typealias ItemsProvider = @MainActor () -> [DragItem]

    public let connection: BrokerConnection
    public var options: PasteOptions
    /// The entry's events: pastes, their loads, its end.
    public var onEvent: ((PasteboardEntryEvent) -> Void)?
    /// Why a copy failed (the broker refused it, or is gone).
    public var onError: ((BrokerError) -> Void)?
    /// The entry on the pasteboard now, if this app still owns the clipboard.
    public private(set) var entry: PasteboardEntry?
    /// The types put on the clipboard in the clear by the last copy.
    public private(set) var clearTypes: [String] = []
    private let items: ItemsProvider
    private let clipboard: OpaquePointer
    /// Copies since the controller was made: a slow copy that a newer one overtook is dropped.
    private var generation = 0

    /// `widget` owns the controller from now on.
    public init(widget: UnsafeMutablePointer<GtkWidget>, connection: BrokerConnection,
                options: PasteOptions = PasteOptions(), items: @escaping ItemsProvider) {
        GtkMainActor.install()
        self.connection = connection
        self.options = options
        self.items = items
        clipboard = gtk_widget_get_clipboard(widget)
        connect(clipboard, "changed", self, unsafeBitCast(changedTrampoline, to: GCallback.self))
    }

    /// Binds `trigger` (GTK's syntax) in the widget's window to `copy()`.
    public func installShortcut(_ trigger: String = "<Control>c", on widget: UnsafeMutablePointer<GtkWidget>) {
        addShortcut(trigger, to: widget, scope: GTK_SHORTCUT_SCOPE_GLOBAL, self) { controller in
            controller.copy()
            return true
        }
    }

    /// Copy: withdraws the previous entry, puts the items on the broker's pasteboard, then
    /// takes the clipboard with the token and the clear offers. Nothing is asked of the items'
    /// providers but the clear offers, which the clipboard must hold as bytes.
    public func copy() {
        let items = items()
        guard !items.isEmpty else { return }
        generation += 1
        let generation = generation
        let previous = entry
        entry = nil
        Task {
            if let previous { try? await previous.withdraw() }
            do throws(BrokerError) {
                let entry = try await connection.copy(items: items, options: options)
                let clear = try await Self.clearContent(of: entry, first: items[0].itemProvider)
                guard generation == self.generation else {
                    try? await entry.withdraw()
                    return
                }
                take(entry, clear)
            } catch {
                onError?(error)
            }
        }
    }

    /// The bytes of each type the broker lets go in the clear, as the item's provider makes them.
    private static func clearContent(of entry: PasteboardEntry, first provider: ItemProvider) async throws(BrokerError)
        -> [(type: String, data: Data)] {
        var content: [(type: String, data: Data)] = []
        for type in try await entry.clearOffers() {
            if let data = try? await provider.loadDataRepresentation(forTypeIdentifier: type) { content.append((type, data)) }
        }
        return content
    }

    private func take(_ entry: PasteboardEntry, _ clear: [(type: String, data: Data)]) {
        var providers: [OpaquePointer?] = [Self.bytesProvider(BrokerNames.pasteboardTokenType, Data(entry.token.utf8))]
        for (type, data) in clear {
            providers.append(Self.bytesProvider(type, data))
            // Text also in GDK's text formats, which terminals and older apps ask for.
            if type.hasPrefix("text/plain"), let text = String(data: data, encoding: .utf8) {
                providers.append(OpaquePointer(shim_text_provider(text)))
            }
        }
        let union = providers.withUnsafeMutableBufferPointer { buffer in
            buffer.withMemoryRebound(to: UnsafeMutablePointer<GdkContentProvider>?.self) {
                gdk_content_provider_new_union($0.baseAddress, gsize($0.count))
            }
        }
        self.entry = entry
        clearTypes = clear.map(\.type)
        // The clipboard's own `changed` for this content must not read as a lost clipboard.
        gdk_clipboard_set_content(clipboard, union)
        g_object_unref(union)
        Task { [weak self] in
            for await event in entry.events { self?.onEvent?(event) }
        }
    }

    private static func bytesProvider(_ type: String, _ data: Data) -> OpaquePointer? {
        let bytes = data.withUnsafeBytes { g_bytes_new($0.baseAddress, gsize($0.count)) }
        defer { g_bytes_unref(bytes) }
        return OpaquePointer(gdk_content_provider_new_for_bytes(type, bytes))
    }

    /// The clipboard changed: if this app no longer owns it, the entry leaves the pasteboard.
    fileprivate func clipboardChanged() {
        guard gdk_clipboard_is_local(clipboard) == 0, let entry else { return }
        self.entry = nil
        entry.ownershipLost()
    }
}

private let changedTrampoline: @convention(c) (OpaquePointer?, gpointer?) -> Void = { _, data in
    let controller = Unmanaged<CopySourceController>.fromOpaque(data!).takeUnretainedValue()
    MainActor.assumeIsolated { controller.clipboardChanged() }
}

// BrokerGTK — drag and drop between GTK 4 apps through dragbrokerd, after UIKit's drag and drop
// interactions. The GTK drag carries only the session token
// (`application/vnd.dragbroker.token.v1`, docs/desktop-drag-protocol.md); everything else goes
// through BrokerClient. `DragSourceController` is the source's side, `DropTargetController` the
// target's. Both live on the main thread, which GTK's main loop and Swift's main actor share.
import BrokerProtocol
import CGtk
import Dispatch
import SystemCalls
import SystemPackage

/// GTK's main loop drains libdispatch's main queue, so `@MainActor` code, including
/// `Task { @MainActor in … }`, runs inside a GTK app as it does under `dispatchMain()`.
public enum GtkMainActor {
    @MainActor private static var installed = false

    /// Call once on the main thread after `gtk_init()`; the controllers call it themselves.
    @MainActor public static func install() {
        guard !installed else { return }
        installed = true
        g_unix_fd_add(_dispatch_get_main_queue_handle_4CF(), G_IO_IN, { fd, _, _ in
            // The handle is an eventfd: consume the wakeup, as CoreFoundation's run loop does,
            // or the source fires for ever and starves GTK's drawing.
            var count: UInt64 = 0
            _ = withUnsafeMutableBytes(of: &count) { try? FileDescriptor(rawValue: fd).readSome(into: $0) }
            _dispatch_main_queue_callback_4CF(nil)
            return 1  // G_SOURCE_CONTINUE
        }, nil)
    }
}

/// The token's type in the toolkit drag, as the drag protocol names it.
public enum DragProtocol {
    public static let tokenType = BrokerNames.dragTokenType

    /// A token as the protocol allows it: 64 lowercase hexadecimal characters, nothing else.
    static func token(from bytes: [UInt8]) -> String? {
        guard bytes.count == 64, bytes.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// A pointer handed across isolation where GTK's threading rules, not Swift's, keep it safe:
/// it is only ever dereferenced on the main thread.
struct MainThreadPointer: @unchecked Sendable {
    let raw: OpaquePointer?
}

/// Connects a GObject signal to a C trampoline whose user data is `target`, retained for as
/// long as the connection lives (GTK drops it with the instance).
@MainActor
func connect(_ instance: OpaquePointer, _ signal: String, _ target: AnyObject, _ handler: GCallback) {
    shim_signal_connect(UnsafeMutableRawPointer(instance), signal, handler, Unmanaged.passRetained(target).toOpaque(), { data, _ in
        Unmanaged<AnyObject>.fromOpaque(data!).release()
    })
}

/// Binds a shortcut (GTK's trigger syntax, "<Control>v") on `widget` to `action`, which says
/// whether it handled the keys (if not, they go on to the widget's own bindings). Scope
/// `GLOBAL` acts wherever the focus is in the widget's window; `LOCAL` only when the widget has
/// the focus, and then in the capture phase, before the widget's own bindings.
@MainActor
func addShortcut<Target: AnyObject>(_ trigger: String, to widget: UnsafeMutablePointer<GtkWidget>, scope: GtkShortcutScope,
                                    _ target: Target, _ action: @escaping @MainActor (Target) -> Bool) {
    let controller = gtk_shortcut_controller_new()
    gtk_shortcut_controller_set_scope(controller, scope)
    if scope == GTK_SHORTCUT_SCOPE_LOCAL { gtk_event_controller_set_propagation_phase(controller, GTK_PHASE_CAPTURE) }
    let box = ShortcutAction { [unowned target] in action(target) }
    let callback = gtk_callback_action_new({ _, _, data in
        let box = Unmanaged<ShortcutAction>.fromOpaque(data!).takeUnretainedValue()
        return MainActor.assumeIsolated { box.run() } ? 1 : 0
    }, Unmanaged.passRetained(box).toOpaque(), { data in
        Unmanaged<ShortcutAction>.fromOpaque(data!).release()
    })
    gtk_shortcut_controller_add_shortcut(controller, gtk_shortcut_new(gtk_shortcut_trigger_parse_string(trigger), callback))
    gtk_widget_add_controller(widget, controller)
}

/// A shortcut's action, owned by GTK's callback action.
private final class ShortcutAction {
    let run: @MainActor () -> Bool
    init(_ run: @escaping @MainActor () -> Bool) { self.run = run }
}

extension GtkMainActor {
    /// Runs GTK's main loop, with the main actor on it, until the process exits.
    @MainActor public static func run() -> Never {
        install()
        while true { g_main_context_iteration(nil, 1) }
    }
}

/// GTK's C casts (`GTK_WINDOW (w)`, `GTK_BOX (w)`) are macros; these are their Swift form.
public enum GtkCast {
    public static func window(_ widget: UnsafeMutablePointer<GtkWidget>) -> UnsafeMutablePointer<GtkWindow> {
        UnsafeMutableRawPointer(widget).assumingMemoryBound(to: GtkWindow.self)
    }

    public static func box(_ widget: UnsafeMutablePointer<GtkWidget>) -> UnsafeMutablePointer<GtkBox> {
        UnsafeMutableRawPointer(widget).assumingMemoryBound(to: GtkBox.self)
    }
}

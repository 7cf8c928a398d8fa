// An example drop and paste target: a window that accepts only images, by one declaration for
// both. While a drag is over it, it shows the broker's answer; on a drop, or a paste (Ctrl+V),
// it shows a placeholder with a progress bar for each image, then the image itself, and saves
// what it received.
import BrokerClient
import BrokerGTK
import CGtk
import Foundation

// `--title T` and `--size N` (an NxN window) let tests place the window among others.
var title = "dragbroker demo: target"
var size = (width: 340, height: 300)
var positional: [String] = []
// `--text`: a text view instead, whose own Ctrl+V GTK binds: the route BrokerGTK shows for
// text widgets, through the broker for a pasteboard entry and GTK's own paste otherwise.
var textView = false
var options = CommandLine.arguments.dropFirst().makeIterator()
while let option = options.next() {
    switch option {
    case "--title": title = options.next() ?? title
    case "--size": size = options.next().flatMap(Int.init).map { ($0, $0) } ?? size
    case "--text": textView = true
    default: positional.append(option)
    }
}
guard positional.count == 1 else {
    print("usage: dragbroker-demo-target [--title TITLE] [--size PIXELS] [--text] OUTPUT-DIRECTORY")
    exit(2)
}
let outputDirectory = URL(fileURLWithPath: positional[0])

func say(_ line: String) {
    print("target: \(line)")
    fflush(nil)
}

gtk_init()
// GTK's main loop runs the main actor; the window appears once the broker is reached.
Task { @MainActor in
    let broker: BrokerConnection
    do {
        broker = try await BrokerConnection.connect()
    } catch {
        say("\(error)")
        exit(1)
    }
    if textView { showTextWindow(broker) } else { showWindow(broker) }
}

/// A text view that pastes through the broker when the clipboard carries an entry, and lets
/// GTK's own paste take the clear text otherwise.
@MainActor func showTextWindow(_ broker: BrokerConnection) {
    let window = gtk_window_new()!
    gtk_window_set_title(GtkCast.window(window), title)
    gtk_window_set_default_size(GtkCast.window(window), Int32(size.width), Int32(size.height))
    let view = gtk_text_view_new()!
    gtk_window_set_child(GtkCast.window(window), view)
    let buffer = gtk_text_view_get_buffer(UnsafeMutableRawPointer(view).assumingMemoryBound(to: GtkTextView.self))
    let target = DropTargetController(widget: view, connection: broker,
                                      configuration: PasteConfiguration(acceptableTypeIdentifiers: ["text/plain"]))
    target.installShortcut(on: view, brokerEntriesOnly: true)
    target.onItemLoaded = { _, result in
        guard case .success(let bytes) = result else { return }
        let text = String(decoding: bytes, as: UTF8.self)
        gtk_text_buffer_insert_at_cursor(buffer, text, -1)
        say("pasted through the broker: \(text)")
    }
    target.onDropEnded = { operation, error in say(error.map { "the paste ended: \($0)" } ?? "concluded the \(operation.rawValue)") }
    shim_signal_connect(UnsafeMutableRawPointer(buffer), "changed", unsafeBitCast(textChanged, to: GCallback.self), nil, nil)
    gtk_window_present(GtkCast.window(window))
    gtk_widget_grab_focus(view)
    say("waiting for a paste (Ctrl+V) into the text")
}

/// Every change of the text, GTK's own paste's included.
let textChanged: @convention(c) (UnsafeMutablePointer<GtkTextBuffer>?, gpointer?) -> Void = { buffer, _ in
    var start = GtkTextIter(), end = GtkTextIter()
    gtk_text_buffer_get_bounds(buffer, &start, &end)
    let text = gtk_text_buffer_get_text(buffer, &start, &end, 0)
    defer { g_free(text) }
    say("the text is now: \(text.map { String(cString: $0) } ?? "")")
}
@MainActor func showWindow(_ broker: BrokerConnection) {
    let window = gtk_window_new()!
    gtk_window_set_title(GtkCast.window(window), title)
    gtk_window_set_default_size(GtkCast.window(window), Int32(size.width), Int32(size.height))
    let column = gtk_box_new(GTK_ORIENTATION_VERTICAL, 8)!
    gtk_widget_set_size_request(column, Int32(size.width), Int32(size.height))
    gtk_window_set_child(GtkCast.window(window), column)
    let hint = gtk_label_new("Drop images here")!
    gtk_box_append(GtkCast.box(column), hint)

    var placeholders: [Int: Placeholder] = [:]
    // canHandle, for drops and pastes alike: images only; anything else is not dropped here,
    // and the broker says when the administrator's policy is why.
    let target = DropTargetController(widget: column, connection: broker,
                                      configuration: PasteConfiguration(acceptableTypeIdentifiers: ["public.image"]))
    target.installShortcut(on: window)
    target.onProposal = { operation in
        switch operation {
        case .copy, .move:
            say("the broker allows \(operation.rawValue)")
            gtk_label_set_text(OpaquePointer(hint), "Release to \(operation.rawValue) the image")
        case .forbidden:
            say("the administrator's policy refuses this drop: the drop is refused")
            gtk_label_set_text(OpaquePointer(hint), "Refused by policy")
        case .cancel:
            gtk_label_set_text(OpaquePointer(hint), "Drop images here")
        }
    }
    target.onItemsIncoming = { items in
        say("incoming \(items.map { "item \($0.index) as \($0.typeIdentifier)" }.joined(separator: ", "))")
        for item in items { placeholders[item.index] = Placeholder(name: item.suggestedName, in: column) }
    }
    target.onItemProgress = { item, bytes, expected in
        let fraction = expected.map { Double(bytes) / Double(max($0, 1)) } ?? 0
        placeholders[item.index]?.progress(fraction)
        let bar = String(repeating: "#", count: Int(fraction * 20)).padding(toLength: 20, withPad: "-", startingAt: 0)
        say("loading [\(bar)] \(bytes) of \(expected.map(String.init) ?? "?") bytes")
    }
    target.onItemLoaded = { item, result in
        switch result {
        case .success(let data):
            placeholders[item.index]?.show(data)
            let name = item.suggestedName.isEmpty ? "dropped" : item.suggestedName
            let file = outputDirectory.appendingPathComponent(name)
            try? FileManager.default.createDirectory(at: outputDirectory, withIntermediateDirectories: true)
            try? Data(data).write(to: file)
            let magic = data.prefix(8).map { String(format: "%02x", $0) }.joined(separator: " ")
            say("received \(data.count) bytes (\(magic) …), saved to \(file.path)")
        case .failure(let error):
            say("item \(item.index) did not arrive: \(error)")
        }
    }
    target.onDropEnded = { operation, error in
        gtk_label_set_text(OpaquePointer(hint), "Drop images here")
        say(error.map { "the drop ended: \($0)" } ?? "concluded the \(operation.rawValue)")
    }
    gtk_window_present(GtkCast.window(window))
    say("waiting for a drop or a paste (Ctrl+V)")
}

/// A placeholder per incoming item: its name and a progress bar, then the image.
@MainActor final class Placeholder {
    let row = gtk_box_new(GTK_ORIENTATION_VERTICAL, 4)!
    let bar = gtk_progress_bar_new()!

    init(name: String, in column: UnsafeMutablePointer<GtkWidget>) {
        gtk_box_append(GtkCast.box(row), gtk_label_new(name))
        gtk_box_append(GtkCast.box(row), bar)
        gtk_box_append(GtkCast.box(column), row)
    }

    func progress(_ fraction: Double) {
        gtk_progress_bar_set_fraction(OpaquePointer(bar), fraction)
    }

    func show(_ image: [UInt8]) {
        let bytes = image.withUnsafeBytes { g_bytes_new($0.baseAddress, gsize($0.count)) }
        defer { g_bytes_unref(bytes) }
        guard let texture = gdk_texture_new_from_bytes(bytes, nil) else { return }
        let picture = gtk_picture_new_for_paintable(texture)!
        gtk_widget_set_size_request(picture, Int32(size.width - 20), Int32((size.width - 20) * 5 / 8))
        gtk_box_remove(GtkCast.box(row), bar)
        gtk_box_append(GtkCast.box(row), picture)
    }
}

GtkMainActor.run()

// An example drag and copy source, after the iOS drag-and-drop samples: a window showing a
// picture and its caption. Drag the picture, or copy it (Ctrl+C): the PNG is rendered only when
// a destination that performed the drop or the paste asks for it; the caption goes along as
// text, and is the one thing put on the clipboard in the clear for apps that do not speak the
// protocol.
import BrokerClient
import BrokerGTK
import CGtk
import Foundation

let caption = "Sunset over the harbour"
// `--title T` and `--size N` (an NxN window) let tests place the window among others.
var title = "dragbroker demo: source"
var size = (width: 340, height: 300)
var options = CommandLine.arguments.dropFirst().makeIterator()
while let option = options.next() {
    switch (option, options.next()) {
    case ("--title", let value?): title = value
    case ("--size", let value?) where Int(value) != nil: size = (Int(value)!, Int(value)!)
    default:
        print("usage: dragbroker-demo-source [--title TITLE] [--size PIXELS]")
        exit(2)
    }
}
let image = PNG.gradient(width: 640, height: 480)

func say(_ line: String) {
    print("source: \(line)")
    fflush(nil)
}

func pictureItem() -> DragItem {
    let picture = ItemProvider(suggestedName: "sunset.png", preferredPresentationSize: (640, 480))
    // Team visibility: only apps of our own team (the administrator's registry says which)
    // may even see that a PNG is on offer.
    picture.registerDataRepresentation(forTypeIdentifier: "public.png", visibility: .team) {
        say("rendering the PNG now, because the destination asked for it")
        return image
    }
    picture.registerDataRepresentation(forTypeIdentifier: "text/plain;charset=utf-8", visibility: .all) {
        say("providing the caption")
        return Data(caption.utf8)
    }
    return DragItem(itemProvider: picture, localObject: caption)
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
    showWindow(broker)
}
@MainActor func showWindow(_ broker: BrokerConnection) {
    let window = gtk_window_new()!
    gtk_window_set_title(GtkCast.window(window), title)
    gtk_window_set_default_size(GtkCast.window(window), Int32(size.width), Int32(size.height))
    let column = gtk_box_new(GTK_ORIENTATION_VERTICAL, 8)!
    gtk_window_set_child(GtkCast.window(window), column)
    let bytes = image.withUnsafeBytes { g_bytes_new($0.baseAddress, gsize($0.count)) }
    let texture = gdk_texture_new_from_bytes(bytes, nil)
    let picture = gtk_picture_new_for_paintable(texture)!
    gtk_widget_set_size_request(picture, Int32(size.width - 20), Int32((size.width - 20) * 3 / 4))
    gtk_box_append(GtkCast.box(column), picture)
    gtk_box_append(GtkCast.box(column), gtk_label_new(caption))

    let source = DragSourceController(widget: picture, connection: broker) { [pictureItem()] }
    source.onError = { say("could not begin a drag: \($0)") }
    source.onEvent = { event in
        switch event {
        case .loadRequested(_, let item, let type): say("destination requested item \(item) as \(type)")
        case .loadProgress: break
        case .loadFinished(let load, let bytes, nil): say("load \(load) delivered \(bytes) bytes")
        case .loadFinished(let load, _, let error?): say("load \(load) failed: \(error)")
        case .willEnd(let operation): say("the drop was performed: \(operation.rawValue)")
        case .ended(let operation, nil): say("the session ended with \(operation.rawValue)")
        case .ended(let operation, let error?): say("the session ended with \(operation.rawValue): \(error)")
        case .transferFinished: say("every transfer finished")
        }
    }
    let copier = CopySourceController(widget: picture, connection: broker) { [pictureItem()] }
    copier.installShortcut(on: window)
    copier.onError = { say("could not copy: \($0)") }
    copier.onEvent = { event in
        switch event {
        case .pasted(_, let app): say("\(app) pasted the copy")
        case .loadRequested(_, _, let item, let type): say("a paste requested item \(item) as \(type)")
        case .loadFinished(_, let load, let bytes, nil): say("paste load \(load) delivered \(bytes) bytes")
        case .loadFinished(_, let load, _, let error?): say("paste load \(load) failed: \(error)")
        case .ended(nil): say("the copy left the pasteboard")
        case .ended(let error?): say("the copy left the pasteboard: \(error.message)")
        }
    }
    gtk_window_present(GtkCast.window(window))
    say("showing sunset.png; drag the picture, or copy it with Ctrl+C")
}

/// Just enough PNG to make a real image file: 8-bit RGB, stored (uncompressed) deflate.
enum PNG {
    static func gradient(width: Int, height: Int) -> Data {
        var raw = [UInt8]()
        for y in 0..<height {
            raw.append(0)  // filter: none
            for x in 0..<width {
                raw += [UInt8(255 - y * 255 / height), UInt8(90 + x * 100 / width), UInt8(40 + y * 150 / height)]
            }
        }
        var png = Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A])
        png += chunk("IHDR", be32(UInt32(width)) + be32(UInt32(height)) + [8, 2, 0, 0, 0])
        png += chunk("IDAT", zlibStored(raw))
        png += chunk("IEND", [])
        return png
    }

    static func be32(_ v: UInt32) -> [UInt8] { [UInt8(v >> 24), UInt8(v >> 16 & 0xff), UInt8(v >> 8 & 0xff), UInt8(v & 0xff)] }

    static func chunk(_ type: String, _ body: [UInt8]) -> Data {
        let typed = Array(type.utf8) + body
        return Data(be32(UInt32(body.count)) + typed + be32(crc32(typed)))
    }

    static func zlibStored(_ data: [UInt8]) -> [UInt8] {
        var out: [UInt8] = [0x78, 0x01]
        var offset = 0
        repeat {
            let n = min(65535, data.count - offset)
            let last: UInt8 = offset + n == data.count ? 1 : 0
            out += [last, UInt8(n & 0xff), UInt8(n >> 8), UInt8(~n & 0xff), UInt8((~n >> 8) & 0xff)]
            out += data[offset..<offset + n]
            offset += n
        } while offset < data.count
        var a: UInt32 = 1, b: UInt32 = 0
        for byte in data { a = (a + UInt32(byte)) % 65521; b = (b + a) % 65521 }
        return out + be32(b << 16 | a)
    }

    static func crc32(_ bytes: [UInt8]) -> UInt32 {
        var crc: UInt32 = 0xffff_ffff
        for byte in bytes {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 == 1 ? 0xEDB8_8320 ^ (crc >> 1) : crc >> 1 }
        }
        return ~crc
    }
}

GtkMainActor.run()

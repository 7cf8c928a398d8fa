import Foundation
import SystemCalls
import UniformTypes

/// A value that can put itself into a drag, like `NSItemProviderWriting`: it lists the types
/// it can be written as and says how each is produced. Register one with
/// `ItemProvider(object:)` or `registerObject(_:)`.
public protocol ItemProviderWriting: Sendable {
    /// The types this value can be written as, best first: MIME types, or UTIs the broker
    /// knows (`public.png`). A destination sees them in this order.
    var writableTypeIdentifiers: [String] { get }

    /// How the representation of `typeIdentifier`, one of `writableTypeIdentifiers` exactly
    /// as listed there, is produced. Asked once, at registration; the representation's handler
    /// runs only when a destination loads that type, once per load.
    func itemRepresentation(forTypeIdentifier typeIdentifier: String) -> ItemRepresentation

    /// The item's name, for `ItemProvider(object:)`: a file's name, say. Empty by default.
    var suggestedName: String { get }
}

extension ItemProviderWriting {
    public var suggestedName: String { "" }
}

/// One way of producing a representation: the same three an `ItemProvider` registers by hand.
public struct ItemRepresentation: Sendable {
    let provision: ItemProvider.Provision

    /// Bytes produced in one piece, as `registerDataRepresentation`.
    public static func data(_ loadHandler: @escaping ItemProvider.LoadHandler) -> ItemRepresentation {
        ItemRepresentation(provision: .data(loadHandler))
    }

    /// Bytes the value already is, as `registerDataRepresentation(forTypeIdentifier:data:)`:
    /// small ones are served on the connection's own thread, with no handler to run.
    public static func data(_ bytes: Data) -> ItemRepresentation {
        ItemRepresentation(provision: .bytes(bytes))
    }

    /// Bytes written piece by piece, as `registerStreamRepresentation`.
    public static func stream(_ writer: @escaping ItemProvider.StreamHandler) -> ItemRepresentation {
        ItemRepresentation(provision: .stream(writer))
    }

    /// A file read-only or a sealed memfd handed over whole, as `registerFileRepresentation`.
    public static func file(_ loadHandler: @escaping ItemProvider.FileHandler) -> ItemRepresentation {
        ItemRepresentation(provision: .file(loadHandler))
    }
}

extension String: ItemProviderWriting {
    public var writableTypeIdentifiers: [String] { ["text/plain;charset=utf-8", "text/plain"] }

    /// UTF-8 under both names: a destination that ignores the charset still gets text it can
    /// read, since the Linux desktop's text/plain is UTF-8 in practice.
    public func itemRepresentation(forTypeIdentifier typeIdentifier: String) -> ItemRepresentation {
        .data(Data(utf8))
    }
}

extension Data: ItemProviderWriting {
    public var writableTypeIdentifiers: [String] { ["application/octet-stream"] }

    public func itemRepresentation(forTypeIdentifier typeIdentifier: String) -> ItemRepresentation {
        .data(self)
    }
}

extension URL: ItemProviderWriting {
    /// A file URL is offered as the file itself, typed by its name's extension from the
    /// shared-mime-info database (`application/octet-stream` when it says nothing). Any other
    /// URL is offered as a one-line `text/uri-list`, as desktop drags carry links.
    public var writableTypeIdentifiers: [String] {
        isFileURL ? [FileNameTypes.system.type(forFileName: lastPathComponent)] : ["text/uri-list"]
    }

    public var suggestedName: String { isFileURL ? lastPathComponent : "" }

    public func itemRepresentation(forTypeIdentifier typeIdentifier: String) -> ItemRepresentation {
        guard isFileURL else {
            // RFC 2483: each URI ends with CRLF.
            return .data(Data((absoluteString + "\r\n").utf8))
        }
        // Opened when loaded, not when registered: the destination gets the file as it is at
        // the drop, and no descriptor is held for a drag that is never dropped.
        let path = path
        return .file { try FileDescriptor.open(path, .readOnly, options: [.closeOnExec]) }
    }
}

/// File name → MIME type, from shared-mime-info's `globs2` (`weight:type:glob[:flags]`).
/// Only `*.extension` globs are used: they name nearly every type, and a name is all a URL
/// offers before the file is read.
final class FileNameTypes: Sendable {
    /// Lowercased extension → type, for globs matched without regard to case.
    private let folded: [String: String]
    /// Extension → type, for globs flagged `cs`, which the spec says match case-sensitively.
    private let exact: [String: String]

    init(globs2 text: String) {
        var folded: [String: (weight: Int, type: String)] = [:]
        var exact: [String: (weight: Int, type: String)] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            let fields = line.split(separator: ":", omittingEmptySubsequences: false)
            guard fields.count >= 3, let weight = Int(fields[0]), fields[2].hasPrefix("*.") else { continue }
            let pattern = fields[2].dropFirst(2)
            guard !pattern.isEmpty, !pattern.contains(where: { "*?[".contains($0) }),
                  (try? TypeIdentifier(String(fields[1]))) != nil else { continue }
            let caseSensitive = fields.count > 3 && fields[3].split(separator: ",").contains("cs")
            let entry = (weight: weight, type: String(fields[1]))
            // The heavier glob wins; between equal weights, the one listed first.
            if caseSensitive {
                if entry.weight > exact[String(pattern)]?.weight ?? -1 { exact[String(pattern)] = entry }
            } else {
                let key = pattern.lowercased()
                if entry.weight > folded[key]?.weight ?? -1 { folded[key] = entry }
            }
        }
        self.folded = folded.mapValues(\.type)
        self.exact = exact.mapValues(\.type)
    }

    /// Loaded on first use; empty when the database is missing, so every name then falls
    /// back to `application/octet-stream`.
    static let system = FileNameTypes(
        globs2: (try? String(contentsOfFile: "/usr/share/mime/globs2", encoding: .utf8)) ?? "")

    /// The type of a file called `name`. The longest matching extension wins, so
    /// `backup.tar.gz` is a compressed tar archive rather than just gzip data.
    func type(forFileName name: String) -> String {
        var rest = Substring(name)
        while let dot = rest.firstIndex(of: ".") {
            let suffix = rest[rest.index(after: dot)...]
            if let type = exact[String(suffix)] ?? folded[suffix.lowercased()] { return type }
            rest = suffix
        }
        return "application/octet-stream"
    }
}

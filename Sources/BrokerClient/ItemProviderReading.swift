import BrokerProtocol
import Foundation
import SystemCalls
import UniformTypes

/// A type a destination can make from a dropped item, like `NSItemProviderReading`: it lists
/// the types it reads and makes a value from one. See `DropSession.canLoadObjects(ofType:)`
/// and `loadObjects(ofType:)`.
public protocol ItemProviderReading: Sendable {
    /// The types this type reads, best first, as `ConformingItems` takes them: MIME types
    /// (`text/plain` also reads `text/x-python`), wildcards (`image/*`) or UTIs (`public.image`).
    static var readableTypeIdentifiers: [String] { get }

    /// How a representation should reach `object(…)`; `.data` unless the type says otherwise.
    static var readingDelivery: ItemReadingDelivery { get }

    /// Makes a value from a representation's bytes. `typeIdentifier` is the item's own type,
    /// the one loaded, not the readable identifier it matched.
    static func object(withItemProviderData data: Data, typeIdentifier: String) throws -> Self

    /// Makes a value from a temporary file holding the representation, for a type whose
    /// `readingDelivery` is `.temporaryFile`. The file is the value's to keep or remove; by
    /// default it is read into memory, removed, and given to `object(withItemProviderData:…)`.
    static func object(withTemporaryFile url: URL, typeIdentifier: String) throws -> Self
}

/// Where a representation goes before a value is made from it.
public enum ItemReadingDelivery: Sendable {
    /// Into memory, whole.
    case data
    /// Into a new file of its own in the temporary directory, named as the item suggests,
    /// as iOS's `loadFileRepresentation` hands over a temporary URL. A file representation's
    /// descriptor is copied there, a data representation's bytes are written there.
    case temporaryFile
}

extension ItemProviderReading {
    public static var readingDelivery: ItemReadingDelivery { .data }

    public static func object(withTemporaryFile url: URL, typeIdentifier: String) throws -> Self {
        defer { TemporaryItemFile.remove(url) }
        return try object(withItemProviderData: Data(contentsOf: url), typeIdentifier: typeIdentifier)
    }
}

/// Why a representation could not become a value.
struct ObjectReadingError: Error, CustomStringConvertible {
    let description: String
}

extension String: ItemProviderReading {
    public static var readableTypeIdentifiers: [String] { ["text/plain;charset=utf-8", "text/plain"] }

    /// Decoded by the type's `charset`; without one, as UTF-8, the desktop's default. Bytes
    /// that are not valid in the charset are refused rather than replaced, so the text
    /// returned is exactly the text sent.
    public static func object(withItemProviderData data: Data, typeIdentifier: String) throws -> String {
        let charset = typeIdentifier.split(separator: ";").dropFirst()
            .map { $0.trimmingCharacters(in: .whitespaces) }
            .first { $0.lowercased().hasPrefix("charset=") }
            .map { $0.dropFirst("charset=".count).trimmingCharacters(in: CharacterSet(charactersIn: "\"")).lowercased() }
        let encoding: String.Encoding
        switch charset {
        case nil, "utf-8", "utf8", "us-ascii": encoding = .utf8
        case "utf-16": encoding = .utf16
        case "utf-16le": encoding = .utf16LittleEndian
        case "utf-16be": encoding = .utf16BigEndian
        case "iso-8859-1", "latin1": encoding = .isoLatin1
        case let other?: throw ObjectReadingError(description: "The charset '\(other)' of '\(typeIdentifier)' is not one String reads")
        }
        guard let text = String(data: data, encoding: encoding) else {
            throw ObjectReadingError(description: "The \(data.count) bytes of '\(typeIdentifier)' are not valid \(charset ?? "utf-8")")
        }
        return text
    }
}

extension Data: ItemProviderReading {
    /// Every representation but a directory's is a byte stream, so shared-mime-info makes
    /// every type conform to this one: Data reads each item's best representation.
    public static var readableTypeIdentifiers: [String] { ["application/octet-stream"] }

    public static func object(withItemProviderData data: Data, typeIdentifier: String) throws -> Data {
        data
    }
}

extension URL: ItemProviderReading {
    /// Any type: a destination learns whether a representation travels as a file only when it
    /// loads it, so every representation can be had as a file.
    public static var readableTypeIdentifiers: [String] { ["*/*"] }

    public static var readingDelivery: ItemReadingDelivery { .temporaryFile }

    public static func object(withTemporaryFile url: URL, typeIdentifier: String) throws -> URL {
        url
    }

    /// Bytes already in memory become a temporary file too, so a URL read is always a file.
    public static func object(withItemProviderData data: Data, typeIdentifier: String) throws -> URL {
        let url = try TemporaryItemFile.makeURL(suggestedName: "")
        do {
            try data.write(to: url, options: .withoutOverwriting)
        } catch {
            TemporaryItemFile.remove(url)
            throw error
        }
        return url
    }
}

/// The temporary files `.temporaryFile` delivery makes: each in a new directory of its own,
/// so the suggested name can be kept however many items share it.
enum TemporaryItemFile {
    /// The path for a new file, in a directory just made for it, private to this user as the
    /// dropped data may be.
    static func makeURL(suggestedName: String) throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false,
                                                attributes: [.posixPermissions: 0o700])
        return directory.appendingPathComponent(fileName(suggestedName))
    }

    /// The broker already strips separators and control characters from suggested names;
    /// what remains may still be empty, mean a directory, or exceed what a file system takes.
    static func fileName(_ suggestedName: String) -> String {
        let name = suggestedName.filter { $0 != "/" && $0 != "\0" }
        return name.isEmpty || name == "." || name == ".." || name.utf8.count > 255 ? "item" : name
    }

    /// Removes the file and the directory made for it.
    static func remove(_ url: URL) {
        try? FileManager.default.removeItem(at: url)
        if url.deletingLastPathComponent().lastPathComponent.hasPrefix("dragbroker-") {
            try? FileManager.default.removeItem(at: url.deletingLastPathComponent())
        }
    }
}

/// Which representation of each item a reading type loads.
enum ObjectSelection {
    /// Maps each item that can be read to the listed type to load, by the broker's one
    /// matching rule (`MimeDatabase.select`): the closest match first, so String reads an
    /// item's text/plain rather than the text/html listed before it, though HTML is text;
    /// then the reader's order, then the item's. Loading the listed type itself makes the
    /// broker serve exactly that representation.
    static func representations(readable: [String], items: [VisibleItem]) -> [Int: String] {
        let patterns = readable.compactMap { try? TypePattern($0) }
        var chosen: [Int: String] = [:]
        for (index, item) in items.enumerated() {
            if let position = MimeDatabase.system.select(among: item.typeIdentifiers, for: patterns) {
                chosen[index] = item.typeIdentifiers[position]
            }
        }
        return chosen
    }
}

import BrokerProtocol
import Foundation
import SystemPackage
import UniformTypes

/// A promise of data in one or more representations, like `NSItemProvider`: nothing is
/// produced until a destination that performed the drop asks for one type.
public final class ItemProvider: Sendable {
    public typealias LoadHandler = @Sendable () async throws -> Data
    public typealias StreamHandler = @Sendable (DataWriter) async throws -> Void
    public typealias FileHandler = @Sendable () async throws -> FileDescriptor

    /// How a registered representation produces its bytes.
    enum Provision: Sendable {
        case data(LoadHandler)
        case stream(StreamHandler)
        case file(FileHandler)
    }

    public let suggestedName: String
    public let preferredPresentationSize: (width: Double, height: Double)
    private let registered = Locked<[(RepresentationDescriptor, Provision)]>([])

    public init(suggestedName: String = "", preferredPresentationSize: (width: Double, height: Double) = (0, 0)) {
        self.suggestedName = suggestedName
        self.preferredPresentationSize = preferredPresentationSize
    }

    /// Registers a representation, best first. `loadHandler` runs only when the drop
    /// destination loads this type, once per load.
    public func registerDataRepresentation(forTypeIdentifier typeIdentifier: String, visibility: Visibility = .all,
                                           loadHandler: @escaping LoadHandler) {
        register(typeIdentifier, visibility, .data, .data(loadHandler))
    }

    /// Registers a representation written piece by piece, for data that is large or slow to
    /// produce: the destination starts receiving before the writer finishes.
    public func registerStreamRepresentation(forTypeIdentifier typeIdentifier: String, visibility: Visibility = .all,
                                             writer: @escaping StreamHandler) {
        register(typeIdentifier, visibility, .data, .stream(writer))
    }

    /// Registers a file representation: the handler returns a regular file opened read-only,
    /// or a memfd sealed against writing, growing and shrinking (see `SealedMemoryFile`). The
    /// destination receives the descriptor itself: no byte is copied. The library closes it.
    public func registerFileRepresentation(forTypeIdentifier typeIdentifier: String, visibility: Visibility = .all,
                                           loadHandler: @escaping FileHandler) {
        register(typeIdentifier, visibility, .file, .file(loadHandler))
    }

    private func register(_ typeIdentifier: String, _ visibility: Visibility, _ kind: RepresentationKind, _ provision: Provision) {
        // The broker asks for canonical MIME types: register under the same name it will use.
        // An invalid identifier is kept as given, for the broker to refuse with its reason.
        let type = (try? TypeIdentifier(typeIdentifier))?.mime ?? typeIdentifier
        registered.withLock {
            $0.append((RepresentationDescriptor(typeIdentifier: type, visibility: visibility, kind: kind), provision))
        }
    }

    public var registeredTypeIdentifiers: [String] {
        registered.withLock { $0.map(\.0.typeIdentifier) }
    }

    var descriptor: ItemDescriptor {
        ItemDescriptor(suggestedName: suggestedName, preferredWidth: preferredPresentationSize.width,
                       preferredHeight: preferredPresentationSize.height,
                       representations: registered.withLock { $0.map(\.0) })
    }

    /// A data representation's bytes, from its load handler now: what a source offers on the
    /// clipboard in the clear (`PasteboardEntry.clearOffers`). Nil for a type not registered, or
    /// registered as a stream or a file.
    public func loadDataRepresentation(forTypeIdentifier typeIdentifier: String) async throws -> Data? {
        let type = (try? TypeIdentifier(typeIdentifier))?.mime ?? typeIdentifier
        guard case .data(let handler) = provision(for: type) else { return nil }
        return try await handler()
    }

    func provision(for typeIdentifier: String) -> Provision? {
        registered.withLock { $0.first { $0.0.typeIdentifier == typeIdentifier }?.1 }
    }
}

/// One item of a drag: its provider, plus a local object that never leaves this process.
public struct DragItem: Sendable {
    public let itemProvider: ItemProvider
    public var localObject: (any Sendable)?

    public init(itemProvider: ItemProvider, localObject: (any Sendable)? = nil) {
        self.itemProvider = itemProvider
        self.localObject = localObject
    }
}

extension ItemProvider {
    /// A provider for one value, named as the value suggests (a file URL by its file name).
    public convenience init(object: some ItemProviderWriting, visibility: Visibility = .all) {
        self.init(suggestedName: object.suggestedName)
        registerObject(object, visibility: visibility)
    }

    /// Registers every representation `object` writes, in its order, after any registered
    /// before. Nothing is produced until a destination loads one of them.
    public func registerObject(_ object: some ItemProviderWriting, visibility: Visibility = .all) {
        for typeIdentifier in object.writableTypeIdentifiers {
            let provision = object.itemRepresentation(forTypeIdentifier: typeIdentifier).provision
            let kind: RepresentationKind
            switch provision {
            case .data, .stream: kind = .data
            case .file: kind = .file
            }
            register(typeIdentifier, visibility, kind, provision)
        }
    }
}

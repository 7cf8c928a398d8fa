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
        /// Bytes the app already holds: no handler runs, and when they fit the broker's pipe
        /// they are written and answered on the connection's loop, with no thread hop.
        case bytes(Data)
        /// A file the app already holds open: handed over on the loop, no handler run.
        case heldFile(HeldFile)

        var kind: RepresentationKind {
            switch self {
            case .data, .stream, .bytes: .data
            case .file, .heldFile: .file
            }
        }
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
        register(typeIdentifier, visibility, .data(loadHandler))
    }

    /// Registers a representation whose bytes the app already holds, as
    /// `NSItemProvider(item:typeIdentifier:)` does: no handler runs when it is loaded, and
    /// bytes that fit the broker's pipe at once are written on the connection's own thread,
    /// with no hop to the concurrency pool and back.
    public func registerDataRepresentation(forTypeIdentifier typeIdentifier: String, visibility: Visibility = .all, data: Data) {
        register(typeIdentifier, visibility, .bytes(data))
    }

    /// Registers a representation written piece by piece, for data that is large or slow to
    /// produce: the destination starts receiving before the writer finishes. The writer runs
    /// on a thread of its own, where `DataWriter.write` waits for the destination to take the
    /// bytes; what it awaits elsewhere (an actor) runs there as usual. Child tasks it starts
    /// share that thread: parallel work belongs under
    /// `withTaskExecutorPreference(globalConcurrentExecutor)`.
    public func registerStreamRepresentation(forTypeIdentifier typeIdentifier: String, visibility: Visibility = .all,
                                             writer: @escaping StreamHandler) {
        register(typeIdentifier, visibility, .stream(writer))
    }

    /// Registers a file representation: the handler returns a regular file opened read-only,
    /// or a memfd sealed against writing, growing and shrinking (see `SealedMemoryFile`). The
    /// destination receives the descriptor itself: no byte is copied. The library closes it.
    public func registerFileRepresentation(forTypeIdentifier typeIdentifier: String, visibility: Visibility = .all,
                                           loadHandler: @escaping FileHandler) {
        register(typeIdentifier, visibility, .file(loadHandler))
    }

    /// Registers a file the app already holds open: a regular file opened read-only, or a
    /// sealed memfd. The provider owns `file` from now on and closes it when it is released;
    /// each load hands the destination a duplicate, on the connection's own thread, with no
    /// handler to run.
    public func registerFileRepresentation(forTypeIdentifier typeIdentifier: String, visibility: Visibility = .all,
                                           file: FileDescriptor) {
        register(typeIdentifier, visibility, .heldFile(HeldFile(file)))
    }

    private func register(_ typeIdentifier: String, _ visibility: Visibility, _ provision: Provision) {
        // The broker asks for canonical MIME types: register under the same name it will use.
        // An invalid identifier is kept as given, for the broker to refuse with its reason.
        let type = (try? TypeIdentifier(typeIdentifier))?.mime ?? typeIdentifier
        registered.withLock {
            $0.append((RepresentationDescriptor(typeIdentifier: type, visibility: visibility, kind: provision.kind), provision))
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

    /// A data representation's bytes, from its load handler now or as registered: what a
    /// source offers on the clipboard in the clear (`PasteboardEntry.clearOffers`). Nil for a
    /// type not registered, or registered as a stream or a file.
    public func loadDataRepresentation(forTypeIdentifier typeIdentifier: String) async throws -> Data? {
        let type = (try? TypeIdentifier(typeIdentifier))?.mime ?? typeIdentifier
        switch provision(for: type) {
        case .data(let handler): return try await handler()
        case .bytes(let data): return data
        case .stream, .file, .heldFile, nil: return nil
        }
    }

    func provision(for typeIdentifier: String) -> Provision? {
        registered.withLock { $0.first { $0.0.typeIdentifier == typeIdentifier }?.1 }
    }
}

/// A descriptor a provider holds for as long as it lives, lent to each load.
final class HeldFile: Sendable {
    let descriptor: FileDescriptor

    init(_ descriptor: FileDescriptor) {
        self.descriptor = descriptor
    }

    deinit {
        descriptor.closeQuietly()
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
            register(typeIdentifier, visibility, object.itemRepresentation(forTypeIdentifier: typeIdentifier).provision)
        }
    }
}

import BrokerProtocol
import Foundation
import UniformTypes

/// A promise of data in one or more representations, like `NSItemProvider`: nothing is
/// produced until a destination that performed the drop asks for one type.
public final class ItemProvider: Sendable {
    public typealias LoadHandler = @Sendable () async throws -> Data

    public let suggestedName: String
    public let preferredPresentationSize: (width: Double, height: Double)
    private let registered = Locked<[(RepresentationDescriptor, LoadHandler)]>([])

    public init(suggestedName: String = "", preferredPresentationSize: (width: Double, height: Double) = (0, 0)) {
        self.suggestedName = suggestedName
        self.preferredPresentationSize = preferredPresentationSize
    }

    /// Registers a representation, best first. `loadHandler` runs only when the drop
    /// destination loads this type, once per load.
    public func registerDataRepresentation(forTypeIdentifier typeIdentifier: String, visibility: Visibility = .all,
                                           loadHandler: @escaping LoadHandler) {
        // The broker asks for canonical MIME types: register under the same name it will use.
        // An invalid identifier is kept as given, for the broker to refuse with its reason.
        let type = (try? TypeIdentifier(typeIdentifier))?.mime ?? typeIdentifier
        registered.withLock {
            $0.append((RepresentationDescriptor(typeIdentifier: type, visibility: visibility), loadHandler))
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

    func handler(for typeIdentifier: String) -> LoadHandler? {
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

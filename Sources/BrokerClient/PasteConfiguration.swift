import BrokerProtocol

/// The types an app accepts, whether they come as a drop or as a paste: iOS's
/// `UIPasteConfiguration`. One declaration answers a drop target's "can handle" and a Paste
/// menu item's, before anything is loaded, and picks what each item is loaded as.
public struct PasteConfiguration: Sendable, Equatable {
    /// MIME types, wildcards (`image/*`) or UTIs (`public.image`), most wanted first.
    public var acceptableTypeIdentifiers: [String]

    public init(acceptableTypeIdentifiers: [String]) {
        self.acceptableTypeIdentifiers = acceptableTypeIdentifiers
    }

    /// One item this configuration takes: its number as the destination sees it, and the
    /// listed type to load it as (by the broker's one matching rule, the closest match).
    public struct AcceptedItem: Sendable, Equatable {
        public let index: Int
        public let item: VisibleItem
        public let typeIdentifier: String
    }

    /// The items of `items` (what `DropSession.items()` answered) that it takes, in order.
    public func accepted(_ items: [VisibleItem]) -> [AcceptedItem] {
        let chosen = ObjectSelection.representations(readable: acceptableTypeIdentifiers, items: items)
        return items.enumerated().compactMap { index, item in
            chosen[index].map { AcceptedItem(index: index, item: item, typeIdentifier: $0) }
        }
    }

    /// Whether a drag or a pasteboard entry offers anything this configuration takes; the
    /// source is asked nothing.
    public func canHandle(_ session: DropSession) async throws(BrokerError) -> Bool {
        !accepted(try await session.items()).isEmpty
    }
}

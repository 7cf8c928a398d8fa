import BrokerProtocol
import Foundation
import UniformTypes

/// Items as a client sends them, checked before any session holds them.
enum Items {
    /// Validates items from a client: every type a MIME type or known UTI (stored canonical),
    /// names sanitised, counts and lengths within the limits.
    static func normalize(_ items: [ItemDescriptor], limits: Limits) throws(BrokerError) -> [ItemDescriptor] {
        guard !items.isEmpty else { throw .invalidArgument("A drag needs at least one item") }
        var normalized: [ItemDescriptor] = []
        for (index, item) in items.enumerated() {
            guard !item.representations.isEmpty else {
                throw .invalidArgument("Item \(index) has no representation")
            }
            guard item.representations.count <= limits.representationsPerItem else {
                throw .limitExceeded("Item \(index) has \(item.representations.count) representations (limit \(limits.representationsPerItem))")
            }
            guard item.preferredWidth.isFinite, item.preferredHeight.isFinite, item.preferredWidth >= 0, item.preferredHeight >= 0 else {
                throw .invalidArgument("Item \(index): the preferred size must be finite and not negative")
            }
            var representations: [RepresentationDescriptor] = []
            for representation in item.representations {
                let raw = representation.typeIdentifier
                guard raw.utf8.count <= limits.maxStringLength else {
                    throw .limitExceeded("Item \(index): a type identifier is longer than \(limits.maxStringLength) bytes")
                }
                let type: TypeIdentifier
                do {
                    type = try TypeIdentifier(raw)
                } catch {
                    throw .invalidArgument("Item \(index): \(error.message)")
                }
                guard !representations.contains(where: { $0.typeIdentifier == type.mime }) else {
                    throw .invalidArgument("Item \(index) declares the type '\(type.mime)' twice")
                }
                representations.append(RepresentationDescriptor(typeIdentifier: type.mime, visibility: representation.visibility, kind: representation.kind))
            }
            normalized.append(ItemDescriptor(
                suggestedName: SuggestedName.sanitize(item.suggestedName, maxBytes: limits.maxStringLength),
                preferredWidth: item.preferredWidth, preferredHeight: item.preferredHeight, representations: representations))
        }
        return normalized
    }
}

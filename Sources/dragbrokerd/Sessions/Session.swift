import BrokerProtocol
import BusKit
import Foundation

/// A live drag session: the model, apart from its bus face (`SessionObject`).
final class Session {
    enum State: String {
        /// Dragging: destinations may enter, propose and exit.
        case active
        /// A destination performed the drop; it alone may load.
        case dropped
        /// The drop destination concluded; loads in flight finish, no new ones start.
        case concluded
    }

    /// A destination that presented the token.
    struct Destination {
        var identity: AppIdentity
        var proposal: DropOperation = .cancel
        var allowed: DropOperation = .cancel
    }

    let id: String
    let path: String
    let token: [UInt8]
    let source: AppIdentity
    let providerPath: String
    let options: SessionOptions
    let createdAt: Date
    var items: [ItemDescriptor]
    var state: State = .active
    var operation: DropOperation = .cancel
    var destinations: [String: Destination] = [:]
    /// The destination the drag is currently over (entered and not exited).
    var current: String?
    /// The destination that performed the drop.
    var dropDestination: String?
    var loads: [UInt32: Load] = [:]
    var nextLoadID: UInt32 = 1
    /// Bytes of loads already finished, for the session's aggregate progress.
    var finishedBytes: UInt64 = 0
    var object: SessionObject?

    init(id: String, token: [UInt8], source: AppIdentity, providerPath: String, items: [ItemDescriptor],
         options: SessionOptions) {
        self.id = id
        self.path = BrokerNames.sessionPath(id: id)
        self.token = token
        self.source = source
        self.providerPath = providerPath
        self.items = items
        self.options = options
        self.createdAt = Date()
    }

    /// Compares in time independent of where the first difference is.
    func matches(token candidate: [UInt8]) -> Bool {
        guard candidate.count == token.count else { return false }
        var difference: UInt8 = 0
        for i in 0..<token.count { difference |= token[i] ^ candidate[i] }
        return difference == 0
    }

    /// Whether `identity` may know the session exists: a restricted session exists only for
    /// its own app.
    func isVisible(to identity: AppIdentity) -> Bool {
        !options.restrictedToApp || identity.isSameApp(as: source)
    }

    /// The items as `identity` may see them. A representation it may not see does not exist
    /// for it, and neither does an item with none left; `index` is the item's real index.
    func visibleItems(for identity: AppIdentity) -> [(index: Int, item: VisibleItem)] {
        items.enumerated().compactMap { index, item in
            let types = item.representations.filter { isVisible($0, to: identity) }.map(\.typeIdentifier)
            if types.isEmpty { return nil }
            return (index, VisibleItem(suggestedName: item.suggestedName, preferredWidth: item.preferredWidth,
                                       preferredHeight: item.preferredHeight, typeIdentifiers: types))
        }
    }

    func isVisible(_ representation: RepresentationDescriptor, to identity: AppIdentity) -> Bool {
        switch representation.visibility {
        case .all: true
        case .app: identity.isSameApp(as: source)
        case .team: identity.isSameTeam(as: source)
        }
    }

    /// The operation the broker will allow for `proposal` by `destination`: a move is
    /// allowed only within the source app and only when the source allows it; otherwise
    /// the data is copied.
    func allowedOperation(for proposal: DropOperation, by destination: AppIdentity) -> DropOperation {
        switch proposal {
        case .cancel, .forbidden, .copy: proposal
        case .move: (options.allowsMove && destination.isSameApp(as: source)) ? .move : .copy
        }
    }
}

/// One load in flight: a provider call, and a pipe proxy for data or a descriptor for a file.
final class Load {
    let id: UInt32
    let item: UInt32
    let typeIdentifier: String
    let kind: RepresentationKind
    let destination: AppIdentity
    let startedAt = Date()
    var proxy: PipeProxy?
    var providerCall: Slot?
    var providerAnswered = false
    var dataEnded = false
    /// The size the source announced, if it did.
    var expected: UInt64?
    /// The size of a handed-over file.
    var fileSize: UInt64 = 0
    var deadline: LoopTimer?
    /// Monotonic microseconds of the last byte moved (or the start), for the stall deadline.
    var lastProgressAt: UInt64
    var lastReportAt: UInt64 = 0
    /// A file load's waiting `Load` call, answered with the error if the load ends before the file arrives.
    var onAbandoned: ((BrokerError) -> Void)?

    init(id: UInt32, item: UInt32, typeIdentifier: String, kind: RepresentationKind, destination: AppIdentity, now: UInt64) {
        self.id = id
        self.item = item
        self.typeIdentifier = typeIdentifier
        self.kind = kind
        self.destination = destination
        self.lastProgressAt = now
    }

    var bytes: UInt64 { proxy?.bytes ?? fileSize }
}

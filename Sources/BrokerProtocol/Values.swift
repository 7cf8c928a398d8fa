import BusKit

/// Who may see a representation, as iOS's `NSItemProviderRepresentationVisibility`.
public enum Visibility: String, CaseIterable, Sendable, Codable {
    /// Only the app that began the drag.
    case app
    /// Apps of the same team as the source.
    case team
    /// Every app.
    case all
}

/// A drop operation, as `UIDropOperation`.
public enum DropOperation: String, CaseIterable, Sendable, Codable {
    case cancel, forbidden, copy, move
}

/// How a representation's bytes travel.
public enum RepresentationKind: String, CaseIterable, Sendable, Codable {
    /// A stream: the source writes into a pipe, the broker splices it to the destination.
    case data
    /// A file: the source hands over a read-only regular file or a sealed memfd, and the
    /// destination receives that descriptor itself. No byte is copied.
    case file
}

/// One lazily promised representation: its type, who may see it, how it travels. Never the bytes.
public struct RepresentationDescriptor: Sendable, Equatable, Codable {
    public var typeIdentifier: String
    public var visibility: Visibility
    public var kind: RepresentationKind

    public init(typeIdentifier: String, visibility: Visibility, kind: RepresentationKind = .data) {
        self.typeIdentifier = typeIdentifier
        self.visibility = visibility
        self.kind = kind
    }
}

/// A drag item as the source declares it: metadata plus ordered representations, best first.
public struct ItemDescriptor: Sendable, Equatable, Codable {
    public var suggestedName: String
    public var preferredWidth: Double
    public var preferredHeight: Double
    public var representations: [RepresentationDescriptor]

    public init(suggestedName: String = "", preferredWidth: Double = 0, preferredHeight: Double = 0,
                representations: [RepresentationDescriptor]) {
        self.suggestedName = suggestedName
        self.preferredWidth = preferredWidth
        self.preferredHeight = preferredHeight
        self.representations = representations
    }

    /// D-Bus signature of one item.
    public static let signature = "(sdda(sss))"

    public func encode(to m: Message) throws(BusError) {
        try m.openContainer("r", "sdda(sss)")
        try m.append(suggestedName)
        try m.append(preferredWidth)
        try m.append(preferredHeight)
        try m.openContainer("a", "(sss)")
        for representation in representations {
            try m.openContainer("r", "sss")
            try m.append(representation.typeIdentifier)
            try m.append(representation.visibility.rawValue)
            try m.append(representation.kind.rawValue)
            try m.closeContainer()
        }
        try m.closeContainer()
        try m.closeContainer()
    }

    /// Decodes one item. Unknown visibilities are refused with the offending value.
    public static func decode(from m: Message) throws(BrokerError) -> ItemDescriptor? {
        do {
            guard try m.enterContainer("r", "sdda(sss)") else { return nil }
            let name = try m.readString()
            let width = try m.readDouble()
            let height = try m.readDouble()
            var representations: [RepresentationDescriptor] = []
            _ = try m.enterContainer("a", "(sss)")
            while try m.enterContainer("r", "sss") {
                let type = try m.readString()
                let visibilityName = try m.readString()
                let kindName = try m.readString()
                try m.exitContainer()
                guard let visibility = Visibility(rawValue: visibilityName) else {
                    throw BrokerError.invalidArgument("Unknown visibility '\(visibilityName)' for type '\(type)': expected app, team or all")
                }
                guard let kind = RepresentationKind(rawValue: kindName) else {
                    throw BrokerError.invalidArgument("Unknown kind '\(kindName)' for type '\(type)': expected data or file")
                }
                representations.append(RepresentationDescriptor(typeIdentifier: type, visibility: visibility, kind: kind))
            }
            try m.exitContainer()
            try m.exitContainer()
            return ItemDescriptor(suggestedName: name, preferredWidth: width, preferredHeight: height, representations: representations)
        } catch let error as BrokerError {
            throw error
        } catch {
            throw BrokerError.invalidArgument("Malformed item: \(error)")
        }
    }
}

/// What a destination may learn about an item before the drop: only the types visible to it.
public struct VisibleItem: Sendable, Equatable, Codable {
    public var suggestedName: String
    public var preferredWidth: Double
    public var preferredHeight: Double
    public var typeIdentifiers: [String]

    public init(suggestedName: String, preferredWidth: Double, preferredHeight: Double, typeIdentifiers: [String]) {
        self.suggestedName = suggestedName
        self.preferredWidth = preferredWidth
        self.preferredHeight = preferredHeight
        self.typeIdentifiers = typeIdentifiers
    }

    public static let signature = "(sddas)"

    public func encode(to m: Message) throws(BusError) {
        try m.openContainer("r", "sddas")
        try m.append(suggestedName)
        try m.append(preferredWidth)
        try m.append(preferredHeight)
        try m.openContainer("a", "s")
        for type in typeIdentifiers { try m.append(type) }
        try m.closeContainer()
        try m.closeContainer()
    }

    public static func decode(from m: Message) throws(BusError) -> VisibleItem? {
        guard try m.enterContainer("r", "sddas") else { return nil }
        let name = try m.readString()
        let width = try m.readDouble()
        let height = try m.readDouble()
        let types = try m.readStrings()
        try m.exitContainer()
        return VisibleItem(suggestedName: name, preferredWidth: width, preferredHeight: height, typeIdentifiers: types)
    }
}

/// Options of `BeginSession`, carried as `a{sv}` so new ones can be added compatibly.
public struct SessionOptions: Sendable, Equatable, Codable {
    /// `RestrictedToApp`: the session is invisible to every other app.
    public var restrictedToApp: Bool
    /// `AllowsMove`: a move within the source app is allowed.
    public var allowsMove: Bool

    public init(restrictedToApp: Bool = false, allowsMove: Bool = false) {
        self.restrictedToApp = restrictedToApp
        self.allowsMove = allowsMove
    }

    public func encode(to m: Message) throws(BusError) {
        try m.append(variantDictionary: [("RestrictedToApp", .bool(restrictedToApp)), ("AllowsMove", .bool(allowsMove))])
    }

    /// Unknown keys and wrongly typed values are refused, so a typo never silently weakens a session.
    public static func decode(from m: Message) throws(BrokerError) -> SessionOptions {
        var options = SessionOptions()
        for (key, value) in try readOptions(from: m) {
            guard let flag = value.bool else {
                throw BrokerError.invalidArgument("Option '\(key)' must be a boolean (variant of type 'b')")
            }
            switch key {
            case "RestrictedToApp": options.restrictedToApp = flag
            case "AllowsMove": options.allowsMove = flag
            default: throw BrokerError.invalidArgument("Unknown session option '\(key)': expected RestrictedToApp or AllowsMove")
            }
        }
        return options
    }
}

/// The `a{sv}` options `BeginSession` and `Copy` take, by key in order, so that a refusal
/// names the same key whatever order the caller sent them in.
private func readOptions(from m: Message) throws(BrokerError) -> [(key: String, value: VariantValue)] {
    do {
        return try m.readVariantDictionary().sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    } catch {
        throw BrokerError.invalidArgument("Malformed options: \(error)")
    }
}

/// What a source asks of its pasteboard entry (`Copy`), after iOS's
/// `setItemProviders(_:localOnly:expirationDate:)`.
public struct PasteOptions: Sendable, Equatable, Codable {
    /// `RestrictedToApp`: only the source's own app may paste it (`localOnly`).
    public var restrictedToApp: Bool
    /// `ExpirationSec`: seconds the entry lives; nil for the policy's default.
    public var expirationSec: UInt32?

    public init(restrictedToApp: Bool = false, expirationSec: UInt32? = nil) {
        self.restrictedToApp = restrictedToApp
        self.expirationSec = expirationSec
    }

    public func encode(to m: Message) throws(BusError) {
        try m.append(variantDictionary: [("RestrictedToApp", .bool(restrictedToApp))] + (expirationSec.map { [("ExpirationSec", .uint32($0))] } ?? []))
    }

    /// Unknown keys and wrongly typed values are refused, as for a drag's options.
    public static func decode(from m: Message) throws(BrokerError) -> PasteOptions {
        var options = PasteOptions()
        for (key, value) in try readOptions(from: m) {
            switch key {
            case "RestrictedToApp":
                guard let flag = value.bool else {
                    throw BrokerError.invalidArgument("Option 'RestrictedToApp' must be a boolean (variant of type 'b')")
                }
                options.restrictedToApp = flag
            case "ExpirationSec":
                guard let seconds = value.uint32, seconds > 0 else {
                    throw BrokerError.invalidArgument("Option 'ExpirationSec' must be a positive number of seconds (variant of type 'u')")
                }
                options.expirationSec = seconds
            default:
                throw BrokerError.invalidArgument("Unknown pasteboard option '\(key)': expected RestrictedToApp or ExpirationSec")
            }
        }
        return options
    }
}

/// One line of `ListSessions`: what an operator may see of a live session.
public struct SessionSummary: Sendable, Equatable, Codable {
    public var id: String
    public var path: String
    public var sourceApp: String
    public var state: String
    public var itemCount: UInt32
    /// Microseconds since the Unix epoch.
    public var createdAt: UInt64

    public init(id: String, path: String, sourceApp: String, state: String, itemCount: UInt32, createdAt: UInt64) {
        self.id = id
        self.path = path
        self.sourceApp = sourceApp
        self.state = state
        self.itemCount = itemCount
        self.createdAt = createdAt
    }

    public static let signature = "(sossut)"

    public func encode(to m: Message) throws(BusError) {
        try m.openContainer("r", "sossut")
        try m.append(id)
        try m.append(objectPath: path)
        try m.append(sourceApp)
        try m.append(state)
        try m.append(itemCount)
        try m.append(createdAt)
        try m.closeContainer()
    }

    /// What the session is: "copy" for an entry on the pasteboard (state `copied`), "paste" for
    /// one paste of an entry (whose ID is the entry's, "_" and a number), else "drag".
    public var kind: String {
        state == "copied" ? "copy" : id.contains("_") ? "paste" : "drag"
    }

    public static func decode(from m: Message) throws(BusError) -> SessionSummary? {
        guard try m.enterContainer("r", "sossut") else { return nil }
        let summary = SessionSummary(id: try m.readString(), path: try m.readObjectPath(), sourceApp: try m.readString(),
                                     state: try m.readString(), itemCount: try m.readUInt32(), createdAt: try m.readUInt64())
        try m.exitContainer()
        return summary
    }
}

/// What the daemon holds now, and for whom (`GetUsage`, `dragctl stats`): what each bucket
/// (an app, or the unsandboxed apps of one user together) uses of its share.
public struct UsageReport: Sendable, Equatable, Codable {
    public struct Bucket: Sendable, Equatable, Codable {
        /// An app ID, or "the unsandboxed apps of uid N".
        public var name: String
        public var sessions: UInt32
        public var loads: UInt32
        /// Descriptor threads in calls its files' file system has not answered yet.
        public var descriptorThreads: UInt32
        /// Microseconds the oldest of those threads has waited.
        public var oldestThreadWait: UInt64

        public init(name: String, sessions: UInt32, loads: UInt32, descriptorThreads: UInt32, oldestThreadWait: UInt64) {
            self.name = name
            self.sessions = sessions
            self.loads = loads
            self.descriptorThreads = descriptorThreads
            self.oldestThreadWait = oldestThreadWait
        }
    }

    public var sessions: UInt32
    public var loads: UInt32
    /// Descriptor threads made so far, and those busy now.
    public var threadsMade: UInt32
    public var threadsBusy: UInt32
    public var buckets: [Bucket]

    public init(sessions: UInt32, loads: UInt32, threadsMade: UInt32, threadsBusy: UInt32, buckets: [Bucket]) {
        self.sessions = sessions
        self.loads = loads
        self.threadsMade = threadsMade
        self.threadsBusy = threadsBusy
        self.buckets = buckets
    }

    public static let totalsSignature = "(uuuu)"
    public static let bucketSignature = "(suuut)"

    /// The two out arguments of `GetUsage`.
    public func encode(to m: Message) throws(BusError) {
        try m.openContainer("r", "uuuu")
        for value in [sessions, loads, threadsMade, threadsBusy] { try m.append(value) }
        try m.closeContainer()
        try m.openContainer("a", Self.bucketSignature)
        for bucket in buckets {
            try m.openContainer("r", "suuut")
            try m.append(bucket.name)
            try m.append(bucket.sessions)
            try m.append(bucket.loads)
            try m.append(bucket.descriptorThreads)
            try m.append(bucket.oldestThreadWait)
            try m.closeContainer()
        }
        try m.closeContainer()
    }

    public static func decode(from m: Message) throws(BusError) -> UsageReport {
        _ = try m.enterContainer("r", "uuuu")
        var report = UsageReport(sessions: try m.readUInt32(), loads: try m.readUInt32(), threadsMade: try m.readUInt32(),
                                 threadsBusy: try m.readUInt32(), buckets: [])
        try m.exitContainer()
        _ = try m.enterContainer("a", bucketSignature)
        while try m.enterContainer("r", "suuut") {
            report.buckets.append(Bucket(name: try m.readString(), sessions: try m.readUInt32(), loads: try m.readUInt32(),
                                         descriptorThreads: try m.readUInt32(), oldestThreadWait: try m.readUInt64()))
            try m.exitContainer()
        }
        try m.exitContainer()
        return report
    }
}

/// What an operator sees of one session (`dragctl show-session`).
public struct SessionDetails: Sendable, Equatable, Codable {
    public struct LoadState: Sendable, Equatable, Codable {
        public var id: UInt32
        public var typeIdentifier: String
        public var destinationApp: String
        public var bytes: UInt64
        /// 0 when the source did not announce a size.
        public var expected: UInt64
        public init(id: UInt32, typeIdentifier: String, destinationApp: String, bytes: UInt64, expected: UInt64) {
            self.id = id
            self.typeIdentifier = typeIdentifier
            self.destinationApp = destinationApp
            self.bytes = bytes
            self.expected = expected
        }
    }

    public var id: String
    public var state: String
    public var operation: String
    public var sourceApp: String
    public var sourceTeam: String
    public var restricted: Bool
    /// The app the drag is over, or that performed the drop; empty when none.
    public var destinationApp: String
    public var items: [ItemDescriptor]
    public var loads: [LoadState]

    public init(id: String, state: String, operation: String, sourceApp: String, sourceTeam: String, restricted: Bool,
                destinationApp: String, items: [ItemDescriptor], loads: [LoadState]) {
        self.id = id
        self.state = state
        self.operation = operation
        self.sourceApp = sourceApp
        self.sourceTeam = sourceTeam
        self.restricted = restricted
        self.destinationApp = destinationApp
        self.items = items
        self.loads = loads
    }

    public static let signature = "(ssssssba\(ItemDescriptor.signature)a(usstt))"

    public func encode(to m: Message) throws(BusError) {
        try m.openContainer("r", String(Self.signature.dropFirst().dropLast()))
        for text in [id, state, operation, sourceApp, sourceTeam, destinationApp] { try m.append(text) }
        try m.append(restricted)
        try m.openContainer("a", ItemDescriptor.signature)
        for item in items { try item.encode(to: m) }
        try m.closeContainer()
        try m.openContainer("a", "(usstt)")
        for load in loads {
            try m.openContainer("r", "usstt")
            try m.append(load.id)
            try m.append(load.typeIdentifier)
            try m.append(load.destinationApp)
            try m.append(load.bytes)
            try m.append(load.expected)
            try m.closeContainer()
        }
        try m.closeContainer()
        try m.closeContainer()
    }

    public static func decode(from m: Message) throws(BusError) -> SessionDetails {
        _ = try m.enterContainer("r", String(signature.dropFirst().dropLast()))
        let texts = try (0..<6).map { _ throws(BusError) in try m.readString() }
        let restricted = try m.readBool()
        var items: [ItemDescriptor] = []
        _ = try m.enterContainer("a", ItemDescriptor.signature)
        do {
            while let item = try ItemDescriptor.decode(from: m) { items.append(item) }
        } catch {
            throw BusError.invalidArguments(error.message)
        }
        try m.exitContainer()
        var loads: [LoadState] = []
        _ = try m.enterContainer("a", "(usstt)")
        while try m.enterContainer("r", "usstt") {
            loads.append(LoadState(id: try m.readUInt32(), typeIdentifier: try m.readString(), destinationApp: try m.readString(),
                                   bytes: try m.readUInt64(), expected: try m.readUInt64()))
            try m.exitContainer()
        }
        try m.exitContainer()
        try m.exitContainer()
        return SessionDetails(id: texts[0], state: texts[1], operation: texts[2], sourceApp: texts[3], sourceTeam: texts[4],
                              restricted: restricted, destinationApp: texts[5], items: items, loads: loads)
    }
}

/// What a `MonitorEvent` reports: its `event` argument.
public enum MonitorEventKind: String, Sendable, CaseIterable {
    case begin, enter, update, exit, drop, load, progress, loaded, end
    /// An entry was put on the pasteboard; a paste of one began.
    case copy, paste
}

/// One live event, as `dragctl monitor` shows it: begin, enter, update, exit, drop, load,
/// progress, loaded, end.
public struct MonitorEvent: Sendable, Equatable, Codable {
    public var session: String
    public var event: String
    public var detail: String
    public var bytes: UInt64
    public var expected: UInt64

    /// The event's kind; nil for one a newer daemon added.
    public var kind: MonitorEventKind? { MonitorEventKind(rawValue: event) }

    public init(session: String, event: String, detail: String, bytes: UInt64, expected: UInt64) {
        self.session = session
        self.event = event
        self.detail = detail
        self.bytes = bytes
        self.expected = expected
    }
}

/// Where a policy entry or setting was written, so errors and `dragctl policy show` can send
/// an administrator straight to the line that decided something.
public struct SourceLocation: Hashable, Sendable, CustomStringConvertible {
    public var file: String
    public var line: Int

    public init(file: String, line: Int) {
        self.file = file
        self.line = line
    }

    public var description: String { "\(file):\(line)" }
}

/// A configuration mistake. Line 0 means the whole file (it could not be read, for example).
public struct PolicyError: Error, Equatable, Sendable, CustomStringConvertible {
    public var file: String
    public var line: Int
    public var message: String

    public init(file: String, line: Int, message: String) {
        self.file = file
        self.line = line
        self.message = message
    }

    init(_ location: SourceLocation, _ message: String) {
        self.init(file: location.file, line: location.line, message: message)
    }

    public var description: String { "\(file):\(line): \(message)" }
}

/// One `[App]` section: an app the administrator registered, and which identity sources
/// it trusts to be that app. An entry with `Executable=` names the app that runs that file
/// (a path the user cannot write is as strong as its permissions). `Sources=` lists the
/// sources whose app ID, when it is `AppID=`, gets this entry's team and `Managed=`: the
/// sandboxes by default when there is no `Executable=`, and a self-chosen systemd unit or
/// scope name only when listed, because any unsandboxed process can name its own scope.
public struct AppEntry: Hashable, Sendable {
    /// An identity source an entry may accept by app ID alone, spelled as `WhoAmI` shows it.
    public enum Source: String, CaseIterable, Hashable, Sendable {
        case flatpak
        case snap
        case systemdUnit = "systemd-unit"
    }

    public var executable: String?
    public var appID: String
    public var team: String?
    public var managed: Bool
    public var sources: Set<Source>
    public var origin: SourceLocation

    /// The sources an entry accepts when `Sources=` is not given.
    public static func defaultSources(executable: String?) -> Set<Source> {
        executable == nil ? [.flatpak, .snap] : []
    }

    public init(executable: String?, appID: String, team: String? = nil, managed: Bool = false,
                sources: Set<Source>? = nil, origin: SourceLocation) {
        self.executable = executable
        self.appID = appID
        self.team = team
        self.managed = managed
        self.sources = sources ?? Self.defaultSources(executable: executable)
        self.origin = origin
    }
}

/// One `[Team]` section.
public struct TeamEntry: Hashable, Sendable {
    public var name: String
    public var managed: Bool
    public var origin: SourceLocation

    public init(name: String, managed: Bool = false, origin: SourceLocation) {
        self.name = name
        self.managed = managed
        self.origin = origin
    }
}

public enum FlowEndpoint: Hashable, Sendable, CustomStringConvertible {
    case any, managed, unmanaged
    case app(String)
    case team(String)

    /// The spelling `From=` and `To=` accept.
    public var description: String {
        switch self {
        case .any: "any"
        case .managed: "managed"
        case .unmanaged: "unmanaged"
        case .app(let id): "app:\(id)"
        case .team(let name): "team:\(name)"
        }
    }
}

public enum FlowAction: String, Hashable, Sendable {
    case allow, deny
}

/// One `[Flow]` section.
/// The ways data moves between apps through the broker: a drag and drop, or a copy and paste.
public enum FlowChannel: String, CaseIterable, Hashable, Sendable {
    case drag, paste
}

public struct FlowRule: Hashable, Sendable {
    public var from: FlowEndpoint
    public var to: FlowEndpoint
    /// Empty means every type.
    public var typePatterns: [String]
    public var largerThan: UInt64?
    /// Empty means every channel.
    public var channels: Set<FlowChannel>
    public var action: FlowAction
    public var origin: SourceLocation

    public init(from: FlowEndpoint, to: FlowEndpoint, typePatterns: [String] = [],
                largerThan: UInt64? = nil, channels: Set<FlowChannel> = [], action: FlowAction, origin: SourceLocation) {
        self.from = from
        self.to = to
        self.typePatterns = typePatterns
        self.largerThan = largerThan
        self.channels = channels
        self.action = action
        self.origin = origin
    }

    /// Whether the rule speaks of data moving through `channel`.
    public func covers(_ channel: FlowChannel) -> Bool {
        channels.isEmpty || channels.contains(channel)
    }
}

public struct PolicyLimits: Hashable, Sendable {
    public var sessionsPerConnection = 16
    public var sessionsTotal = 1024
    public var itemsPerSession = 256
    public var representationsPerItem = 32
    public var destinationsPerSession = 64
    public var concurrentLoadsPerSession = 16
    public var maxStringLength = 255
    /// Seconds a source may take to produce a load's first byte.
    public var firstByteTimeoutSec = 30
    /// Seconds a load may make no progress (a stalled source, or a destination that stops reading).
    public var stallTimeoutSec = 30
    /// Seconds from BeginSession within which a drag must be dropped: a drag released over
    /// nothing by a source that never cancels it must not hold its items and token for ever.
    public var dragTimeoutSec = 300
    /// Seconds a dropped session may wait, with no load in flight, for its destination to
    /// load or conclude.
    public var concludeTimeoutSec = 60
    /// Live sessions one app may have begun, over all its connections.
    public var sessionsPerApp = 64
    /// Live sessions the unsandboxed apps of one user may have begun together.
    public var sessionsPerUser = 256
    /// Loads in flight one app may take part in, as destination or source.
    public var loadsPerApp = 64
    /// Loads in flight the unsandboxed apps of one user may take part in together.
    public var loadsPerUser = 256
    /// Loads in flight for everyone together (lowered to what the descriptor limit allows).
    public var loadsTotal = 4096
    /// Threads one app's handed-over descriptors may hold at once: each is a call (fstat, open,
    /// close) that the file system the descriptor lives on may never answer.
    public var descriptorThreadsPerApp = 4
    /// Such threads for every app together.
    public var descriptorThreadsTotal = 32
    /// Refusals recorded one by one per app (and per user for unsandboxed apps) within each
    /// interval; past the burst they are counted, and one row says how many, as journald's
    /// `RateLimitIntervalSec=`/`RateLimitBurst=` do.
    public var refusalRateLimitIntervalSec = 60
    public var refusalRateLimitBurst = 60
    /// Milliseconds a refusal past the burst waits before it is answered, so that an app that
    /// asks again as soon as it hears slows down to a pace the daemon absorbs.
    public var refusalDelayMsec = 100

    public init() {}

    /// One table drives parsing, rendering and provenance, so a new limit cannot be
    /// half-wired.
    static let keys: [(name: String, path: WritableKeyPath<PolicyLimits, Int> & Sendable)] = [
        ("SessionsPerConnection", \.sessionsPerConnection),
        ("SessionsTotal", \.sessionsTotal),
        ("ItemsPerSession", \.itemsPerSession),
        ("RepresentationsPerItem", \.representationsPerItem),
        ("DestinationsPerSession", \.destinationsPerSession),
        ("ConcurrentLoadsPerSession", \.concurrentLoadsPerSession),
        ("SessionsPerApp", \.sessionsPerApp),
        ("SessionsPerUser", \.sessionsPerUser),
        ("LoadsPerApp", \.loadsPerApp),
        ("LoadsPerUser", \.loadsPerUser),
        ("LoadsTotal", \.loadsTotal),
        ("MaxStringLength", \.maxStringLength),
        ("FirstByteTimeoutSec", \.firstByteTimeoutSec),
        ("StallTimeoutSec", \.stallTimeoutSec),
        ("DragTimeoutSec", \.dragTimeoutSec),
        ("ConcludeTimeoutSec", \.concludeTimeoutSec),
        ("DescriptorThreadsPerApp", \.descriptorThreadsPerApp),
        ("DescriptorThreadsTotal", \.descriptorThreadsTotal),
        ("RefusalRateLimitIntervalSec", \.refusalRateLimitIntervalSec),
        ("RefusalRateLimitBurst", \.refusalRateLimitBurst),
        ("RefusalDelayMsec", \.refusalDelayMsec),
    ]
}

/// The clipboard through the broker: how long an entry lives, and whether a source may also
/// offer representations in the clear for apps that do not speak the protocol.
public struct PasteboardOptions: Hashable, Sendable {
    /// Seconds an entry lives when its source asks for no expiration.
    public var expirationSec = 86_400
    /// The longest expiration a source may ask for; a longer one is cut to it.
    public var maxExpirationSec = 604_800
    /// Whether a source may offer representations in the clear on the window system's clipboard
    /// (those any unknown app could have): `no` forbids it entirely.
    public var clearOffers = true

    public init() {}
}

public struct AuditOptions: Hashable, Sendable {
    /// Refuse transfers that cannot be audited.
    public var failClosed = false
    /// 0 keeps records forever.
    public var retentionDays = 90

    public init(failClosed: Bool = false, retentionDays: Int = 90) {
        self.failClosed = failClosed
        self.retentionDays = retentionDays
    }
}

public struct Policy: Hashable, Sendable {
    public var apps: [AppEntry]
    public var teams: [TeamEntry]
    /// In evaluation order: the first matching rule decides.
    public var flows: [FlowRule]
    public var limits: PolicyLimits
    public var pasteboard = PasteboardOptions()
    public var audit: AuditOptions
    /// The files actually read, in the order they were applied.
    public var files: [String]
    /// Which line last set a `[Limits]` or `[Audit]` key, keyed `Section.Key`; `render()`
    /// needs it to tell file settings from defaults.
    var settingOrigins: [String: SourceLocation] = [:]

    public init(apps: [AppEntry] = [], teams: [TeamEntry] = [], flows: [FlowRule] = [],
                limits: PolicyLimits = PolicyLimits(), audit: AuditOptions = AuditOptions(),
                files: [String] = []) {
        self.apps = apps
        self.teams = teams
        self.flows = flows
        self.limits = limits
        self.audit = audit
        self.files = files
    }

    public static let `default` = Policy()
}

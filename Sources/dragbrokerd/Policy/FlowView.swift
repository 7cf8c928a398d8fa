import BrokerPolicy
import Synchronization
import UniformTypes

/// The administrator's flow rules, asked about one representation going to one destination.
struct FlowView {
    let policy: Policy
    let types: MimeDatabase
    /// Which policy this is, for answers worked out from it and kept (a session's load
    /// resolutions): each policy the daemon applies has its own, and so has each view made
    /// with none given, so that a kept answer is never taken for another policy's.
    let generation: UInt64

    init(policy: Policy, types: MimeDatabase, generation: UInt64 = FlowView.newGeneration()) {
        self.policy = policy
        self.types = types
        self.generation = generation
    }

    private static let generations = Atomic<UInt64>(0)

    static func newGeneration() -> UInt64 {
        generations.add(1, ordering: .relaxed).newValue
    }

    /// Whether `type` conforms to `pattern` (a MIME type, a wildcard or a UTI).
    func conforms(_ type: String, _ pattern: String) -> Bool {
        (try? TypeIdentifier(type)).map { types.conforms($0, to: pattern) } ?? false
    }

    /// The rule that forbids `type` from `source` to `destination` whatever its size, if one
    /// does: such a representation does not exist for that destination. Rules with
    /// `LargerThan=` act only while streaming, since sizes are not known before.
    func denial(of type: String, from source: AppIdentity, to destination: AppIdentity, through channel: FlowChannel) -> FlowRule? {
        let decision = policy.decide(from: Policy.FlowParty(source), to: Policy.FlowParty(destination), type: type, size: nil,
                                     channel: channel, conforms: conforms)
        return decision.action == .deny ? decision.rule : nil
    }

    /// Whether `type` from `source` may reach an app the broker knows nothing of (unmanaged,
    /// in no team): what may go on a clipboard in the clear, which any app can read.
    func reachesUnknownApps(_ type: String, from source: AppIdentity, through channel: FlowChannel) -> Bool {
        let unknown = Policy.FlowParty(appID: "", team: nil, managed: false)
        return policy.decide(from: Policy.FlowParty(source), to: unknown, type: type, size: nil, channel: channel,
                             conforms: conforms).action == .allow
    }

    /// The size past which a stream of this flow is stopped, and the rule that says so.
    func byteLimit(of type: String, from source: AppIdentity, to destination: AppIdentity,
                   through channel: FlowChannel) -> (limit: UInt64, rule: FlowRule)? {
        policy.byteLimit(from: Policy.FlowParty(source), to: Policy.FlowParty(destination), type: type, channel: channel,
                         conforms: conforms)
    }
}

extension Policy.FlowParty {
    /// The policy's view of a party to a flow.
    init(_ identity: AppIdentity) {
        self.init(appID: identity.appID, team: identity.team, managed: identity.managed)
    }
}

extension Policy {
    /// One side of a transfer as the daemon resolved it.
    public struct FlowParty: Hashable, Sendable {
        public var appID: String
        public var team: String?
        public var managed: Bool

        public init(appID: String, team: String? = nil, managed: Bool = false) {
            self.appID = appID
            self.team = team
            self.managed = managed
        }
    }

    /// The entry that names the app running `path`.
    public func app(forExecutable path: String) -> AppEntry? {
        apps.first { $0.executable == path }
    }

    /// The entry for an app whose ID came from `source`, if the administrator made one that
    /// accepts that source.
    public func app(id: String, from source: AppEntry.Source) -> AppEntry? {
        apps.first { $0.appID == id && $0.sources.contains(source) }
    }

    /// Managed by its own entry (the one that matched the app, never another with the same
    /// ID) or by its team's.
    public func isManaged(entry: AppEntry?, team: String?) -> Bool {
        if entry?.managed == true { return true }
        return [team, entry?.team].contains { name in
            teams.contains { $0.name == name && $0.managed }
        }
    }

    /// The first rule matching the flow decides; no match allows. A `LargerThan=` rule only
    /// matches when `size` is known, so a caller streaming bytes of unknown length must also
    /// enforce `byteLimit`.
    public func decide(from: FlowParty, to: FlowParty, type: String, size: UInt64?, channel: FlowChannel = .drag,
                       conforms: (String, String) -> Bool) -> (action: FlowAction, rule: FlowRule?) {
        for rule in flows where rule.matches(from: from, to: to, type: type, channel: channel, conforms: conforms) {
            guard let threshold = rule.largerThan else { return (rule.action, rule) }
            if let size, size > threshold { return (rule.action, rule) }
        }
        return (.allow, nil)
    }

    /// The size past which a stream of this flow must be stopped: the smallest `LargerThan=`
    /// among reachable matching deny rules. An earlier matching allow rule without
    /// `LargerThan=` makes every later rule unreachable; one with `LargerThan=a` hides deny
    /// rules whose threshold is at least `a`, since every size they would catch it allows first.
    public func byteLimit(from: FlowParty, to: FlowParty, type: String, channel: FlowChannel = .drag,
                          conforms: (String, String) -> Bool) -> (limit: UInt64, rule: FlowRule)? {
        var best: (limit: UInt64, rule: FlowRule)?
        var smallestAllow: UInt64?
        for rule in flows where rule.matches(from: from, to: to, type: type, channel: channel, conforms: conforms) {
            switch (rule.action, rule.largerThan) {
            case (.allow, nil):
                return best
            case (.allow, let threshold?):
                smallestAllow = min(smallestAllow ?? threshold, threshold)
            case (.deny, nil):
                break
            case (.deny, let threshold?):
                if smallestAllow.map({ threshold < $0 }) ?? true, best.map({ threshold < $0.limit }) ?? true {
                    best = (threshold, rule)
                }
            }
        }
        return best
    }
}

extension FlowEndpoint {
    func matches(_ party: Policy.FlowParty) -> Bool {
        switch self {
        case .any: true
        case .managed: party.managed
        case .unmanaged: !party.managed
        case .app(let id): party.appID == id
        case .team(let name): party.team == name
        }
    }
}

extension FlowRule {
    /// Everything but the size condition.
    func matches(from: Policy.FlowParty, to: Policy.FlowParty, type: String, channel: FlowChannel,
                 conforms: (String, String) -> Bool) -> Bool {
        covers(channel) && self.from.matches(from) && self.to.matches(to)
            && (typePatterns.isEmpty || typePatterns.contains { conforms(type, $0) })
    }
}

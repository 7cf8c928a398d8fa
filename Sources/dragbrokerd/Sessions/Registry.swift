import BrokerPolicy
import BrokerProtocol
import BusKit
import Foundation
import SystemCalls
import TransferLog
import UniformTypes

/// The live sessions, found in one dictionary probe whichever way a call names them: by ID
/// (and so by object path), by token, or by a connection taking part. Also the identity
/// cache and the policy in force, which every rule is judged by.
final class Registry {
    private(set) var sessions: [String: Session] = [:]
    private var byToken: [UInt64: Session] = [:]
    /// Session IDs each connection takes part in, as source or destination.
    private var byParty: [String: Set<String>] = [:]
    /// How many live sessions each connection owns (`Session.owner`).
    private var ownerCounts: [String: Int] = [:]
    /// Each session's ID, handed out once ever.
    let sessionNumbers: SessionNumbers
    /// What each app and user holds, against the bounds that keep any one from starving the rest.
    private(set) var quota = Quota()
    let identities: IdentityResolver
    let types: MimeDatabase
    /// Told of every session event, after the registry has done its own part.
    var onEvent: (Session, SessionEvent) -> Void = { _, _ in }
    /// What every session reports its events to: one closure shared by all of them, rather than
    /// a context allocated for each.
    private lazy var report: (Session, SessionEvent) -> Void = { [unowned self] session, event in deliver(session, event) }

    static let sessionIDPrefix = TransferLog.sessionIDPrefix
    private static let pathPrefix = BrokerNames.sessionPath(id: "")

    init(policy: Policy, types: MimeDatabase, sessionNumbers: SessionNumbers) {
        identities = IdentityResolver(policy: policy)
        self.types = types
        self.sessionNumbers = sessionNumbers
    }

    var policy: Policy { identities.policy }
    var limits: Limits { Limits(policy.limits) }
    /// The flow rules in force.
    var flow: FlowView { FlowView(policy: policy, types: types, generation: identities.policyGeneration) }
    var count: Int { sessions.count }

    func session(id: String) -> Session? { sessions[id] }

    /// The session whose object path this is.
    func session(atPath path: String) -> Session? {
        guard path.hasPrefix(Self.pathPrefix) else { return nil }
        return sessions[String(path.dropFirst(Self.pathPrefix.count))]
    }

    // MARK: Beginning and joining

    func begin(source: AppIdentity, items: [ItemDescriptor], options: SessionOptions,
               providerPath: String, kind: Session.Kind = .drag) throws -> Session {
        try admitSession(of: source)
        var token = try SessionToken.random()
        while byToken[token.selector] != nil { token = try SessionToken.random() }
        let id = "\(Self.sessionIDPrefix)\(try sessionNumbers.next())"
        let session = Session(id: id, token: token, source: source, providerPath: providerPath, items: items,
                              options: options, kind: kind, report: report)
        byToken[token.selector] = session
        register(session)
        return session
    }

    /// A source puts items on the pasteboard: a session in state `copied`, which lives for the
    /// expiration it asked for, within the policy's bounds.
    func copy(source: AppIdentity, items: [ItemDescriptor], options: PasteOptions, providerPath: String) throws -> Session {
        let bounds = policy.pasteboard
        let seconds = min(options.expirationSec.map(Int.init) ?? bounds.expirationSec, bounds.maxExpirationSec)
        return try begin(source: source, items: items, options: SessionOptions(restrictedToApp: options.restrictedToApp),
                         providerPath: providerPath, kind: .copy(lifetime: UInt64(seconds) * 1_000_000))
    }

    /// `caller` pastes the entry: a session of its own, with the entry's items and provider, in
    /// which it alone loads. It spends the caller's share of sessions, not the source's. Its
    /// source hears of it (`Pasted`) before anything else can happen in it.
    func paste(_ entry: Session, by caller: AppIdentity) throws -> Session {
        let id = try entry.pasteID(for: caller, flow: flow)
        try admitSession(of: caller)
        let paste = Session(id: id, token: try SessionToken.random(), source: entry.source, providerPath: entry.providerPath,
                            items: entry.items, options: entry.options,
                            kind: .paste(entry: entry.id), report: report)
        paste.beginPaste(by: caller)
        entry.announce(paste)
        register(paste)
        return paste
    }

    /// Whether `owner` may have one more live session: everyone's, its connection's and its
    /// app's and user's shares.
    private func admitSession(of owner: AppIdentity) throws {
        let limits = limits
        guard sessions.count < limits.sessionsTotal else {
            throw BrokerError.limitExceeded("The broker holds \(sessions.count) sessions, its limit")
        }
        let own = ownerCounts[owner.uniqueName, default: 0]
        guard own < limits.sessionsPerConnection else {
            throw BrokerError.limitExceeded("This connection already has \(own) live sessions (limit \(limits.sessionsPerConnection))")
        }
        try quota.admitSession(of: owner, limits)
    }

    private func register(_ session: Session) {
        sessions[session.id] = session
        let owner = session.owner
        byParty[session.source.uniqueName, default: []].insert(session.id)
        if owner.uniqueName != session.source.uniqueName { byParty[owner.uniqueName, default: []].insert(session.id) }
        ownerCounts[owner.uniqueName, default: 0] += 1
        quota.sessionBegan(by: owner)
        deliver(session, .began)
    }

    /// A destination presents a token it was handed through the windowing system's drag.
    func present(token text: String, by caller: AppIdentity) throws(BrokerError) -> Session {
        guard let token = SessionToken(hex: text), let session = byToken[token.selector], session.token.matches(token),
              session.isVisible(to: caller) else {
            throw .notFound("No live session has this token")
        }
        if case .joined(let evicted) = try session.admit(caller, limit: limits.destinationsPerSession, flow: flow) {
            byParty[caller.uniqueName, default: []].insert(session.id)
            if let evicted { forgetParty(evicted, of: session) }
        }
        return session
    }

    // MARK: Ending

    /// A peer's connection went away. Every session that depended on it leaves the registry at
    /// once, so no call can reach it and the count is right; telling the other parties and
    /// auditing each end then runs in slices through `later`, so a source leaving with
    /// thousands of sessions never holds up everyone else's calls.
    func peerVanished(_ uniqueName: String) {
        identities.forget(uniqueName)
        guard let ids = byParty.removeValue(forKey: uniqueName) else { return }
        var ending: [Session] = []
        for id in ids {
            guard let session = sessions[id] else { continue }
            if session.dependsOn(uniqueName) {
                forget(session)
                ending.append(session)
            } else {
                session.partyVanished(uniqueName)
            }
        }
        guard !ending.isEmpty else { return }
        teardown.append((ending[...], uniqueName))
        if teardown.count == 1 { continueTeardown() }
    }

    /// Sessions ended per turn of the event loop while a departed peer's sessions end.
    static let teardownSlice = 256
    /// Runs work after the current event; the daemon passes its loop's `soon`.
    var later: (@escaping () -> Void) -> Void = { $0() }
    /// Sessions out of the registry whose end is still to be told and audited.
    private var teardown: [(sessions: ArraySlice<Session>, departed: String)] = []

    private func continueTeardown() {
        guard let (sessions, departed) = teardown.first else { return }
        for session in sessions.prefix(Self.teardownSlice) { session.partyVanished(departed) }
        let rest = sessions.dropFirst(Self.teardownSlice)
        if rest.isEmpty { teardown.removeFirst() } else { teardown[0].sessions = rest }
        if !teardown.isEmpty { later { [weak self] in self?.continueTeardown() } }
    }

    /// Ends every session, e.g. on shutdown, including those still waiting to be torn down.
    func endAll(_ error: BrokerError, outcome: SessionOutcome = .cancelled, loadOutcome: LoadOutcome? = nil) {
        for (sessions, departed) in teardown {
            for session in sessions { session.partyVanished(departed) }
        }
        teardown = []
        for session in sessions.values.sorted(by: { Self.numericOrder($0.id, $1.id) }) {
            session.end(outcome: outcome, error: error, loadOutcome: loadOutcome)
        }
    }

    /// Whether a load from the session's source to `destination` may start: no app, no user's
    /// unsandboxed apps, and not everyone together past their bounds (`Quota`).
    func admitLoad(in session: Session, to destination: AppIdentity) throws(BrokerError) {
        try quota.admitLoad(from: session.source, to: destination, limits, descriptors: descriptorLimit)
    }

    /// The descriptor limit the daemon runs with (its soft RLIMIT_NOFILE, once raised), which
    /// bounds the loads of everyone together.
    var descriptorLimit: Int?

    private func deliver(_ session: Session, _ event: SessionEvent) {
        switch event {
        case .ended: forget(session)
        case .began, .dropped: watchDeadline(of: session)
        case .loadStarted(let load): quota.loadStarted(from: session.source, to: load.destination)
        case .loadFinished(let load, _):
            quota.loadEnded(from: session.source, to: load.destination)
            watchDeadline(of: session)
        default: break
        }
        onEvent(session, event)
    }

    // MARK: Deadlines

    /// Arms a one-shot timer after a delay in microseconds; releasing what it returns disarms
    /// it. The daemon passes its loop's timers; without one, deadlines pass only when
    /// `expireDeadlines` is called.
    var schedule: (_ delay: UInt64, _ fire: @escaping () -> Void) -> AnyObject? = { _, _ in nil }
    /// One timer for every session, at the earliest deadline: a session costs no timer of its
    /// own, and beginning one costs a comparison (its deadline is the latest yet).
    private var deadlineTimer: AnyObject?
    private var armedFor: UInt64?

    private func watchDeadline(of session: Session) {
        guard let deadline = session.deadline(limits), armedFor.map({ deadline < $0 }) ?? true else { return }
        arm(at: deadline, now: Kernel.monotonicMicroseconds())
    }

    private func arm(at deadline: UInt64, now: UInt64) {
        // Sessions whose deadlines fall within the timer's slack end together, in one sweep.
        deadlineTimer = schedule(deadline > now ? deadline - now : 0) { [weak self] in
            self?.expireDeadlines(at: Kernel.monotonicMicroseconds())
        }
        // A timer that could not be armed is tried again by the next session that needs one.
        armedFor = deadlineTimer == nil ? nil : deadline
    }

    /// Ends every session whose deadline has passed at `now`, then waits for the next one.
    /// Also after a reload: deadlines are read from the policy in force.
    func expireDeadlines(at now: UInt64) {
        deadlineTimer = nil
        armedFor = nil
        let limits = limits
        var expired: [Session] = []
        var next: UInt64?
        for session in sessions.values {
            guard let deadline = session.deadline(limits) else { continue }
            if deadline <= now {
                expired.append(session)
            } else {
                next = min(next ?? deadline, deadline)
            }
        }
        for session in expired.sorted(by: { Self.numericOrder($0.id, $1.id) }) { session.timeOut(limits) }
        if let next { arm(at: next, now: now) }
    }

    private func forget(_ session: Session) {
        guard sessions.removeValue(forKey: session.id) != nil else { return }
        byToken.removeValue(forKey: session.token.selector)
        forgetParty(session.source.uniqueName, of: session)
        for party in session.destinations.keys { forgetParty(party, of: session) }
        let owner = session.owner
        quota.sessionEnded(by: owner)
        ownerCounts[owner.uniqueName, default: 1] -= 1
        if ownerCounts[owner.uniqueName] == 0 { ownerCounts.removeValue(forKey: owner.uniqueName) }
    }

    /// `party` takes no part in `session` any more.
    private func forgetParty(_ party: String, of session: Session) {
        guard let index = byParty.index(forKey: party) else { return }
        byParty.values[index].remove(session.id)
        if byParty.values[index].isEmpty { byParty.remove(at: index) }
    }

    /// s2 before s10: the order sessions were begun in.
    private static func numericOrder(_ a: String, _ b: String) -> Bool {
        a.count != b.count ? a.count < b.count : a < b
    }
}

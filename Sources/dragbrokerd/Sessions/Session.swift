// Sessions/ — the model: what a drag session is and every rule that belongs to it, with no bus
// in sight. A new session method starts here (the rule, as a method that throws a
// `BrokerError` refusal and reports a `SessionEvent`), then gets its D-Bus face in
// BusFace/SessionInterface.swift. `Registry` owns the live sessions.
import BrokerPolicy
import BrokerProtocol
import Foundation
import SystemCalls
import UniformTypes

/// What happened to a session. The bus face turns these into signals for the parties, the
/// audit sink into records, monitor events and log lines, and the registry retires a session
/// on `.ended`.
enum SessionEvent {
    case began
    case itemsAdded
    case proposed(by: AppIdentity, proposal: DropOperation, allowed: DropOperation, entering: Bool)
    case exited(AppIdentity)
    /// The policy hides representations from a destination: told once per destination.
    case flowDenied(to: AppIdentity, types: [String], rule: FlowRule)
    case dropped(on: AppIdentity, operation: DropOperation)
    /// An app pasted the pasteboard entry: `paste` is the new session it loads from.
    case pastedFrom(Session)
    /// The drop destination concluded: every party hears the session ended well.
    case concluded
    case loadStarted(Load)
    /// Bytes moved; reported 50 ms into the load at the earliest, then at most every 50 ms.
    case loadProgressed(Load)
    /// The source announced the load's size.
    case loadSizeAnnounced(Load)
    case loadFinished(Load, error: BrokerError?)
    /// The drop destination concluded and every load is done.
    case transferFinished
    /// The session is over: `outcome` as the log records it, `error` why it was cut short.
    case ended(outcome: SessionOutcome, error: BrokerError?)
}

/// What a load may use, decided by the session's rules before any byte moves.
struct LoadRequest {
    let id: UInt32
    /// The item's index in the session (not the destination's view of it).
    let item: UInt32
    let typeIdentifier: String
    let kind: RepresentationKind
    let destination: AppIdentity
    /// A `LargerThan=` flow rule that caps the bytes, if one applies.
    let sizeRule: (limit: UInt64, rule: FlowRule)?
}

/// A load request worked out (`Session.resolveLoad`): the item's real index, the
/// representation served and the size rule on it.
struct LoadResolution {
    struct Key: Hashable {
        let item: UInt32
        let type: String
    }

    /// How many a session keeps.
    static let limit = 32

    let item: Int
    let representation: RepresentationDescriptor
    let sizeRule: (limit: UInt64, rule: FlowRule)?
}

/// The rules a load is judged by, from the registry's policy and the audit's state.
struct LoadRules {
    var flow: FlowView
    var limits: Limits
    /// FailClosed=yes and the transfer log is losing records: no transfer may start.
    var auditRefuses: Bool
    /// FailClosed=yes: a load moves nothing until its start record committed (see `Load`).
    var failClosed = false
}

/// A live session: its state machine, its parties and loads, and the rules for each. A drag is
/// one; so is an entry on the pasteboard, and each paste of one. Confined to the event loop, as
/// the whole model is.
final class Session {
    enum State: String {
        /// Dragging: destinations may enter, propose and exit.
        case active
        /// A destination performed the drop; it alone may load.
        case dropped
        /// On the pasteboard: destinations that presented the token may look and paste.
        case copied
        /// A paste: the app that pasted alone may load, as after a drop.
        case pasted
        /// The drop or paste destination concluded; loads in flight finish, no new ones start.
        case concluded
    }

    /// What the session is. Pasteboard entries and pastes are the same promises as a drag's,
    /// through another channel: a paste is a session of its own per paste, so that each has
    /// its destination, loads and record, as iOS tells each pasting app apart.
    enum Kind: Equatable {
        case drag
        /// On the pasteboard for `lifetime` microseconds from its copy, unless withdrawn first.
        case copy(lifetime: UInt64)
        /// One paste of the entry with ID `entry`. Boxed, so that every session's kind is a word
        /// and a tag, not two words and a tag.
        indirect case paste(entry: String)
    }

    /// A destination that presented the token.
    struct Destination {
        var identity: AppIdentity
        var proposal: DropOperation = .cancel
        var allowed: DropOperation = .cancel
        /// Its own Enter, not yet followed by its own Exit: what its Update and PerformDrop
        /// need, whatever any other destination calls.
        var entered = false
        /// When it last presented the token, in the order of the session's presentations: an
        /// entry makes room for a newcomer by forgetting the one that looked longest ago.
        var presented: UInt64 = 0
        /// Already told, in the audit, that the policy hides representations from it: once for
        /// as long as it is a destination, so the mark goes with it.
        var flowDenialReported = false
    }

    /// What presenting the token did.
    enum Admission: Equatable {
        /// It had presented before; it only counts as looking now.
        case again
        /// It joined now. On a full pasteboard entry, `evicting` is the destination forgotten to
        /// make room.
        case joined(evicting: String?)
    }

    let id: String
    let token: SessionToken
    let source: AppIdentity
    let providerPath: String
    let createdAt: Date
    private(set) var items: [ItemDescriptor]
    /// Listed types a `Load` parsed, by their canonical string, so the next load does not parse
    /// them again; empty (and costing nothing) in a session nobody loads from.
    private var listedTypes: [String: TypeIdentifier] = [:]
    /// `resolveLoad`'s kept answers, and whom and which policy they are for.
    private(set) var loadResolutions: [LoadResolution.Key: LoadResolution] = [:]
    private var loadResolutionsFor: (identity: AppIdentity, generation: UInt64)?
    private(set) var destinations: [String: Destination] = [:]
    /// The destination that entered last and has not exited: what `dragctl` shows before the
    /// drop. It decides nothing: each destination's calls depend on its own Enter and Exit
    /// only, so a bystander that read the token cannot break another's drop.
    private(set) var current: String?
    /// The destination that performed the drop, or the paste.
    private(set) var dropDestination: String?
    var dropDestinationApp: String? { dropDestination.flatMap { destinations[$0]?.identity.appID } }
    private(set) var loads: [UInt32: Load] = [:]
    /// An entry's pastes so far: each paste's ID is the entry's, `_`, and its number.
    private var pasteCount = 0
    /// Presentations so far, which order `Destination.presented`.
    private var presentations: UInt64 = 0
    /// Bytes of loads already finished, for the session's aggregate progress.
    private(set) var finishedBytes: UInt64 = 0
    /// The party whose departure ended the session: nobody is left there to tell.
    private(set) var departed: String?
    /// Monotonic microseconds the session's deadline counts from: its beginning while it is
    /// dragged; the drop, or the end of its last load, while it waits for its destination.
    private(set) var deadlineStart = Kernel.monotonicMicroseconds()
    private let report: (Session, SessionEvent) -> Void
    // The fields of a byte or a few, stored together last rather than each padded out to a word
    // between larger ones: 10,000 live sessions are 10,000 of these.
    let kind: Kind
    let options: SessionOptions
    private(set) var state: State = .active
    private(set) var operation: DropOperation = .cancel
    private(set) var isOver = false
    private var nextLoadID: UInt32 = 1

    init(id: String, token: SessionToken, source: AppIdentity, providerPath: String, items: [ItemDescriptor],
         options: SessionOptions, kind: Kind = .drag, report: @escaping (Session, SessionEvent) -> Void) {
        self.id = id
        self.token = token
        self.source = source
        self.providerPath = providerPath
        self.items = items
        self.options = options
        self.kind = kind
        self.createdAt = Date()
        self.report = report
        // An entry offers a copy for as long as it lives; its pastes are copies too.
        if case .copy = kind {
            state = .copied
            operation = .copy
        }
    }

    /// The channel the session's data moves through, as flow rules name it.
    var channel: FlowChannel { kind == .drag ? .drag : .paste }

    /// What the session is, as the log and `dragctl` name it.
    var kindName: String {
        switch kind {
        case .drag: "drag"
        case .copy: "copy"
        case .paste: "paste"
        }
    }

    /// Whose share of the daemon the session uses: the app that began it, and for a paste the
    /// app that pasted, so that pasting one entry again and again spends the paster's share.
    var owner: AppIdentity {
        if case .paste = kind, let dropDestination, let destination = destinations[dropDestination] { return destination.identity }
        return source
    }

    /// Computed, not stored: a path per session would be heap the registry does not need.
    var path: String { BrokerNames.sessionPath(id: id) }

    // MARK: Who may see what

    /// Whether `identity` may know the session exists: a restricted session exists only for
    /// its own app.
    func isVisible(to identity: AppIdentity) -> Bool {
        !options.restrictedToApp || identity.isSameApp(as: source)
    }

    /// Who may know of the session without taking part in it, at every door that shows it
    /// (ListSessions, SessionCount, DescribeSession, Monitor, the object tree): its own app,
    /// and administrators. A restricted session stays its own app's alone, administrators
    /// included: the app asked that no other app see it, and an operator's tool is another app.
    func mayBeInspected(by caller: AppIdentity) -> Bool {
        caller.isSameApp(as: source) || (isVisible(to: caller) && Self.isAdministrator(caller))
    }

    /// Root, or the user the daemon runs as, from outside any sandbox. Unsandboxed processes of
    /// one user can already read each other's memory (ptrace, /proc/PID/mem), so hiding a drag
    /// from them would protect nothing; the sandbox is the boundary the broker can keep.
    static func isAdministrator(_ caller: AppIdentity) -> Bool {
        !caller.isSandboxed && (caller.uid == 0 || caller.uid == getuid())
    }

    /// The source and every destination that presented the token.
    func isParty(_ uniqueName: String) -> Bool {
        uniqueName == source.uniqueName || destinations[uniqueName] != nil
    }

    /// Source and destinations may describe a session; nobody else learns anything of it.
    func requireParticipant(_ caller: AppIdentity) throws(BrokerError) {
        guard isParty(caller.uniqueName) else {
            throw .accessDenied("Present the session token with PresentToken before using session \(id)")
        }
    }

    /// `raw` parsed, once per session. `Items` checked every listed type as it was listed, so
    /// nil (which `select` skips) does not happen.
    private func listedType(_ raw: String) -> TypeIdentifier? {
        if let parsed = listedTypes[raw] { return parsed }
        let parsed = try? TypeIdentifier(raw)
        listedTypes[raw] = parsed
        return parsed
    }

    /// The items as `identity` may see them. A representation it may not see, or that the
    /// administrator's flow rules forbid it, does not exist for it, and neither does an item
    /// with none left; `index` is the item's real index.
    func visibleItems(for identity: AppIdentity, flow: FlowView) -> [(index: Int, item: VisibleItem)] {
        items.enumerated().compactMap { index, item in
            let types = visibleTypes(of: item, for: identity, flow: flow)
            if types.isEmpty { return nil }
            return (index, VisibleItem(suggestedName: item.suggestedName, preferredWidth: item.preferredWidth,
                                       preferredHeight: item.preferredHeight, typeIdentifiers: types))
        }
    }

    /// The item `visibleItems` shows `identity` at `position`, as its real index and the types
    /// it may see, without building the others: asked at every `Load`.
    func visibleItem(at position: Int, for identity: AppIdentity, flow: FlowView) -> (index: Int, typeIdentifiers: [String])? {
        var shown = 0
        for (index, item) in items.enumerated() {
            guard shown == position else {
                if item.representations.contains(where: { exists($0, for: identity, flow: flow) }) { shown += 1 }
                continue
            }
            let types = visibleTypes(of: item, for: identity, flow: flow)
            if !types.isEmpty { return (index, types) }
        }
        return nil
    }

    /// The types of `item` that exist for `identity`, in the order they were listed.
    private func visibleTypes(of item: ItemDescriptor, for identity: AppIdentity, flow: FlowView) -> [String] {
        item.representations.filter { exists($0, for: identity, flow: flow) }.map(\.typeIdentifier)
    }

    /// Whether `visibleItems` would show `identity` anything, without building the list:
    /// asked on every proposal.
    func hasDroppable(for identity: AppIdentity, flow: FlowView) -> Bool {
        items.contains { item in
            item.representations.contains { exists($0, for: identity, flow: flow) }
        }
    }

    /// A representation exists for `identity` when its visibility lets it see it and no flow
    /// rule denies it.
    private func exists(_ representation: RepresentationDescriptor, for identity: AppIdentity, flow: FlowView) -> Bool {
        isVisible(representation, to: identity)
            && flow.denial(of: representation.typeIdentifier, from: source, to: identity, through: channel) == nil
    }

    func isVisible(_ representation: RepresentationDescriptor, to identity: AppIdentity) -> Bool {
        switch representation.visibility {
        case .all: true
        case .app: identity.isSameApp(as: source)
        case .team: identity.isSameTeam(as: source)
        }
    }

    /// Each representation visibility shows `destination` that a flow rule denies it, with the
    /// rule, in item order; lazy, so a question of whether there is any stops at the first.
    private func flowDenials(to destination: AppIdentity, flow: FlowView) -> some Sequence<(type: String, rule: FlowRule)> {
        items.lazy.flatMap(\.representations).filter { self.isVisible($0, to: destination) }.compactMap { representation in
            flow.denial(of: representation.typeIdentifier, from: self.source, to: destination, through: self.channel)
                .map { (representation.typeIdentifier, $0) }
        }
    }

    /// The first thing the policy hides from `destination` that it could otherwise see, if any.
    private func firstFlowDenial(to destination: AppIdentity, flow: FlowView) -> (type: String, rule: FlowRule)? {
        var denials = flowDenials(to: destination, flow: flow).makeIterator()
        return denials.next()
    }

    /// Reports once per destination what the policy hides from it that it could otherwise see.
    private func reportFlowDenials(to destination: AppIdentity, flow: FlowView) {
        guard destinations[destination.uniqueName]?.flowDenialReported == false else { return }
        var denied: [String] = []
        var firstRule: FlowRule?
        for (type, rule) in flowDenials(to: destination, flow: flow) {
            if !denied.contains(type) { denied.append(type) }
            firstRule = firstRule ?? rule
        }
        guard let firstRule else { return }
        destinations[destination.uniqueName]?.flowDenialReported = true
        report(self, .flowDenied(to: destination, types: denied, rule: firstRule))
    }

    /// The broker's answer to a proposal. A copy or move of something droppable: the
    /// operation it allows. Otherwise (the app proposed `cancel` because it found nothing to
    /// take, or proposed to drop nothing), `forbidden` when the administrator's flow rules
    /// refused the destination something it could otherwise see, so that an app following the
    /// page still shows the refusal; it learns that policy refused, not what or how much.
    /// Representations hidden by visibility are, as on iOS, simply not there: `cancel`, unless
    /// the app itself proposed `forbidden`.
    private func answer(to proposal: DropOperation, by destination: AppIdentity, flow: FlowView) -> DropOperation {
        if proposal == .forbidden { return .forbidden }
        if proposal != .cancel && hasDroppable(for: destination, flow: flow) {
            return allowedOperation(for: proposal, by: destination)
        }
        return firstFlowDenial(to: destination, flow: flow) != nil ? .forbidden : .cancel
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

    // MARK: Source

    /// Flocking: more items on a live drag, from the source's own app only.
    /// Flocking, as on iOS, happens in the source's app: its source connection, or another
    /// connection of the same app that presented the token. Never another app, and never a
    /// connection that is no party, whatever its app.
    func addItems(_ newItems: [ItemDescriptor], by caller: AppIdentity, limit: Int, flow: FlowView) throws(BrokerError) {
        try requireParticipant(caller)
        guard caller.isSameApp(as: source) else {
            throw .accessDenied("Only \(source.appID) may add items to session \(id): cross-app flocking is not allowed")
        }
        guard state == .active else {
            throw .wrongState("Session \(id) is \(state.rawValue): items can be added only while dragging")
        }
        guard items.count + newItems.count <= limit else {
            throw .limitExceeded("A session holds at most \(limit) items; session \(id) has \(items.count)")
        }
        items += newItems
        report(self, .itemsAdded)
        for destination in destinations.values.map(\.identity) { reportFlowDenials(to: destination, flow: flow) }
    }

    func cancel(by caller: AppIdentity) throws(BrokerError) {
        guard caller.uniqueName == source.uniqueName else {
            throw .accessDenied("Only the source of session \(id) may cancel it")
        }
        let what = kind == .drag ? "cancelled the drag" : state == .copied ? "withdrew the pasteboard entry" : "cancelled the paste"
        end(outcome: .cancelled, error: BrokerError(.cancelled, "The source \(what)"))
    }

    // MARK: Destination

    /// A destination presented the token. A drag refuses destinations past `limit`: it lives
    /// only as long as the pointer is held. A pasteboard entry lives for days and its token is
    /// readable by any X11 client, so looking must not lock it: at `limit` it forgets the
    /// destination that presented longest ago, which presents again if it comes back (a paste
    /// is a session of its own, so nothing else is lost).
    @discardableResult
    func admit(_ caller: AppIdentity, limit: Int, flow: FlowView) throws(BrokerError) -> Admission {
        presentations += 1
        if destinations[caller.uniqueName] != nil {
            destinations[caller.uniqueName]?.presented = presentations
            return .again
        }
        var evicted: String?
        if destinations.count >= limit {
            guard state == .copied, let oldest = destinations.min(by: { $0.value.presented < $1.value.presented })?.key else {
                throw .limitExceeded("Session \(id) already has \(destinations.count) destinations")
            }
            destinations.removeValue(forKey: oldest)
            evicted = oldest
        }
        destinations[caller.uniqueName] = Destination(identity: caller, presented: presentations)
        reportFlowDenials(to: caller, flow: flow)
        return .joined(evicting: evicted)
    }

    /// What the drag offers `caller` decides its answer: with nothing it may drop, a copy or a
    /// move is answered `forbidden`, as iOS's drop proposal shows before the drop.
    func propose(_ proposal: DropOperation, by caller: AppIdentity, entering: Bool, flow: FlowView) throws(BrokerError) -> DropOperation {
        guard var destination = destinations[caller.uniqueName] else {
            throw .accessDenied("Present the session token with PresentToken before proposing a drop")
        }
        try requireDrag(toCall: entering ? "Enter" : "Update")
        guard state == .active else {
            throw .wrongState("Session \(id) is \(state.rawValue): proposals are over")
        }
        if !entering && !destination.entered {
            throw .wrongState("Call Enter before Update: the drag is not over this destination")
        }
        destination.entered = true
        destination.proposal = proposal
        destination.allowed = answer(to: proposal, by: caller, flow: flow)
        destinations[caller.uniqueName] = destination
        current = caller.uniqueName
        report(self, .proposed(by: caller, proposal: proposal, allowed: destination.allowed, entering: entering))
        return destination.allowed
    }

    func exit(by caller: AppIdentity) throws(BrokerError) {
        guard destinations[caller.uniqueName] != nil else {
            throw .accessDenied("Present the session token with PresentToken before using session \(id)")
        }
        try requireDrag(toCall: "Exit")
        destinations[caller.uniqueName]?.entered = false
        if current == caller.uniqueName { current = nil }
        report(self, .exited(caller))
    }

    func performDrop(by caller: AppIdentity) throws(BrokerError) -> DropOperation {
        guard let destination = destinations[caller.uniqueName] else {
            throw .accessDenied("Present the session token with PresentToken before performing a drop")
        }
        try requireDrag(toCall: "PerformDrop")
        guard state == .active else {
            throw .wrongState("Session \(id) is \(state.rawValue): it has already been dropped")
        }
        guard destination.entered else {
            throw .wrongState("Call Enter with a proposal before PerformDrop")
        }
        guard destination.allowed == .copy || destination.allowed == .move else {
            throw .wrongState("The current proposal allows '\(destination.allowed.rawValue)': a drop needs copy or move")
        }
        state = .dropped
        operation = destination.allowed
        dropDestination = caller.uniqueName
        deadlineStart = Kernel.monotonicMicroseconds()
        report(self, .dropped(on: caller, operation: destination.allowed))
        return destination.allowed
    }

    func conclude(by caller: AppIdentity) throws(BrokerError) {
        // The party first: a stranger must not learn the session's state from the refusal.
        try requireParticipant(caller)
        guard state != .copied else {
            throw .wrongState("Session \(id) is a pasteboard entry: Conclude the session that Paste returned")
        }
        guard state != .active else {
            throw .wrongState("Session \(id) has not been dropped: only the drop destination concludes it")
        }
        guard caller.uniqueName == dropDestination else {
            throw .accessDenied("Only the destination that performed the \(kind == .drag ? "drop" : "paste") may conclude session \(id)")
        }
        guard state == .dropped || state == .pasted else {
            throw .wrongState("Session \(id) is already concluded")
        }
        state = .concluded
        report(self, .concluded)
        if loads.isEmpty { finishTransfer() }
    }

    // MARK: Pasteboard

    /// Calls that only a drag has.
    private func requireDrag(toCall member: String) throws(BrokerError) {
        guard kind == .drag else {
            throw .wrongState(state == .copied
                ? "Session \(id) is a pasteboard entry: \(member) is for drags; paste it with Paste"
                : "Session \(id) is a paste: \(member) is for drags")
        }
    }

    /// The user pasted the entry in `caller`: checks that it is an entry with something the
    /// caller may see, and numbers the paste. The registry makes the paste's session.
    func pasteID(for caller: AppIdentity, flow: FlowView) throws(BrokerError) -> String {
        try requireParticipant(caller)
        guard state == .copied else {
            throw .wrongState(kind == .drag ? "Session \(id) is a drag: Paste is for pasteboard entries; a drag is dropped with PerformDrop"
                                            : "Session \(id) is a paste: call Paste on its pasteboard entry")
        }
        guard hasDroppable(for: caller, flow: flow) else {
            if let (_, rule) = firstFlowDenial(to: caller, flow: flow) {
                var error = BrokerError.accessDenied(
                    "The administrator's policy forbids pasting from \(source.appID) to \(caller.appID) (rule at \(rule.origin))")
                error.rule = "\(rule.origin)"
                throw error
            }
            throw .notFound("Pasteboard entry \(id) has nothing that \(caller.appID) may see")
        }
        pasteCount += 1
        return "\(id)_\(pasteCount)"
    }

    /// A new paste session begins as a drop ends: its destination alone, with a copy.
    func beginPaste(by caller: AppIdentity) {
        destinations[caller.uniqueName] = Destination(identity: caller, proposal: .copy, allowed: .copy, entered: true)
        dropDestination = caller.uniqueName
        state = .pasted
        operation = .copy
        deadlineStart = Kernel.monotonicMicroseconds()
    }

    /// What the entry's source may also put on the window system's clipboard in the clear, for
    /// apps that do not speak the protocol: its first item's representations that any app
    /// could see and that flow rules let reach an app the broker knows nothing of. The rule
    /// lives here, so no client library decides it.
    func clearOffers(to caller: AppIdentity, flow: FlowView, allowed: Bool) throws(BrokerError) -> [String] {
        guard caller.uniqueName == source.uniqueName else {
            throw .accessDenied("Only the source of pasteboard entry \(id) may ask what it may offer in the clear")
        }
        guard state == .copied else {
            throw .wrongState("Session \(id) is no pasteboard entry: only an entry's representations are offered on the clipboard")
        }
        guard allowed, let first = items.first else { return [] }
        return first.representations.filter {
            $0.visibility == .all && flow.reachesUnknownApps($0.typeIdentifier, from: source, through: .paste)
        }.map(\.typeIdentifier)
    }

    /// Tells the entry's source, before any load of it, that `paste` began.
    func announce(_ paste: Session) {
        report(self, .pastedFrom(paste))
    }

    // MARK: Loads

    /// Checks a load request against the session's state, visibility and the policy, and
    /// hands out the load's ID. Nothing has started yet.
    func authorizeLoad(item: UInt32, type: String, by caller: AppIdentity, rules: LoadRules) throws(BrokerError) -> LoadRequest {
        // The party first: a stranger must not learn the session's state from the refusal.
        try requireParticipant(caller)
        switch state {
        case .active:
            throw .wrongState("Loads are allowed only after PerformDrop")
        case .copied:
            throw .wrongState("Session \(id) is a pasteboard entry: call Paste, then Load from the session it returns")
        case .concluded:
            throw .wrongState("Session \(id) was concluded: no new loads")
        case .dropped, .pasted:
            break
        }
        guard caller.uniqueName == dropDestination else {
            throw .accessDenied("Only the destination that performed the \(kind == .drag ? "drop" : "paste") may load from session \(id)")
        }
        let resolution = try resolveLoad(item: item, type: type, by: caller, flow: rules.flow)
        guard loads.count < rules.limits.concurrentLoadsPerSession else {
            throw .limitExceeded("Session \(id) already has \(loads.count) loads in flight")
        }
        // A log counting records as lost cannot promise this transfer's end: refuse at once.
        // Otherwise each load's own start record decides, as it starts (`Load`).
        if rules.auditRefuses {
            throw Load.auditRefusal
        }
        let representation = resolution.representation
        defer { nextLoadID += 1 }
        return LoadRequest(id: nextLoadID, item: UInt32(resolution.item), typeIdentifier: representation.typeIdentifier,
                           kind: representation.kind, destination: caller, sizeRule: resolution.sizeRule)
    }

    /// What a load request names, for `caller` under `flow`: the item's real index, the one
    /// representation served, and the size rule on it. Kept once worked out, for a drop's
    /// loads ask for the same few again and again, and working one out (the items the caller
    /// may see, the pattern, the closest match, the rules) was a third of a load's start.
    /// Kept answers hold while the caller's identity and the policy are the ones they
    /// were worked out for (a reload makes new identities and a new generation); the items
    /// cannot change once loads are allowed (`addItems` is for active drags).
    private func resolveLoad(item: UInt32, type: String, by caller: AppIdentity, flow: FlowView) throws(BrokerError) -> LoadResolution {
        let key = LoadResolution.Key(item: item, type: type)
        if let kept = loadResolutionsFor, kept.identity === caller, kept.generation == flow.generation {
            if let known = loadResolutions[key] { return known }
        } else {
            loadResolutions = [:]
            loadResolutionsFor = (caller, flow.generation)
        }
        guard let (realItem, listed) = visibleItem(at: Int(item), for: caller, flow: flow) else {
            throw .notFound("No item \(item): session \(id) has \(visibleItems(for: caller, flow: flow).count) item(s)")
        }
        let pattern: TypePattern
        do {
            pattern = try TypePattern(type)
        } catch {
            throw .invalidArgument(error.message)
        }
        // The one matching rule: whatever ConformingItems says yes to, this serves, and the
        // closest listed type wins, the first listed among equally close ones.
        guard let position = flow.types.select(among: listed.map(listedType), for: [pattern]),
              let representation = items[realItem].representations.first(where: { $0.typeIdentifier == listed[position] }) else {
            throw .notFound("Item \(item) has no representation that matches '\(type)'")
        }
        let resolution = LoadResolution(item: realItem, representation: representation,
                                        sizeRule: flow.byteLimit(of: representation.typeIdentifier, from: source, to: caller, through: channel))
        // A client names what it likes: what is kept stays bounded (a pattern that parsed is
        // at most 255 bytes).
        if loadResolutions.count >= LoadResolution.limit { loadResolutions.removeAll(keepingCapacity: true) }
        loadResolutions[key] = resolution
        return resolution
    }

    /// Opens a load: checks the request (`authorizeLoad`), lets `admit` refuse it on the
    /// daemon's shares, then puts the load on record and follows it to its one outcome. The
    /// load has not started: its start waits for that record (`Load.start`).
    func openLoad(item: UInt32, type: String, by caller: AppIdentity, rules: LoadRules,
                  admit: (LoadRequest) throws(BrokerError) -> Void) throws(BrokerError) -> Load {
        let request = try authorizeLoad(item: item, type: type, by: caller, rules: rules)
        try admit(request)
        let load = Load(request, failClosed: rules.failClosed)
        track(load)
        return load
    }

    private func track(_ load: Load) {
        loads[load.id] = load
        load.onProgress = { [unowned self] load in report(self, .loadProgressed(load)) }
        load.onFinish = { [unowned self] load, error in loadFinished(load, error: error) }
        report(self, .loadStarted(load))
    }

    private func loadFinished(_ load: Load, error: BrokerError?) {
        guard loads.removeValue(forKey: load.id) != nil else { return }
        finishedBytes += load.bytes
        if loads.isEmpty { deadlineStart = Kernel.monotonicMicroseconds() }
        report(self, .loadFinished(load, error: error))
        if state == .concluded && loads.isEmpty { finishTransfer() }
    }

    /// The source announces how many bytes a data load will carry.
    func setExpectedSize(_ size: UInt64, load id: UInt32, by caller: AppIdentity) throws(BrokerError) {
        guard caller.uniqueName == source.uniqueName else {
            throw .accessDenied("Only the source of session \(self.id) may announce a load's size")
        }
        guard let load = loads[id] else {
            // The announcement raced the end of the load: nothing left to tell.
            if id > 0 && id < nextLoadID { return }
            throw .notFound("No load \(id) in session \(self.id)")
        }
        load.expected = size
        report(self, .loadSizeAnnounced(load))
    }

    /// Either end, or an administrator, cancels a load; the other side hears `Cancelled`.
    func cancelLoad(_ id: UInt32, by caller: AppIdentity, asAdministrator: Bool = false) throws(BrokerError) {
        guard let load = loads[id] else { throw .notFound("No load \(id) in flight in session \(self.id)") }
        let who: String
        if asAdministrator {
            who = "An administrator"
        } else if caller.uniqueName == load.destination.uniqueName {
            who = "The destination"
        } else if caller.uniqueName == source.uniqueName {
            who = "The source"
        } else {
            throw .accessDenied("Only the load's destination, the session's source or an administrator may cancel load \(id)")
        }
        load.stop(BrokerError(.cancelled, "\(who) cancelled load \(id)"))
    }

    /// Bytes done (finished loads and those in flight) and expected (announced sizes).
    var progress: (done: UInt64, expected: UInt64) {
        let inFlight = loads.values.reduce(UInt64(0)) { $0 + $1.bytes }
        let expected = loads.values.reduce(finishedBytes) { $0 + ($1.expected ?? $1.bytes) }
        return (finishedBytes + inFlight, expected)
    }

    // MARK: Ending

    /// When the session ends unless something happens: a drag not dropped within
    /// `dragTimeout` of its beginning, a drop not followed by a load or `Conclude` within
    /// `concludeTimeout`. Loads in flight have deadlines of their own, and a concluded session
    /// ends with its last load.
    func deadline(_ limits: Limits) -> UInt64? {
        switch (state, kind) {
        case (.active, _): deadlineStart + limits.dragTimeout
        case (.copied, .copy(let lifetime)): deadlineStart + lifetime
        case (.dropped, _) where loads.isEmpty, (.pasted, _) where loads.isEmpty: deadlineStart + limits.concludeTimeout
        case (.copied, _), (.dropped, _), (.pasted, _), (.concluded, _): nil
        }
    }

    /// The deadline passed: every party hears `Timeout`, naming the deadline.
    func timeOut(_ limits: Limits) {
        switch state {
        case .active:
            end(outcome: .timedOut, error: BrokerError(.timeout,
                "Session \(id) was not dropped within \(limits.dragTimeout / 1_000_000) s of BeginSession (DragTimeoutSec=)"))
        case .copied:
            guard case .copy(let lifetime) = kind else { return }
            end(outcome: .expired, error: BrokerError(.timeout,
                "The pasteboard entry \(id) expired \(lifetime / 1_000_000) s after Copy"))
        case .dropped, .pasted:
            end(outcome: .timedOut, error: BrokerError(.timeout,
                "The destination of session \(id) neither loaded nor concluded within \(limits.concludeTimeout / 1_000_000) s (ConcludeTimeoutSec=)"))
        case .concluded:
            break
        }
    }

    /// Ends the session early: loads stop, every party is told why. `loadOutcome` names the
    /// loads' end in the log when their error alone would not.
    func end(outcome: SessionOutcome, error: BrokerError, loadOutcome: LoadOutcome? = nil) {
        guard !isOver else { return }
        for load in loads.values.sorted(by: { $0.id < $1.id }) { load.stop(error, outcome: loadOutcome) }
        if state == .active { operation = .cancel }
        retire(outcome: outcome, error: error)
    }

    /// Whether the session ends when `uniqueName` goes away: it is the source or the drop destination.
    func dependsOn(_ uniqueName: String) -> Bool {
        uniqueName == source.uniqueName || uniqueName == dropDestination
    }

    /// A party's connection went away: end what depends on it, forget it otherwise.
    func partyVanished(_ uniqueName: String) {
        if dependsOn(uniqueName) { departed = uniqueName }
        if uniqueName == source.uniqueName {
            end(outcome: .sourceDisconnected, error: BrokerError(.disconnected, "The source app \(source.appID) disconnected"))
        } else if uniqueName == dropDestination {
            end(outcome: .destinationDisconnected,
                error: BrokerError(.disconnected, "The destination app \(destinations[uniqueName]?.identity.appID ?? uniqueName) disconnected"))
        } else if destinations.removeValue(forKey: uniqueName) != nil, current == uniqueName {
            current = nil
        }
    }

    /// The drop destination concluded and every load is done: tell the source and retire.
    private func finishTransfer() {
        report(self, .transferFinished)
        retire(outcome: .completed, error: nil)
    }

    private func retire(outcome: SessionOutcome, error: BrokerError?) {
        guard !isOver else { return }
        isOver = true
        report(self, .ended(outcome: outcome, error: error))
    }
}

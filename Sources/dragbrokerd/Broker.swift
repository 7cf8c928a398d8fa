import BrokerPolicy
import BrokerProtocol
import BusKit
import CSystemd
import Foundation
import Logging
import TransferLog
import UniformTypes

/// The daemon's state and rules: live sessions, who takes part in each, and their loads.
/// Confined to the event loop thread, as are all bus callbacks that reach it.
final class Broker {
    let bus: Bus
    let logger: Logger
    let policyDirectory: String
    let types: MimeDatabase
    let transferLog: TransferLog
    private let identities: IdentityResolver
    private(set) var sessions: [String: Session] = [:]
    private var nextSessionNumber = 1
    private var manager: ManagerObject?
    private var objectManager: Slot?
    private var peerWatch: Slot?
    private var retiredSessions: Slot?
    private var sessionObjects: ExportedSubtree?
    private(set) lazy var monitors = Monitors(broker: self)
    /// With `--exit-idle-time`, how long to stay up with no session, in microseconds.
    var idleExit: UInt64?
    private var idleTimer: LoopTimer?
    /// Called when the daemon has been idle for `idleExit`.
    var onIdle: (() -> Void)?

    init(bus: Bus, transferLog: TransferLog, policy: Policy, policyDirectory: String, types: MimeDatabase, logger: Logger) {
        self.bus = bus
        self.transferLog = transferLog
        self.identities = IdentityResolver(policy: policy)
        self.policyDirectory = policyDirectory
        self.types = types
        self.logger = logger
        do {
            nextSessionNumber = try transferLog.highestSessionNumber(prefix: Self.sessionIDPrefix) + 1
        } catch {
            logger.warning("Failed to read the last session ID from the transfer log: \(error), numbering from 1")
        }
    }

    static let sessionIDPrefix = "s"

    /// Exports the manager and starts watching peers. Call before owning the bus name, so
    /// nobody can reach a half-built daemon.
    func start() throws(BusError) {
        objectManager = try bus.addObjectManager(path: BrokerNames.managerPath)
        manager = try ManagerObject(broker: self)
        let sessionsPrefix = BrokerNames.sessionPath(id: "").dropLast().description
        // Session objects exist per caller: a restricted session is no object at all for
        // another app, not in introspection, not in ObjectManager, not to call.
        sessionObjects = try bus.exportSubtree(
            prefix: sessionsPrefix, interface: BrokerInterfaces.session, template: SessionObject.template,
            find: { [unowned self] path, caller in
                guard let session = sessions.values.first(where: { $0.path == path }), isAddressable(session, by: caller) else { return nil }
                return session.object?.handlers
            },
            enumerate: { [unowned self] caller in
                sessions.values.filter { isListed($0, to: caller) }.map(\.path).sorted()
            })
        // A call on a session that ended, or that does not exist for the caller, gets a broker
        // error, not sd-bus's UnknownObject.
        retiredSessions = try bus.addFallback(prefix: sessionsPrefix) { [unowned self] call in
            guard call.message.interface == BrokerNames.sessionInterface, let path = call.message.path else { return false }
            if let session = sessions.values.first(where: { $0.path == path }), isAddressable(session, by: call.sender) { return false }
            call.fail(BrokerError.notFound("No live session at \(path): it ended or never existed").busError)
            return true
        }
        peerWatch = try bus.matchSignal(sender: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                        interface: "org.freedesktop.DBus", member: "NameOwnerChanged") { [unowned self] m in
            guard let name = try? m.readString(), let _ = try? m.readString(), let newOwner = try? m.readString(),
                  name.hasPrefix(":"), newOwner.isEmpty else { return }
            peerVanished(name)
        }
    }

    /// Whether `caller` may address the session's object at all: a restricted session exists
    /// only for its own app. Our own emissions have no caller.
    private func isAddressable(_ session: Session, by caller: String?) -> Bool {
        guard session.options.restrictedToApp, let caller else { return true }
        guard let identity = try? identity(ofName: caller) else { return false }
        return identity.isSameApp(as: session.source)
    }

    /// Whether the session's object shows among the manager's children for `caller`: to
    /// its parties and to those who may inspect it, as ListSessions decides.
    private func isListed(_ session: Session, to caller: String?) -> Bool {
        guard let caller else { return true }
        if caller == session.source.uniqueName || session.destinations[caller] != nil { return true }
        guard let identity = try? identity(ofName: caller) else { return false }
        return ManagerObject.mayInspect(session, identity)
    }

    /// Ends every session with a reason and flushes the transfer log.
    func shutdown() {
        _ = shim_notify("STOPPING=1\nSTATUS=Ending \(sessions.count) session(s)")
        for session in Array(sessions.values) {
            end(session, outcome: "cancelled", error: BrokerError(.cancelled, "The broker is shutting down"))
        }
        bus.flush()
        transferLog.flush()
    }

    var policy: Policy { identities.policy }
    var limits: Limits { Limits(policy.limits) }

    /// The session count changed: tell the bus, systemd's status line, and the idle timer.
    func sessionsChanged() {
        manager?.sessionCountChanged()
        _ = shim_notify("STATUS=\(sessions.count) live session\(sessions.count == 1 ? "" : "s")")
        armIdleTimer()
    }

    /// Arms the idle timer only while there is no session: never a periodic wakeup.
    func armIdleTimer() {
        guard let idleExit, sessions.isEmpty else {
            idleTimer = nil
            return
        }
        idleTimer = try? LoopTimer(loop: bus.loop, afterMicroseconds: idleExit) { [unowned self] in
            guard sessions.isEmpty else { return }
            logger.info("No session for \(idleExit / 1_000_000) s, exiting")
            onIdle?()
        }
    }

    func identity(of call: MethodCall) throws(BrokerError) -> AppIdentity {
        try identities.identity(of: call)
    }

    func identity(ofName uniqueName: String) throws(BrokerError) -> AppIdentity {
        try identities.identity(ofName: uniqueName, on: bus)
    }

    // MARK: Policy

    /// Loads the policy directory and applies it only if every file is valid: a bad file
    /// never half-applies. Live sessions keep their source's identity; every later call is
    /// judged by the new registry, rules and limits.
    func reloadPolicy() throws(BrokerError) {
        let policy: Policy
        do {
            policy = try Self.loadPolicy(directory: policyDirectory)
        } catch {
            logger.error("Failed to reload the policy, keeping the current one: \(error)")
            throw BrokerError(.invalidArgument, "The policy was not reloaded: \(error)")
        }
        identities.apply(policy)
        applyRetention()
        logger.info("Reloaded the policy from \(policy.files.isEmpty ? "defaults" : policy.files.joined(separator: ", "))")
    }

    /// Drops log records older than `RetentionDays=` (0 keeps everything). Runs at start,
    /// before the bus is served, and after a reload; not on a dispatch queue, whose thread
    /// pool would keep a once-a-second monitor timer alive in an idle daemon.
    func applyRetention() {
        let days = policy.audit.retentionDays
        guard days > 0 else { return }
        do {
            let removed = try transferLog.prune(endedBefore: Date().addingTimeInterval(-Double(days) * 86_400))
            if removed > 0 { logger.info("Removed \(removed) transfer log record(s) older than \(days) days") }
        } catch {
            logger.warning("Failed to apply the log's retention: \(error), ignoring")
        }
    }

    static func loadPolicy(directory: String) throws(PolicyError) -> Policy {
        try PolicyLoader.load(directory: directory) { pattern in try MimeDatabase.validatePattern(pattern) }
    }

    /// The policy's view of a party to a flow.
    func party(_ identity: AppIdentity) -> Policy.FlowParty {
        Policy.FlowParty(appID: identity.appID, team: identity.team, managed: identity.managed)
    }

    // MARK: Audit of refusals

    /// Refusals recorded per connection before the rest are only counted: a client cannot
    /// grow the log without bound by asking for what it may not have.
    static let refusalsRecordedPerConnection = 1000
    private var refusalCounts: [String: Int] = [:]

    /// Records a refusal beside the transfers: who asked, for what, and why.
    func recordRefusal(_ error: BrokerError, sender: String, action: String, session: Session?, subject: String?) {
        let count = refusalCounts[sender, default: 0] + 1
        refusalCounts[sender] = count
        if count > Self.refusalsRecordedPerConnection {
            if count == Self.refusalsRecordedPerConnection + 1 {
                logger.warning("Connection \(sender) was refused \(Self.refusalsRecordedPerConnection) times; further refusals are not recorded one by one")
            }
            return
        }
        let identity = identities.known(sender)
        let record = RefusalRecord(
            at: Date(), app: identity?.appID ?? sender, uid: Int64(identity?.uid ?? 0), pid: Int64(identity?.pid ?? 0),
            action: action, sessionID: session?.id, subject: subject, errorName: error.code.busName,
            message: error.message, rule: error.rule)
        transferLog.submit(.refusal(record))
        AuditJournal.record(record)
        logger.debug("Refused \(action) for \(identity?.appID ?? sender): \(error)")
    }

    // MARK: Source

    func begin(source: AppIdentity, items: [ItemDescriptor], options: SessionOptions, providerPath: String) throws(BrokerError) -> Session {
        guard sessions.count < limits.sessionsTotal else {
            throw .limitExceeded("The broker holds \(sessions.count) sessions, its limit")
        }
        let own = sessions.values.filter { $0.source.uniqueName == source.uniqueName }.count
        guard own < limits.sessionsPerConnection else {
            throw .limitExceeded("This connection already has \(own) live sessions (limit \(limits.sessionsPerConnection))")
        }
        let id = "\(Self.sessionIDPrefix)\(nextSessionNumber)"
        nextSessionNumber += 1
        let session = Session(id: id, token: try Self.randomToken(), source: source, providerPath: providerPath,
                              items: items, options: options)
        session.object = SessionObject(broker: self, session: session)
        sessions[id] = session
        // ObjectManager signals are broadcast: a restricted session must not announce itself.
        if !options.restrictedToApp { try? bus.emitObjectAdded(path: session.path) }
        sessionsChanged()
        logger.info("Session \(id) begun by \(source.appID) (pid \(source.pid)) with \(items.count) item(s)")
        monitors.emit(session, "begin", "\(source.appID), \(items.count) item\(items.count == 1 ? "" : "s")")
        return session
    }

    /// Flocking: more items on a live drag, from the source's own app only.
    func addItems(_ items: [ItemDescriptor], by caller: AppIdentity, to session: Session) throws(BrokerError) {
        guard caller.isSameApp(as: session.source) else {
            throw .accessDenied("Only \(session.source.appID) may add items to session \(session.id): cross-app flocking is not allowed")
        }
        guard session.state == .active else {
            throw .wrongState("Session \(session.id) is \(session.state.rawValue): items can be added only while dragging")
        }
        guard session.items.count + items.count <= limits.itemsPerSession else {
            throw .limitExceeded("A session holds at most \(limits.itemsPerSession) items; session \(session.id) has \(session.items.count)")
        }
        session.items += items
        session.object?.itemsChanged()
    }

    /// Validates items from a client: every type a MIME type or known UTI (stored canonical),
    /// names sanitised, counts and lengths within the limits.
    func normalize(_ items: [ItemDescriptor]) throws(BrokerError) -> [ItemDescriptor] {
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

    func cancel(_ session: Session, by caller: AppIdentity) throws(BrokerError) {
        guard caller.uniqueName == session.source.uniqueName else {
            throw .accessDenied("Only the source of session \(session.id) may cancel it")
        }
        end(session, outcome: "cancelled", error: BrokerError(.cancelled, "The source cancelled the drag"))
    }

    // MARK: Destination

    func present(token: String, by caller: AppIdentity) throws(BrokerError) -> Session {
        guard let bytes = Self.decodeHex(token), token.count <= limits.tokenLength,
              let session = sessions.values.first(where: { $0.matches(token: bytes) }), session.isVisible(to: caller) else {
            throw .notFound("No live session has this token")
        }
        if session.destinations[caller.uniqueName] == nil {
            guard session.destinations.count < limits.destinationsPerSession else {
                throw .limitExceeded("Session \(session.id) already has \(session.destinations.count) destinations")
            }
            session.destinations[caller.uniqueName] = Session.Destination(identity: caller)
        }
        return session
    }

    /// Source and destinations may describe a session; nobody else learns anything of it.
    func requireParticipant(_ caller: AppIdentity, _ session: Session) throws(BrokerError) {
        guard caller.uniqueName == session.source.uniqueName || session.destinations[caller.uniqueName] != nil else {
            throw .accessDenied("Present the session token with PresentToken before using session \(session.id)")
        }
    }

    func propose(_ proposal: DropOperation, by caller: AppIdentity, in session: Session, entering: Bool) throws(BrokerError) -> DropOperation {
        guard var destination = session.destinations[caller.uniqueName] else {
            throw .accessDenied("Present the session token with PresentToken before proposing a drop")
        }
        guard session.state == .active else {
            throw .wrongState("Session \(session.id) is \(session.state.rawValue): proposals are over")
        }
        if !entering && session.current != caller.uniqueName {
            throw .wrongState("Call Enter before Update: the drag is not over this destination")
        }
        destination.proposal = proposal
        destination.allowed = session.allowedOperation(for: proposal, by: caller)
        session.destinations[caller.uniqueName] = destination
        session.current = caller.uniqueName
        monitors.emit(session, entering ? "enter" : "update", "\(caller.appID) proposes \(proposal.rawValue), allowed \(destination.allowed.rawValue)")
        return destination.allowed
    }

    func exit(by caller: AppIdentity, from session: Session) throws(BrokerError) {
        guard session.destinations[caller.uniqueName] != nil else {
            throw .accessDenied("Present the session token with PresentToken before using session \(session.id)")
        }
        if session.current == caller.uniqueName { session.current = nil }
        monitors.emit(session, "exit", caller.appID)
    }

    func performDrop(by caller: AppIdentity, in session: Session) throws(BrokerError) -> DropOperation {
        guard let destination = session.destinations[caller.uniqueName] else {
            throw .accessDenied("Present the session token with PresentToken before performing a drop")
        }
        guard session.state == .active else {
            throw .wrongState("Session \(session.id) is \(session.state.rawValue): it has already been dropped")
        }
        guard session.current == caller.uniqueName else {
            throw .wrongState("Call Enter with a proposal before PerformDrop")
        }
        guard destination.allowed == .copy || destination.allowed == .move else {
            throw .wrongState("The current proposal allows '\(destination.allowed.rawValue)': a drop needs copy or move")
        }
        session.state = .dropped
        session.operation = destination.allowed
        session.dropDestination = caller.uniqueName
        session.object?.stateChanged()
        session.object?.emitWillEnd()
        logger.info("Session \(session.id) dropped on \(caller.appID) with \(destination.allowed.rawValue)")
        monitors.emit(session, "drop", "\(caller.appID), \(destination.allowed.rawValue)")
        return destination.allowed
    }

    func conclude(by caller: AppIdentity, _ session: Session) throws(BrokerError) {
        guard session.state != .active else {
            throw .wrongState("Session \(session.id) has not been dropped: only the drop destination concludes it")
        }
        guard caller.uniqueName == session.dropDestination else {
            throw .accessDenied("Only the destination that performed the drop may conclude session \(session.id)")
        }
        guard session.state == .dropped else {
            throw .wrongState("Session \(session.id) is already concluded")
        }
        session.state = .concluded
        session.object?.stateChanged()
        session.object?.emitEnded(error: nil)
        if session.loads.isEmpty { finishTransfer(session) }
    }

    // MARK: Ending

    /// The drop destination concluded and every load is done: tell the source and retire the session.
    func finishTransfer(_ session: Session) {
        session.object?.emitTransferFinished()
        retire(session, outcome: "completed", error: nil)
    }

    /// Ends a session early: loads stop, every party is told why.
    func end(_ session: Session, outcome: String, error: BrokerError) {
        for load in Array(session.loads.values) {
            finishLoad(load, in: session, error: error)
        }
        if session.state != .concluded {
            if session.state == .active { session.operation = .cancel }
            session.object?.emitEnded(error: error)
        }
        retire(session, outcome: outcome, error: error)
    }

    private func retire(_ session: Session, outcome: String, error: BrokerError?) {
        guard sessions.removeValue(forKey: session.id) != nil else { return }
        if !session.options.restrictedToApp { try? bus.emitObjectRemoved(path: session.path) }
        // The object may be answering the very call that retired it: unexport it once that returns.
        let object = session.object
        session.object = nil
        bus.loop.soon { _ = object }
        sessionsChanged()
        let destination = session.dropDestination.flatMap { session.destinations[$0]?.identity.appID }
        transferLog.submit(.session(SessionRecord(
            sessionID: session.id, sourceApp: session.source.appID, destinationApp: destination,
            itemCount: session.items.count, operation: session.operation.rawValue, outcome: outcome,
            errorName: error?.code.busName, startedAt: session.createdAt, endedAt: Date())))
        monitors.emit(session, "end", outcome + (error.map { " (\($0.code.busName))" } ?? ""))
        logger.info("Session \(session.id) ended: \(outcome)\(error.map { " (\($0))" } ?? "")")
    }

    /// A peer's connection went away: tear down what depends on it and tell the others.
    private func peerVanished(_ uniqueName: String) {
        identities.forget(uniqueName)
        monitors.remove(uniqueName)
        if let count = refusalCounts.removeValue(forKey: uniqueName), count > Self.refusalsRecordedPerConnection {
            logger.notice("Connection \(uniqueName) left after \(count) refusals, \(count - Self.refusalsRecordedPerConnection) of them not recorded")
        }
        for session in Array(sessions.values) {
            if session.source.uniqueName == uniqueName {
                end(session, outcome: "source-disconnected",
                    error: BrokerError(.disconnected, "The source app \(session.source.appID) disconnected"))
            } else if session.dropDestination == uniqueName {
                end(session, outcome: "destination-disconnected",
                    error: BrokerError(.disconnected, "The destination app \(session.destinations[uniqueName]?.identity.appID ?? uniqueName) disconnected"))
            } else if session.destinations.removeValue(forKey: uniqueName) != nil, session.current == uniqueName {
                session.current = nil
            }
        }
    }

    // MARK: Tokens

    /// 256 bits from getrandom(2), hex-encoded for the windowing system's drag data.
    static func randomToken() throws(BrokerError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 32)
        let n = bytes.withUnsafeMutableBytes { shim_getrandom($0.baseAddress, $0.count) }
        guard n == 32 else { throw BrokerError(.failed, "Failed to read random bytes for a session token") }
        return bytes
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for b in bytes {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0xf)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func decodeHex(_ text: String) -> [UInt8]? {
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(chars.count / 2)
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            default: nil
            }
        }
        var i = 0
        while i < chars.count {
            guard let hi = value(chars[i]), let lo = value(chars[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        return out
    }
}

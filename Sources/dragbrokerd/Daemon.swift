// dragbrokerd's folders, in the order a call travels:
//   BusFace/   the D-Bus surface, one file per interface; errors become D-Bus names in Serve.swift
//   Identity/  who a caller is, from kernel-verified credentials (a new identity source goes here)
//   Sessions/  the model: Session (every rule), Registry (the live sessions), items and tokens
//   Transfer/  Load, the one type that moves bytes, and its splice pump
//   Audit/     the one sink for records, journal entries, monitor events and log lines
//   Policy/    the policy as the daemon applies it (a new policy key: BrokerPolicy's Policy.swift,
//              then Limits.swift here if it is a limit)
// This file wires them together and owns the daemon's life: start, reload, idle exit, shutdown.
import BrokerPolicy
import BrokerProtocol
import BusKit
import Foundation
import Logging
import SystemCalls
import TransferLog
import UniformTypes

/// The running daemon: the registry, the audit sink and the bus faces, and what connects them.
/// Everything here runs on the event loop thread, as do all bus callbacks that reach it.
final class Daemon {
    let bus: Bus
    let logger: Logger
    let registry: Registry
    let audit: AuditSink
    let dispatcher: Dispatcher
    /// Where clients' descriptors are handled, off the loop.
    let descriptors: ClientDescriptors
    private let policyDirectory: String
    private var manager: ManagerInterface?
    private var sessionInterface: SessionInterface?
    private var objectManager: Slot?
    private var peerWatch: Slot?
    private var countChangePending = false
    /// With `--exit-idle-time`, how long to stay up with no session, in microseconds.
    var idleExit: UInt64?
    /// How often retention runs besides at start and on reload (monotonic µs), and when it
    /// last ran: see `applyRetentionIfDue`.
    var retentionInterval = Daemon.defaultRetentionInterval
    static let defaultRetentionInterval: UInt64 = 86_400 * 1_000_000
    private var lastRetention: UInt64 = 0
    private var idleTimer: LoopTimer?
    /// Called when the daemon has been idle for `idleExit`.
    var onIdle: (() -> Void)?

    init(bus: Bus, transferLog: TransferLog, ledger: InFlightLedger, policy: Policy, policyDirectory: String, types: MimeDatabase,
         sessionNumbers: SessionNumbers, logger: Logger) {
        self.bus = bus
        self.logger = logger
        self.policyDirectory = policyDirectory
        registry = Registry(policy: policy, types: types, sessionNumbers: sessionNumbers)
        audit = AuditSink(transferLog: transferLog, ledger: ledger, monitors: Monitors(bus: bus, logger: logger), loop: bus.loop, logger: logger)
        dispatcher = Dispatcher(audit: audit, identities: registry.identities, logger: logger, delayed: DelayedRefusals(loop: bus.loop),
                                afterReplies: AfterReplies(loop: bus.loop))
        descriptors = ClientDescriptors(workers: BlockingWorkers(bounds: Limits(policy.limits).descriptorThreads), bus: bus)
        applyBounds(of: policy)
    }

    /// The policy's bounds that live outside the registry: descriptor threads and refusal rates.
    private func applyBounds(of policy: Policy) {
        let limits = Limits(policy.limits)
        descriptors.workers.bounds = limits.descriptorThreads
        audit.refusalRule = limits.refusalRate
    }

    /// Exports the interfaces and starts watching peers. Call before owning the bus name, so
    /// nobody can reach a half-built daemon.
    func start() throws(BusError) {
        objectManager = try bus.addObjectManager(path: BrokerNames.managerPath)
        manager = try ManagerInterface(daemon: self)
        sessionInterface = try SessionInterface(daemon: self)
        registry.later = { [loop = bus.loop] work in loop.soon(work) }
        registry.schedule = { [loop = bus.loop, logger] delay, fire in
            do {
                return try LoopTimer(loop: loop, afterMicroseconds: delay, callback: fire)
            } catch {
                logger.error("Failed to arm the sessions' deadline timer, sessions may outlive their deadlines until the next one is armed: \(error)")
                return nil
            }
        }
        registry.onEvent = { [unowned self] session, event in
            sessionInterface?.publish(session, event)
            switch event {
            case .began, .ended: sessionsChanged()
            default: break
            }
            audit.record(session, event)
        }
        peerWatch = try bus.matchSignal(sender: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                        interface: "org.freedesktop.DBus", member: "NameOwnerChanged") { [unowned self] m in
            guard let name = try? m.readString(), let _ = try? m.readString(), let newOwner = try? m.readString(),
                  name.hasPrefix(":"), newOwner.isEmpty else { return }
            registry.peerVanished(name)
            audit.peerLeft(name)
        }
    }

    func identity(of call: MethodCall) throws(BrokerError) -> AppIdentity {
        try registry.identities.identity(of: call)
    }

    func identity(ofName uniqueName: String) throws(BrokerError) -> AppIdentity {
        try registry.identities.identity(ofName: uniqueName, on: bus)
    }

    /// What a load is judged by right now.
    var loadRules: LoadRules {
        let policy = registry.policy
        return LoadRules(flow: registry.flow, limits: Limits(policy.limits),
                         auditRefuses: policy.audit.failClosed && audit.isLosingRecords, failClosed: policy.audit.failClosed)
    }

    /// The session count changed: tell the bus, systemd's status line and the idle timer, once
    /// per loop iteration however many sessions came or went in it (a source leaving with
    /// thousands of sessions costs one signal, not thousands).
    private func sessionsChanged() {
        guard !countChangePending else { return }
        countChangePending = true
        bus.loop.soon { [weak self] in
            guard let self else { return }
            countChangePending = false
            manager?.sessionCountChanged()
            let count = registry.count
            ServiceManager.notify("STATUS=\(count) live session\(count == 1 ? "" : "s")")
            armIdleTimer()
            applyRetentionIfDue()
        }
    }

    /// A daemon that never idles out must still forget what `RetentionDays=` says to: as
    /// sessions come and go, retention runs again once a day has passed since it last did.
    /// Records only grow with sessions, so this needs no timer of its own, and an idle
    /// daemon keeps sleeping.
    private func applyRetentionIfDue() {
        guard Kernel.monotonicMicroseconds() - lastRetention >= retentionInterval else { return }
        applyRetention()
    }

    /// Arms the idle timer only while there is no session: never a periodic wakeup.
    func armIdleTimer() {
        guard let idleExit, registry.count == 0 else {
            idleTimer = nil
            return
        }
        idleTimer = try? LoopTimer(loop: bus.loop, afterMicroseconds: idleExit) { [unowned self] in
            guard registry.count == 0 else { return }
            logger.info("No session for \(idleExit / 1_000_000) s, exiting")
            onIdle?()
        }
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
        registry.identities.apply(policy)
        applyBounds(of: policy)
        // New deadlines apply to live sessions too: one already past them ends now.
        registry.expireDeadlines(at: Kernel.monotonicMicroseconds())
        applyRetention()
        logger.info("Reloaded the policy from \(policy.files.isEmpty ? "defaults" : policy.files.joined(separator: ", "))")
    }

    static func loadPolicy(directory: String) throws(PolicyError) -> Policy {
        try PolicyLoader.load(directory: directory) { pattern in try MimeDatabase.validatePattern(pattern) }
    }

    /// Drops log records older than `RetentionDays=` (0 keeps everything), on the log's writer
    /// queue: the bus loop never waits for SQLite, whose delete may wait seconds for a lock.
    func applyRetention() {
        lastRetention = Kernel.monotonicMicroseconds()
        let days = registry.policy.audit.retentionDays
        guard days > 0 else { return }
        audit.transferLog.prune(endedBefore: Date().addingTimeInterval(-Double(days) * 86_400)) { [logger] result in
            switch result {
            case .success(let removed):
                if removed > 0 { logger.info("Removed \(removed) transfer log record(s) older than \(days) days") }
            case .failure(let error):
                logger.warning("Failed to apply the log's retention: \(error), ignoring")
            }
        }
    }

    // MARK: Shutdown

    /// The bus is gone: nobody can be told anything, so every session and load in flight is
    /// recorded as interrupted, and the log is flushed before the process exits.
    func busLost() {
        logger.critical("Lost the connection to the bus: recording \(registry.count) session(s) in flight as interrupted and exiting, so the service manager restarts the daemon")
        registry.endAll(BrokerError(.disconnected, "dragbrokerd lost its connection to the bus"),
                        outcome: .interrupted, loadOutcome: .interrupted)
        closeState()
    }

    /// Ends every session with a reason and flushes the transfer log.
    func shutdown() {
        ServiceManager.notify("STOPPING=1\nSTATUS=Ending \(registry.count) session(s)")
        dispatcher.afterReplies.runAll()
        registry.endAll(BrokerError(.cancelled, "The broker is shutting down"))
        audit.summarizeSuppressedRefusals()
        dispatcher.delayed.answerAll()
        bus.flush()
        closeState()
    }

    /// Nothing recorded may be lost once the process exits: the log synced and checkpointed,
    /// and the session numbers' mark brought back to the last one handed out.
    private func closeState() {
        do {
            try audit.transferLog.close()
        } catch {
            logger.error("Failed to sync the transfer log before exiting: \(error); the last second of records may be lost in a power cut")
        }
        do {
            try registry.sessionNumbers.close()
        } catch {
            logger.warning("Failed to record the last session ID before exiting: \(error); the next start skips the rest of the reserved block")
        }
    }
}

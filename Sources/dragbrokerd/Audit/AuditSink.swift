// Audit/ — where what happened is written down: one sink turns each session event and each
// refusal into its SQLite row (TransferLog), its journal entry, its monitor event and its log
// line. A new audited fact starts in `AuditSink`.
import BrokerPolicy
import BrokerProtocol
import BusKit
import Foundation
import Logging
import SystemCalls
import TransferLog

/// The one place an outcome or a refusal becomes a record, a journal entry, a monitor event
/// and a log line.
///
/// Sessions and loads are recorded write-ahead: an open record when they begin, completed in
/// place when they end, and a running load's bytes checkpointed between, so a daemon killed
/// mid-transfer leaves every transfer on record for the next one to close as interrupted.
final class AuditSink {
    let transferLog: TransferLog
    let monitors: Monitors
    /// Running loads, kept beside the log.
    let ledger: InFlightLedger
    private var ledgerSlots: [ObjectIdentifier: InFlightLedger.Slot] = [:]
    private let loop: EventLoop
    private let logger: Logger
    /// Refusals written one by one, per app and user, within each interval.
    private var refusalRate = RefusalRateLimit()
    /// The rule in force: the daemon sets it from the policy, at start and on every reload.
    var refusalRule = Limits().refusalRate
    private var summaryTimer: LoopTimer?

    init(transferLog: TransferLog, ledger: InFlightLedger, monitors: Monitors, loop: EventLoop, logger: Logger) {
        self.transferLog = transferLog
        self.ledger = ledger
        self.monitors = monitors
        self.loop = loop
        self.logger = logger
    }

    /// Whether records are being counted as lost rather than kept: no transfer can be sure of
    /// its end record, so fail-closed auditing refuses new ones without trying.
    var isLosingRecords: Bool { transferLog.isLosingRecords }

    // MARK: Sessions and loads

    func record(_ session: Session, _ event: SessionEvent) {
        switch event {
        case .began:
            transferLog.submit(.session(openRecord(of: session)))
            let count = session.items.count
            let items = "\(count) item\(count == 1 ? "" : "s")"
            switch session.kind {
            case .drag:
                logger.info("Session \(session.id) begun by \(session.source.appID) (pid \(session.source.pid)) with \(count) item(s)")
                monitors.emit(session, .begin, "\(session.source.appID), \(items)")
            case .copy:
                logger.info("Pasteboard entry \(session.id) copied by \(session.source.appID) (pid \(session.source.pid)) with \(count) item(s)")
                monitors.emit(session, .copy, "\(session.source.appID), \(items)")
            case .paste(let entry):
                let paster = session.owner
                logger.info("Session \(session.id) pastes \(entry) of \(session.source.appID) into \(paster.appID) (pid \(paster.pid))")
                monitors.emit(session, .paste, "\(entry) of \(session.source.appID) into \(paster.appID), \(items)")
            }
        case .proposed(let caller, let proposal, let allowed, let entering):
            monitors.emit(session, entering ? .enter : .update, "\(caller.appID) proposes \(proposal.rawValue), allowed \(allowed.rawValue)")
        case .exited(let caller):
            monitors.emit(session, .exit, caller.appID)
        case .flowDenied(let destination, let types, let rule):
            var error = BrokerError.accessDenied(
                "The administrator's policy hides \(types.joined(separator: ", ")) from \(session.source.appID) to \(destination.appID) (rule at \(rule.origin))")
            error.rule = "\(rule.origin)"
            refused(error, sender: destination.uniqueName, identity: destination, action: "PresentToken", session: session,
                    subject: types.joined(separator: ", "))
        case .dropped(let destination, let operation):
            var record = openRecord(of: session)
            record.destinationApp = destination.appID
            record.endedAt = Date()
            transferLog.submit(.session(record))
            logger.info("Session \(session.id) dropped on \(destination.appID) with \(operation.rawValue)")
            monitors.emit(session, .drop, "\(destination.appID), \(operation.rawValue)")
        case .loadStarted(let load):
            loadStarted(load, in: session)
            monitors.emit(session, .load, "\(load.id) \(load.typeIdentifier) (\(load.kind.rawValue)) to \(load.destination.appID)")
        case .loadProgressed(let load):
            monitors.emit(session, .progress, "\(load.id) \(load.typeIdentifier)", bytes: load.bytes, expected: load.expected ?? 0)
        case .loadFinished(let load, let error):
            loadEnded(load, in: session, error: error)
        case .ended(let outcome, let error):
            sessionEnded(session, outcome: outcome, error: error)
        case .itemsAdded, .concluded, .loadSizeAnnounced, .transferFinished, .pastedFrom:
            break
        }
    }

    private func openRecord(of session: Session) -> SessionRecord {
        SessionRecord(sessionID: session.id, kind: session.kindName, sourceApp: session.source.appID,
                      destinationApp: session.dropDestinationApp,
                      itemCount: session.items.count, operation: session.operation.rawValue, outcome: SessionRecord.open,
                      startedAt: session.createdAt, endedAt: session.createdAt)
    }

    private func loadRecord(_ load: Load, in session: Session, endedAt: Date, outcome: String, error: BrokerError?) -> LoadRecord {
        LoadRecord(
            sessionID: session.id, loadID: Int64(load.id), sourceApp: session.source.appID, destinationApp: load.destination.appID,
            typeIdentifier: load.typeIdentifier, bytes: Int64(load.bytes), startedAt: load.startedAt, endedAt: endedAt,
            outcome: outcome, errorName: error?.code.busName, sourceTeam: session.source.team, destinationTeam: load.destination.team)
    }

    /// A load is on record before its first byte moves: in the in-flight ledger, at the cost of
    /// a few memory stores, with its row written at its first checkpoint or its end. Without a
    /// ledger slot, or fail-closed, its open row goes first and the load hears when the attempt
    /// to write it is over; fail-closed, a row that does not commit is dropped, not kept, since
    /// the load is then refused and recorded as a refusal instead.
    private func loadStarted(_ load: Load, in session: Session) {
        let record = loadRecord(load, in: session, endedAt: load.startedAt, outcome: LoadRecord.open, error: nil)
        var sessionRecord = openRecord(of: session)
        sessionRecord.destinationApp = load.destination.appID
        let slot = ledger.claim(record, of: sessionRecord)
        if let slot { ledgerSlots[ObjectIdentifier(load)] = slot }
        if slot != nil && !load.failClosed {
            load.startRecorded(committed: true)
        } else {
            let waiting = LoopBound(load, loop: loop)
            let loop = loop
            let queued = transferLog.submit(.load(record), mustCommit: load.failClosed) { committed in
                loop.execute { waiting.value.startRecorded(committed: committed) }
            }
            if !queued {
                loop.execute { waiting.value.startRecorded(committed: false) }
            }
        }
        if let slot {
            load.onMoved = { [ledger] load in ledger.update(slot, bytes: Int64(load.bytes), at: Date()) }
        }
        load.onCheckpoint = { [transferLog] load in
            var checkpoint = record
            checkpoint.bytes = Int64(load.bytes)
            checkpoint.endedAt = Date()
            transferLog.checkpoint(checkpoint)
        }
    }

    private func loadEnded(_ load: Load, in session: Session, error: BrokerError?) {
        let record = loadRecord(load, in: session, endedAt: Date(), outcome: load.outcome(of: error).rawValue, error: error)
        let slot = ledgerSlots.removeValue(forKey: ObjectIdentifier(load))
        if !load.isUnrecorded {
            // The slot is given back once the end is on disk, however long a full disk delays it.
            if let slot {
                transferLog.submit(.load(record), mustCommit: false) { [ledger] committed in
                    if committed { ledger.release(slot) }
                }
            } else {
                transferLog.submit(.load(record))
            }
            AuditJournal.record(record)
        } else if let slot {
            ledger.release(slot)
        }
        monitors.emit(session, .loaded, "\(load.id) \(load.typeIdentifier) \(record.outcome)", bytes: load.bytes, expected: load.expected ?? load.bytes)
        if let error {
            logger.notice("Load \(load.id) of session \(session.id) (\(load.typeIdentifier)) failed after \(load.bytes) bytes: \(error)")
        } else {
            // Debug: the load's record already tells it, in the log and as the journal's structured
            // entry, and a line per load is the journal's work at hundreds of loads a second.
            logger.debug("Load \(load.id) of session \(session.id) (\(load.typeIdentifier), \(load.kind.rawValue)) delivered \(load.bytes) bytes")
        }
    }

    private func sessionEnded(_ session: Session, outcome: SessionOutcome, error: BrokerError?) {
        let record = SessionRecord(
            sessionID: session.id, kind: session.kindName, sourceApp: session.source.appID, destinationApp: session.dropDestinationApp,
            itemCount: session.items.count, operation: session.operation.rawValue, outcome: outcome.rawValue,
            errorName: error?.code.busName, startedAt: session.createdAt, endedAt: Date())
        transferLog.submit(.session(record))
        AuditJournal.record(record)
        monitors.emit(session, .end, outcome.rawValue + (error.map { " (\($0.code.busName))" } ?? ""))
        logger.info("Session \(session.id) ended: \(outcome.rawValue)\(error.map { " (\($0))" } ?? "")")
    }

    // MARK: The log itself

    /// One line per change of the log's state, so a full disk is told once when writes start
    /// failing and once when they work again, however many retries lie between.
    static func log(_ event: TransferLogEvent, to logger: Logger) {
        switch event {
        case .writesFailing(let error, let kept):
            logger.error("Failed to write the transfer log: \(error); keeping \(kept) record(s) in memory and retrying until it can be written")
        case .writesRecovered(let written, let after):
            logger.notice("The transfer log is writable again after \(String(format: "%.1f", after)) s: wrote \(written) record(s) that had waited")
        case .queueFull(let capacity):
            logger.critical("The transfer log's queue of unwritten records is full (\(capacity)): further records are counted, and recorded as a gap once the log can be written")
        case .gapRecorded(let gap):
            let message = "Recorded a gap in the transfer log: \(gap.lost) record(s) lost: \(gap.reason)"
            // Under journald the gap's own entry is this line, so the journal tells it once.
            if !AuditJournal.record(gap, message: message) {
                logger.error("\(message)")
            }
        case .rejected(let failure):
            logger.error("Failed to write the transfer log: \(failure)")
        }
    }

    // MARK: Refusals

    /// Records a refusal beside the transfers: who asked, for what, and why. Past its app's or
    /// its user's burst (`RefusalRateLimit`) it is counted instead, and summed up in one row;
    /// then it returns false.
    @discardableResult
    func refused(_ error: BrokerError, sender: String, identity: AppIdentity?, action: String, session: Session?, subject: String?) -> Bool {
        let now = Kernel.monotonicMicroseconds()
        let (write, ended) = refusalRate.admit(identity?.buckets ?? [.unidentified], uid: identity?.uid ?? 0, pid: identity?.pid ?? 0,
                                               rule: refusalRule, now: now)
        summarize(ended)
        guard write else {
            armSummaryTimer()
            return false
        }
        let record = RefusalRecord(
            at: Date(), app: identity?.appID ?? sender, uid: Int64(identity?.uid ?? 0), pid: Int64(identity?.pid ?? 0),
            action: action, sessionID: session?.id, subject: subject, errorName: error.code.busName,
            message: error.message, rule: error.rule)
        transferLog.submit(.refusal(record))
        AuditJournal.record(record, channel: session?.channel.rawValue)
        logger.debug("Refused \(action) for \(identity?.appID ?? sender): \(error)")
        return true
    }

    /// The action a summary row of suppressed refusals names.
    static let suppressedAction = "RateLimited"

    private func summarize(_ ended: [RefusalRateLimit.Suppressed]) {
        let rule = refusalRule
        for suppressed in ended {
            let message = "Suppressed \(suppressed.count) refusal\(suppressed.count == 1 ? "" : "s") of \(suppressed.bucket) past the first "
                + "\(rule.burst) in \(rule.interval / 1_000_000) s (RefusalRateLimitBurst=\(rule.burst) per RefusalRateLimitIntervalSec=\(rule.interval / 1_000_000))"
            let record = RefusalRecord(
                at: Date(), app: "\(suppressed.bucket)", uid: Int64(suppressed.uid), pid: Int64(suppressed.pid),
                action: Self.suppressedAction, sessionID: nil, subject: nil, errorName: BrokerErrorCode.limitExceeded.busName,
                message: message, rule: nil)
            transferLog.submit(.refusal(record))
            AuditJournal.record(record, channel: nil)
            logger.notice("\(message)")
        }
    }

    /// One timer for every bucket, at the earliest end of a window that suppressed refusals,
    /// so a flood that stops is summed up when its interval ends, not at the next refusal.
    private func armSummaryTimer() {
        guard summaryTimer == nil, let due = refusalRate.nextSummary(rule: refusalRule) else { return }
        let now = Kernel.monotonicMicroseconds()
        summaryTimer = try? LoopTimer(loop: loop, afterMicroseconds: due > now ? due - now : 0) { [unowned self] in
            summaryTimer = nil
            summarize(refusalRate.expire(now: Kernel.monotonicMicroseconds(), rule: refusalRule))
            armSummaryTimer()
        }
    }

    /// Sums up every window still counting, e.g. before the daemon exits.
    func summarizeSuppressedRefusals() {
        summaryTimer = nil
        summarize(refusalRate.expire(now: UInt64.max, rule: refusalRule))
    }

    /// A connection left: it no longer hears monitor events.
    func peerLeft(_ uniqueName: String) {
        monitors.remove(uniqueName)
    }
}

// Transfer/ — the only way bytes move. `Load` owns one load from the request to its one
// outcome; `PipeProxy` is its splice pump. A new kind of representation starts here.
import BrokerProtocol
import BusKit
import Foundation
import SystemCalls

/// Where a load's bytes come from: the source's provider object, and the deadlines it has.
struct LoadSource {
    let bus: Bus
    let sessionPath: String
    let app: AppIdentity
    let providerPath: String
    /// Read when a deadline is armed or fires, so a reloaded policy applies to loads in flight.
    let limits: () -> Limits
    /// Where the source's descriptors are taken, examined and closed, off the loop.
    let descriptors: ClientDescriptors
    /// Where a file load's end waits while its reply is on its way.
    let afterReplies: AfterReplies
    /// Whose threads the source's descriptors use: its buckets (`AppIdentity.buckets`).
    var owners: [Bucket] { app.buckets }

    /// A handed-over file may be reopened (its own offset) only with the source's own
    /// credentials: the daemon's, when they are the same user's.
    var mayReopen: Bool { app.uid == Kernel.effectiveUserID }
}

/// One load from request to outcome. A data load streams the source's pipe into the
/// destination's through a `PipeProxy`; a file load hands the source's read-only file or
/// sealed memfd to the destination. It has one phase, one byte count, a first-byte and a stall
/// deadline, and it reports exactly one outcome through `onFinish`.
///
/// No byte moves before the load is on record (`startRecorded`), so a crash can never hide a
/// transfer. Mostly that is at once, in the in-flight ledger (`AuditSink`); else, and always
/// fail-closed, the source is asked only once the attempt to write its start row is over.
/// Fail-closed, a row that fails refuses the load.
final class Load {
    enum Phase: Equatable {
        /// Asked the source; nothing has arrived.
        case awaitingSource
        /// Bytes are moving; neither the pipe's end nor the provider's reply has come.
        case streaming
        /// The provider replied that it wrote everything; what the pipe holds still drains.
        case sourceAnswered
        /// The pipe reached end of file (every write end closed); the provider's reply has not come.
        case dataEnded
        case finished
    }

    /// What the destination's `Load` call is answered with: a descriptor to read, or why not.
    typealias Answer = (Result<(FileDescriptor, RepresentationKind), BrokerError>) -> Void

    let id: UInt32
    let item: UInt32
    let typeIdentifier: String
    let kind: RepresentationKind
    let destination: AppIdentity
    let startedAt = Date()
    private(set) var phase: Phase = .awaitingSource
    /// Bytes handed to the destination: spliced so far, or the size of a handed-over file.
    private(set) var bytes: UInt64 = 0
    /// The size the source announced, if it did.
    var expected: UInt64?
    /// Bytes moved since the last report; called 50 ms into the load at the earliest, then at
    /// most every 50 ms (`reportInterval`).
    var onProgress: ((Load) -> Void)?
    /// The one outcome: nil when every byte arrived, else why not.
    var onFinish: ((Load, BrokerError?) -> Void)?
    /// Bytes so far, to keep on record while they move: once a second while they change, by the
    /// load's one timer, so a load that stalls has its final count on record within a second
    /// and a load shorter than a second costs no checkpoint at all.
    var onCheckpoint: ((Load) -> Void)?
    /// Every move of bytes, for what costs no more than a few memory stores (the in-flight ledger).
    var onMoved: ((Load) -> Void)?
    /// FailClosed=yes: the source is asked only after the start record committed.
    let failClosed: Bool
    /// Refused because its start record could not be written: the refusal is its record.
    private(set) var isUnrecorded = false
    /// A file load whose destination has the file: whatever ends it now (its held end, a
    /// cancel, the session's end), it ends delivered.
    private var isDelivered = false

    private let sizeRule: (limit: UInt64, rule: String)?
    private var proxy: PipeProxy?
    private var providerCall: Slot?
    private var deadline: LoopTimer?
    /// Monotonic microseconds of the last byte moved (or the start), for the stall deadline.
    private var lastProgressAt: UInt64
    /// Monotonic microseconds of the last report, or of the start.
    private var lastReportAt: UInt64
    /// The report of bytes that moved since the last one, when it was too soon to send it.
    private var pendingReport: LoopTimer?
    /// A report is due no sooner than this after the start or the last report, and bytes that
    /// moved in between are reported when it has passed. A load that ends within it (nearly
    /// every small one) sends only its end, which carries the count: two signals to each end
    /// instead of four, each relayed by the bus while the next call waits.
    static let reportInterval: UInt64 = 50_000
    /// A file load's destination, still waiting for its `Load` reply.
    private var answer: Answer?
    /// Whether the attempt to write the start record is over (committed or not).
    private var startIsRecorded = false
    /// Not yet on record: the source is asked once the start record's attempt is over.
    private var deferredStart: (source: LoadSource, answer: Answer)?
    private var checkpointedBytes: UInt64 = 0
    static let checkpointInterval: UInt64 = 1_000_000

    init(_ request: LoadRequest, failClosed: Bool = false) {
        self.failClosed = failClosed
        id = request.id
        item = request.item
        typeIdentifier = request.typeIdentifier
        kind = request.kind
        destination = request.destination
        sizeRule = request.sizeRule.map { ($0.limit, "\($0.rule.origin)") }
        lastProgressAt = Kernel.monotonicMicroseconds()
        lastReportAt = lastProgressAt
    }

    /// Asks the source for the bytes, once the load is on record. A data load answers with the
    /// pipe to read; a file load once the source has handed the file over.
    func start(from source: LoadSource, answer: @escaping Answer) throws(InternalError) {
        if !startIsRecorded {
            deferredStart = (source, answer)
            // Should the load end another way first, the waiting caller hears why.
            self.answer = answer
        } else {
            try ask(source, answer: answer)
        }
        armDeadline(source, after: source.limits().firstByteTimeout)
    }

    private func ask(_ source: LoadSource, answer: @escaping Answer) throws(InternalError) {
        switch kind {
        case .data: try startData(source, answer: answer)
        case .file: try startFile(source, answer: answer)
        }
    }

    /// The load is on record, or the attempt to write its start record is over. Fail-closed, a
    /// record that did not commit refuses the load; otherwise the load goes on either way (the
    /// record waits for a retry).
    func startRecorded(committed: Bool) {
        guard !startIsRecorded, phase != .finished else { return }
        startIsRecorded = true
        if let (source, answer) = deferredStart {
            deferredStart = nil
            guard committed || !failClosed else {
                isUnrecorded = true
                return finish(Self.auditRefusal)
            }
            self.answer = nil
            do {
                try ask(source, answer: answer)
            } catch {
                finish(BrokerError(.failed, "dragbrokerd failed to serve Load: \(error)"))
            }
        }
    }

    /// The refusal of a transfer the log cannot record, under FailClosed=yes.
    static var auditRefusal: BrokerError {
        BrokerError(.failed, "The transfer log cannot record transfers right now, and the policy refuses transfers it cannot audit (FailClosed=yes)")
    }

    /// Ends the load early (cancelled, timed out, the session ended); the destination's
    /// waiting call, if any, hears why. `outcome` names it in the log when the error alone
    /// would not, as "interrupted" for a load the daemon itself could not finish.
    func stop(_ error: BrokerError, outcome: LoadOutcome? = nil) {
        if !isDelivered { recordedOutcome = outcome }
        finish(error)
    }

    /// How the log names this load's end, once it has ended.
    private(set) var recordedOutcome: LoadOutcome?

    var destinationIsFull: Bool { proxy?.destinationIsFull == true }

    // MARK: Data

    private func startData(_ source: LoadSource, answer: Answer) throws(InternalError) {
        proxy = try PipeProxy(loop: source.bus.loop, handOver: { sourceEnd, destinationEnd throws(InternalError) in
            do {
                let call = try providerCall(source, member: "Provide")
                try call.append(fileDescriptor: sourceEnd.rawValue)
                // The reply says the source wrote everything (or why it failed); deadlines are ours.
                providerCall = try source.bus.callAsync(call, timeout: UInt64.max) { [unowned self] result in
                    providerCall = nil
                    switch result {
                    case .success: sourceAnswered()
                    case .failure(let error): providerFailed(error, source)
                    }
                }
            } catch {
                throw InternalError("Failed to ask the source for the data: \(error)")
            }
            answer(.success((destinationEnd, .data)))
        }, onFinish: { [unowned self] outcome, moved in
            bytes += moved
            switch outcome {
            case .endOfData:
                dataEnded()
            case .destinationClosed:
                finish(BrokerError(.cancelled, "The destination closed its end of the load"))
            case .limitExceeded:
                finish(sizeRefusal(source))
            case .failed(let reason):
                finish(BrokerError(.failed, reason))
            }
        })
        proxy?.allowance = { [unowned self] in sizeRule.map { $0.limit >= bytes ? $0.limit - bytes : 0 } }
        let loop = source.bus.loop
        proxy?.onMoved = { [unowned self] moved in progressed(moved, on: loop) }
    }

    /// The provider's reply ends the data: the proxy drains what the pipe holds and stops,
    /// without waiting for an end of file that a held duplicate of the write end would keep away.
    private func sourceAnswered() {
        switch phase {
        case .awaitingSource, .streaming:
            phase = .sourceAnswered
            // This may finish the load and so release it: nothing may follow.
            proxy?.sourceFinished()
        case .dataEnded:
            finish(nil)
        case .sourceAnswered, .finished:
            break
        }
    }

    /// The pipe's end before the provider's reply: the reply may still be an error.
    private func dataEnded() {
        switch phase {
        case .awaitingSource, .streaming: phase = .dataEnded
        case .sourceAnswered: finish(nil)
        case .dataEnded, .finished: break
        }
    }

    private func progressed(_ moved: UInt64, on loop: EventLoop) {
        bytes += moved
        if phase == .awaitingSource { phase = .streaming }
        let now = Kernel.monotonicMicroseconds()
        lastProgressAt = now
        onMoved?(self)
        guard onProgress != nil, pendingReport == nil else { return }
        let due = lastReportAt + Self.reportInterval
        guard now < due else { return report(at: now) }
        do {
            pendingReport = try LoopTimer(loop: loop, afterMicroseconds: due - now, accuracy: 5_000) { [unowned self] in
                pendingReport = nil
                report(at: Kernel.monotonicMicroseconds())
            }
        } catch {
            report(at: now)
        }
    }

    private func report(at now: UInt64) {
        lastReportAt = now
        onProgress?(self)
    }

    // MARK: Files

    private func startFile(_ source: LoadSource, answer: @escaping Answer) throws(InternalError) {
        do {
            let call = try providerCall(source, member: "ProvideFile")
            providerCall = try source.bus.callAsync(call, timeout: UInt64.max) { [unowned self] result in
                providerCall = nil
                switch result {
                case .success(let message): fileHandedOver(message, source)
                case .failure(let error): providerFailed(error, source)
                }
            }
        } catch {
            throw InternalError("Failed to ask the source for the file: \(error.message)")
        }
        // Should the load end another way (cancel, timeout, disconnect), the waiting caller hears why.
        self.answer = answer
    }

    /// The source's answer carries the file: it is taken out and judged on a worker
    /// (`HandedFile`), and the destination answered back on the loop, if it still waits.
    private func fileHandedOver(_ message: Message, _ source: LoadSource) {
        let number: Int32
        do {
            number = try message.readBorrowedFileDescriptor()
        } catch {
            return finish(BrokerError(.providerFailed, "The source's answer carried no file: \(error)"))
        }
        let reopen = source.mayReopen
        let descriptors = source.descriptors
        let owners = source.owners
        do {
            try descriptors.take(number, from: message, owners: owners, for: HandedFile.work,
                                 examine: { HandedFile.examine($0, reopen: reopen) }) { [weak self] result in
                guard let self, phase != .finished, let answer else {
                    if case .success(let (file, _)) = result { descriptors.close(file, owners: owners) }
                    return
                }
                switch result {
                case .success(let (file, size)) where sizeRule.map({ size > $0.limit }) ?? false:
                    // A file's size is known before any byte moves: past the rule, none does.
                    descriptors.close(file, owners: owners)
                    finish(sizeRefusal(source))
                case .success(let (file, size)):
                    bytes = size
                    onMoved?(self)
                    isDelivered = true
                    deadline = nil
                    self.answer = nil
                    answer(.success((file, .file)))
                    descriptors.close(file, owners: owners)
                    // The reply is the destination's verdict: the end's news follows it.
                    source.afterReplies.hold { [weak self] in self?.finish(nil) }
                case .failure(let error):
                    finish(error)
                }
            }
        } catch {
            finish(error)
        }
    }

    /// A size rule's refusal, whether a stream passed the size or a file was larger than it.
    private func sizeRefusal(_ source: LoadSource) -> BrokerError {
        var error = BrokerError.accessDenied(
            "The administrator's policy forbids more than \(sizeRule?.limit ?? 0) bytes of \(typeIdentifier) from \(source.app.appID) to \(destination.appID) (rule at \(sizeRule?.rule ?? "?"))")
        error.rule = sizeRule?.rule
        return error
    }

    // MARK: The provider

    private func providerCall(_ source: LoadSource, member: String) throws(BusError) -> Message {
        let call = try source.bus.newMethodCall(destination: source.app.uniqueName, path: source.providerPath,
                                                interface: BrokerNames.providerInterface, member: member)
        try call.append(objectPath: source.sessionPath)
        try call.append(item)
        try call.append(typeIdentifier)
        try call.append(id)
        return call
    }

    /// sd-bus fails pending calls when the daemon's own connection closes: that is no fault of
    /// the source, and the load is recorded as interrupted.
    private func providerFailed(_ error: BusError, _ source: LoadSource) {
        if source.bus.isOpen {
            finish(providerError(error, from: source.app))
        } else {
            stop(BrokerError(.disconnected, "dragbrokerd lost its connection to the bus"), outcome: .interrupted)
        }
    }

    private func providerError(_ error: BusError, from app: AppIdentity) -> BrokerError {
        if let code = BrokerErrorCode(busName: error.name), code == .cancelled {
            return BrokerError(.cancelled, "The source cancelled the load: \(error.message)")
        }
        // The bus answers for a source that died with the call pending; say so the way the
        // session's end will, whichever of the two the daemon hears first.
        if ["org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.ServiceUnknown",
            "org.freedesktop.DBus.Error.NameHasNoOwner", "org.freedesktop.DBus.Error.Disconnected"].contains(error.name) {
            return BrokerError(.disconnected, "The source app \(app.appID) disconnected")
        }
        return BrokerError(.providerFailed, "The source failed to provide the data: \(error.name): \(error.message)")
    }

    // MARK: Deadlines and the end

    /// One timer per load: it fires at the earliest deadline and re-arms while bytes move, and
    /// while the load's bytes go on record it fires at least once a second to checkpoint them.
    private func armDeadline(_ source: LoadSource, after delay: UInt64) {
        let delay = onCheckpoint == nil ? delay : min(delay, Self.checkpointInterval)
        deadline = try? LoopTimer(loop: source.bus.loop, afterMicroseconds: delay) { [unowned self] in
            guard phase != .finished else { return }
            if bytes != checkpointedBytes, let onCheckpoint {
                checkpointedBytes = bytes
                onCheckpoint(self)
            }
            let limits = source.limits()
            let now = Kernel.monotonicMicroseconds()
            if kind == .file || bytes == 0 && phase != .dataEnded {
                let due = lastProgressAt + limits.firstByteTimeout
                guard now >= due else { return armDeadline(source, after: due - now) }
                finish(BrokerError(.timeout,
                    "The source produced nothing within \(limits.firstByteTimeout / 1_000_000) s (first-byte deadline)"))
            } else if now - lastProgressAt >= limits.stallTimeout {
                let who = destinationIsFull ? "the destination stopped reading" : "the source stopped sending"
                finish(BrokerError(.timeout,
                    "The load made no progress for \(limits.stallTimeout / 1_000_000) s: \(who) (stall deadline)"))
            } else {
                armDeadline(source, after: lastProgressAt + limits.stallTimeout - now)
            }
        }
    }

    private func finish(_ error: BrokerError?) {
        guard phase != .finished else { return }
        let error = isDelivered ? nil : error
        phase = .finished
        providerCall = nil
        deadline = nil
        pendingReport = nil
        deferredStart = nil
        proxy?.stop()
        proxy = nil
        if let error, let answer {
            self.answer = nil
            answer(.failure(error))
        }
        let report = onFinish
        onFinish = nil
        onProgress = nil
        onCheckpoint = nil
        onMoved = nil
        report?(self, error)
    }

    /// The outcome of a load that ended with `error`.
    func outcome(of error: BrokerError?) -> LoadOutcome {
        recordedOutcome ?? LoadOutcome(error)
    }
}

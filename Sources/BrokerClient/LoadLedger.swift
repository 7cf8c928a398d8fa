/// Every load a destination started, keyed by the broker's load ID, from the `Load` reply to
/// the outcome its caller collects: the one place the client finds a load.
///
/// The reply and the load's signals reach it in bus order on the event loop; the caller
/// collects the outcome from its own task. Whatever the order (progress or `LoadFinished`
/// before the reply was processed, the outcome before or after the caller waits, the caller
/// giving up first), each report reaches the caller, and a load's record goes as soon as its
/// outcome is known and collected, or abandoned. Pure state: the caller holds the lock and
/// acts on what the methods return (progress to report, a waiter to resume) outside it.
struct LoadLedger<Waiter> {
    typealias Progress = @Sendable (_ bytes: UInt64, _ expected: UInt64?) -> Void

    /// Progress to hand to the load's caller and to the session's events.
    struct Report {
        var item: Int
        var load: UInt32
        var bytes: UInt64
        var expected: UInt64?
        var progress: Progress?
    }

    fileprivate struct Record {
        /// Set by `claim`, from the load's reply.
        var owner: (item: Int, progress: Progress?)?
        /// The latest progress heard before the claim. Reports are cumulative: the latest
        /// says all the earlier ones did.
        var early: (bytes: UInt64, expected: UInt64?)?
        var outcome: LoadOutcome?
        var waiter: Waiter?
        var abandoned = false
    }

    private var records: [UInt32: Record] = [:]
    private var sessionHasEnded = false

    /// The load's reply was decoded: progress for `id` goes to `progress` from now on.
    /// Returns the progress heard before, which the caller reports now.
    mutating func claim(_ id: UInt32, item: Int, progress: Progress?) -> Report? {
        var record = records[id] ?? Record()
        precondition(record.owner == nil, "load \(id) claimed twice")
        record.owner = (item, progress)
        let early = record.early
        record.early = nil
        records[id] = record
        return early.map { Report(item: item, load: id, bytes: $0.bytes, expected: $0.expected, progress: progress) }
    }

    /// `LoadProgress`: the report to deliver, or nil when it waits for the claim (or comes
    /// after the outcome, when nothing listens any more).
    mutating func progressed(_ id: UInt32, bytes: UInt64, expected: UInt64?) -> Report? {
        guard var record = record(id), record.outcome == nil else { return nil }
        guard let owner = record.owner else {
            record.early = (bytes, expected)
            records[id] = record
            return nil
        }
        return Report(item: owner.item, load: id, bytes: bytes, expected: expected, progress: owner.progress)
    }

    /// `LoadFinished`: returns the waiter to resume with `outcome` when the caller already
    /// waits; otherwise the outcome is kept until the caller collects it.
    mutating func finished(_ id: UInt32, _ outcome: LoadOutcome) -> Waiter? {
        guard var record = record(id), record.outcome == nil else { return nil }
        if let waiter = record.waiter {
            records[id] = nil
            return waiter
        }
        if record.abandoned {
            records[id] = nil
            return nil
        }
        record.outcome = outcome
        records[id] = record
        return nil
    }

    /// The caller waits for the outcome of a load it claimed: returns it at once when it is
    /// known (and the record goes), or keeps `waiter` for `finished` to return.
    mutating func collect(_ id: UInt32, waiter: Waiter) -> LoadOutcome? {
        guard var record = records[id], record.owner != nil else { preconditionFailure("load \(id) collected but never claimed") }
        precondition(record.waiter == nil && !record.abandoned, "load \(id) collected twice")
        if let outcome = record.outcome {
            records[id] = nil
            return outcome
        }
        record.waiter = waiter
        records[id] = record
        return nil
    }

    /// The caller gave up on a load it claimed (it failed on its side): the record goes now if
    /// the outcome came, or when it comes.
    mutating func abandon(_ id: UInt32) {
        guard var record = records[id], record.waiter == nil else { return }
        if record.outcome != nil {
            records[id] = nil
        } else {
            record.abandoned = true
            records[id] = record
        }
    }

    /// `Ended`: no reply can claim a load any more (the broker answers every `Load` before it
    /// ends the session), so what nobody claimed goes, and signals for unknown loads are
    /// ignored from now on. Loads still running after a successful end keep their records.
    mutating func sessionEnded() {
        sessionHasEnded = true
        records = records.filter { $0.value.owner != nil }
    }

    /// Whether the session's signals still matter: it has not ended, or a claimed load still
    /// waits for its `LoadFinished` (a destination may conclude while it loads).
    var needsSignals: Bool {
        !sessionHasEnded || records.values.contains { $0.owner != nil && $0.outcome == nil }
    }

    /// The broker went away: no verdict will come for any load still running, so each gets
    /// `error` as its outcome. Returns the waiters to resume with it.
    mutating func brokerVanished(_ outcome: LoadOutcome) -> [Waiter] {
        sessionHasEnded = true
        var waiters: [Waiter] = []
        for (id, record) in records where record.outcome == nil {
            if let waiter = finished(id, outcome) { waiters.append(waiter) }
        }
        records = records.filter { $0.value.owner != nil }
        return waiters
    }

    /// How many loads have a record: 0 once every load's outcome was collected or abandoned.
    var count: Int { records.count }

    /// The record for a signal about `id`: a new one for a load not claimed yet, none once the
    /// session ended.
    private func record(_ id: UInt32) -> Record? {
        if let record = records[id] { return record }
        return sessionHasEnded ? nil : Record()
    }
}

extension LoadLedger: Sendable where Waiter: Sendable {}
extension LoadLedger.Record: Sendable where Waiter: Sendable {}

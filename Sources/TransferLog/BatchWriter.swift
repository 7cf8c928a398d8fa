import Dispatch
import Foundation
import GRDB
import Synchronization
import SystemCalls

/// Records SQLite refused outright (a constraint, a value it cannot store): retrying cannot
/// help, so they are dropped, reported, and counted into the log as a gap.
public struct TransferLogWriteFailure: Error, CustomStringConvertible {
    public let underlying: any Error
    public let droppedEntries: Int

    public var description: String {
        "transfer log lost \(droppedEntries) entr\(droppedEntries == 1 ? "y" : "ies"): \(underlying)"
    }
}

/// What the writer tells its owner, on the writer's queue. Each change of state is told once,
/// so an owner that logs one line per event warns once while writes fail and once when they
/// work again, however many attempts lie between.
public enum TransferLogEvent: Sendable {
    /// A write failed in a way that passes (a full disk, an I/O error, a lock held too long):
    /// `kept` records wait in memory for a retry.
    case writesFailing(error: any Error, kept: Int)
    /// Writes work again: `written` records that had waited are on disk.
    case writesRecovered(written: Int, after: TimeInterval)
    /// The records waiting reached the bound: from now on new ones are counted, not kept.
    case queueFull(capacity: Int)
    /// Lost records were counted into the log.
    case gapRecorded(GapRecord)
    /// SQLite refused records outright; they are counted as lost.
    case rejected(TransferLogWriteFailure)
}

/// Moves entries from any thread to disk on one serial queue, so callers such as the bus event
/// loop never wait for SQLite or fsync.
///
/// A failure that passes keeps the entries, in order, for a retry with backoff; only the bound
/// on what waits in memory can lose entries, and those are counted and written as a gap once
/// the log takes rows again. Checkpoints of running loads are kept one per load, the newest.
///
/// `@unchecked` because all mutable state is guarded by `lock`.
final class BatchWriter: @unchecked Sendable {
    struct Submission {
        var entry: TransferLog.Entry
        /// Dropped, not kept, when its attempt fails: the caller refuses what it would record.
        var mustCommit: Bool
        /// Told after each attempt at the entry whether it committed: false while it waits for
        /// a retry (or when it is dropped), true once, when it is on disk.
        var committed: (@Sendable (Bool) -> Void)?
    }

    struct CheckpointKey: Hashable {
        var sessionID: String
        var loadID: Int64
    }

    /// A running load's open record, with its bytes so far and their time as its end.
    typealias Checkpoint = LoadRecord

    /// Records counted instead of kept, by why.
    private struct Loss {
        var count: Int
        var first: Date
        var last: Date
    }

    static let firstRetryDelay: TimeInterval = 0.05
    static let longestRetryDelay: TimeInterval = 5

    private let pool: DatabasePool
    private let capacity: Int
    private let onEvent: (@Sendable (TransferLogEvent) -> Void)?
    private let queue = DispatchQueue(label: "dragbroker.transferlog.writer")
    /// A connection of its own that copies the WAL into the database beside the writer: a
    /// checkpoint syncs the disk, and a load waiting for its start record must not wait for
    /// that. Nil leaves checkpoints to SQLite, inside commits.
    private let checkpointer: DatabaseQueue?
    private let checkpointQueue = DispatchQueue(label: "dragbroker.transferlog.checkpoint")
    /// Rows written since the last checkpoint began; touched on the writer's queue only.
    private var writtenSinceCheckpoint = 0
    /// About SQLite's own 1000 pages between checkpoints, at two to four pages a row.
    static let rowsBetweenCheckpoints = 300

    private let lock = NSLock()
    private var pending: [Submission] = []
    /// Entries that count against `capacity`, from submission until written or dropped,
    /// whether waiting or taken by an attempt.
    private var kept = 0
    private var checkpoints: [CheckpointKey: Checkpoint] = [:]
    private var losses: [String: Loss] = [:]
    private var queueFullReported = false
    /// A drain is queued that has not yet taken `pending`.
    private var drainScheduled = false
    private var retryScheduled = false
    private var retryDelay = BatchWriter.firstRetryDelay
    /// When the current run of failures began; nil while writes work.
    private var failingSince: Date?
    private var lastError: (any Error)?
    private var checkpointRunning = false

    /// Syncs the WAL at most `syncDelay` after a commit left it unsynced (group commit); nil
    /// leaves syncing to SQLite's checkpoints.
    private let durability: WriteAheadSync?
    private let syncQueue = DispatchQueue(label: "dragbroker.transferlog.sync")
    /// A commit since the last sync began: the WAL holds what a power cut would take.
    private var syncScheduled = false
    /// The durability contract is "at most the last second": a commit waits at most this long
    /// for its sync, and the sync itself takes the rest.
    static let syncDelay: TimeInterval = 0.25

    init(pool: DatabasePool, checkpointer: DatabaseQueue? = nil, durability: WriteAheadSync? = nil, capacity: Int,
         onEvent: (@Sendable (TransferLogEvent) -> Void)?) {
        precondition(capacity > 0, "transfer log queue capacity must be positive")
        self.pool = pool
        self.checkpointer = checkpointer
        self.durability = durability
        self.capacity = capacity
        self.onEvent = onEvent
    }

    var lastWriteError: (any Error)? {
        lock.withLock { lastError }
    }

    /// Whether the last attempt to write failed, and records wait for a retry.
    var isFailing: Bool {
        lock.withLock { failingSince != nil }
    }

    /// Whether new records are being counted instead of kept.
    var isFull: Bool {
        lock.withLock { kept >= capacity }
    }

    /// Queues an entry. Returns false when it was counted as lost instead (the queue is at its
    /// bound); `committed` is then not called. An entry that `mustCommit` is never counted
    /// against the bound: it waits only for its one attempt.
    func submit(_ submission: Submission) -> Bool {
        var full = false
        let schedule: Bool? = lock.withLock {
            if !submission.mustCommit {
                guard kept < capacity else {
                    countLoss(1, reason: "the queue of records waiting to be written was full (\(capacity) records)")
                    full = !queueFullReported
                    queueFullReported = true
                    return nil
                }
                kept += 1
            }
            pending.append(submission)
            // While writes fail, the retry takes what waits; a caller waiting for its answer
            // gets an attempt of its own, so it never waits out the backoff.
            guard !drainScheduled, failingSince == nil || submission.committed != nil else { return false }
            drainScheduled = true
            return true
        }
        if full { onEvent?(.queueFull(capacity: capacity)) }
        guard let schedule else { return false }
        if schedule { queue.async { self.drain() } }
        return true
    }

    /// Keeps the newest byte count of a running load, written with the next batch: only the
    /// last one before a crash matters, so earlier ones are replaced, never queued.
    func checkpoint(_ key: CheckpointKey, _ checkpoint: Checkpoint) {
        let schedule: Bool = lock.withLock {
            checkpoints[key] = checkpoint
            guard !drainScheduled, failingSince == nil else { return false }
            drainScheduled = true
            return true
        }
        if schedule { queue.async { self.drain() } }
    }

    /// Makes one attempt at everything waiting, retries included, and returns when it is done:
    /// every entry submitted before the call is then on disk, or still waiting because the
    /// log fails (and the owner was told).
    func flush() {
        // Waiting for ourselves would hang forever; fail loudly instead.
        dispatchPrecondition(condition: .notOnQueue(queue))
        queue.sync { drain() }
    }

    /// Writes what waits, then makes every committed record durable: the WAL synced, then
    /// copied into the database (a checkpoint, which syncs it too) as far as readers allow.
    /// For a clean stop, after which nothing may be lost.
    func close() throws {
        flush()
        try queue.sync {
            try durability?.sync()
            _ = try? pool.writeWithoutTransaction { try $0.checkpoint(.truncate) }
        }
    }

    /// Runs `body` on the writer's queue, after the attempts already queued: those at every
    /// entry submitted before it, unless writes are failing and entries wait for a retry.
    func perform(_ body: @escaping @Sendable () -> Void) {
        queue.async(execute: body)
    }

    // MARK: The writer's queue

    private func drain() {
        let (batch, marks, counted): ([Submission], [CheckpointKey: Checkpoint], [String: Loss]) = lock.withLock {
            drainScheduled = false
            defer {
                pending = []
                checkpoints = [:]
            }
            return (pending, checkpoints, losses)
        }
        guard !batch.isEmpty || !marks.isEmpty || !counted.isEmpty else { return }
        let gaps = counted.map { reason, loss in
            GapRecord(recordedAt: Date(), firstLostAt: loss.first, lastLostAt: loss.last, lost: Int64(loss.count), reason: reason)
        }.sorted { $0.firstLostAt < $1.firstLostAt }
        do {
            let written = try write { db -> [GapRecord] in
                for submission in batch { try submission.entry.write(db) }
                for mark in marks.values { try mark.writeCheckpoint(db) }
                return try gaps.map { gap in
                    var gap = gap
                    try gap.insert(db)
                    return gap
                }
            }
            succeeded(batch, gaps: written, counted: counted)
            wrote(batch.count + marks.count + written.count)
        } catch where Self.passes(error) {
            failed(batch[...], marks, error)
        } catch {
            isolate(batch, marks, counted: counted, error)
        }
    }

    /// `pool.write`, with BEGIN and COMMIT as statements prepared once and kept with the
    /// connection: GRDB's `write` parses both for every transaction, which cost the writer as
    /// much as the rows it wrote. Everything else is as it does: BEGIN IMMEDIATE, and a
    /// rollback on any failure, which throws the first error.
    private func write<T>(_ body: (Database) throws -> T) throws -> T {
        try pool.writeWithoutTransaction { db in
            try db.cachedStatement(sql: "BEGIN IMMEDIATE TRANSACTION").execute()
            do {
                let result = try body(db)
                try db.cachedStatement(sql: "COMMIT TRANSACTION").execute()
                return result
            } catch {
                try? db.rollback()
                throw error
            }
        }
    }

    private func succeeded(_ batch: [Submission], gaps: [GapRecord], counted: [String: Loss]) {
        let recovered: TimeInterval? = lock.withLock {
            kept -= batch.count { !$0.mustCommit }
            for (reason, loss) in counted {
                // Losses counted while the batch was written stay for the next one.
                guard var now = losses[reason] else { continue }
                now.count -= loss.count
                if now.count <= 0 {
                    losses[reason] = nil
                } else {
                    now.first = loss.last
                    losses[reason] = now
                }
            }
            if kept < capacity { queueFullReported = false }
            retryDelay = Self.firstRetryDelay
            defer { failingSince = nil }
            return failingSince.map { Date().timeIntervalSince($0) }
        }
        scheduleSync()
        if let recovered { onEvent?(.writesRecovered(written: batch.count, after: recovered)) }
        for gap in gaps { onEvent?(.gapRecorded(gap)) }
        for submission in batch { submission.committed?(true) }
    }

    /// Puts back, ahead of anything submitted since, what the failed attempt took, except
    /// entries that had to commit then or never; arms the retry.
    private func failed(_ batch: ArraySlice<Submission>, _ marks: [CheckpointKey: Checkpoint], _ error: any Error) {
        let keep = batch.filter { !$0.mustCommit }
        let (first, waiting, arm): (Bool, Int, TimeInterval?) = lock.withLock {
            pending = keep + pending
            for (key, mark) in marks where checkpoints[key] == nil { checkpoints[key] = mark }
            lastError = error
            let first = failingSince == nil
            if first { failingSince = Date() }
            var arm: TimeInterval?
            if !retryScheduled {
                retryScheduled = true
                arm = retryDelay
                retryDelay = min(retryDelay * 2, Self.longestRetryDelay)
            }
            return (first, kept, arm)
        }
        if first { onEvent?(.writesFailing(error: error, kept: waiting)) }
        for submission in batch { submission.committed?(false) }
        if let arm {
            queue.asyncAfter(deadline: .now() + arm) {
                self.lock.withLock { self.retryScheduled = false }
                self.drain()
            }
        }
    }

    /// One bad row (say, a duplicate ID) must not take the rest of its batch with it: each
    /// entry alone, the ones SQLite refuses dropped and counted.
    private func isolate(_ batch: [Submission], _ marks: [CheckpointKey: Checkpoint], counted: [String: Loss], _ batchError: any Error) {
        var rejected = 0
        var firstRejection: (any Error)?
        for (index, submission) in batch.enumerated() {
            do {
                try write { try submission.entry.write($0) }
                lock.withLock { if !submission.mustCommit { kept -= 1 } }
                submission.committed?(true)
            } catch where Self.passes(error) {
                failed(batch[index...], marks, error)
                return
            } catch {
                rejected += 1
                firstRejection = firstRejection ?? error
                lock.withLock {
                    if !submission.mustCommit { kept -= 1 }
                    countLoss(1, reason: "SQLite refused them: \(error)")
                }
                submission.committed?(false)
            }
        }
        // A checkpoint SQLite refuses is superseded by the load's end anyway.
        for mark in marks.values { try? write { try mark.writeCheckpoint($0) } }
        scheduleSync()
        if rejected > 0 {
            let failure = TransferLogWriteFailure(underlying: firstRejection ?? batchError, droppedEntries: rejected)
            lock.withLock { lastError = failure }
            onEvent?(.rejected(failure))
        }
        if batch.isEmpty && marks.isEmpty {
            // Only the gap rows were refused: nothing could record them, so say so and stop.
            lock.withLock { for reason in counted.keys { losses[reason] = nil } }
            onEvent?(.rejected(TransferLogWriteFailure(underlying: batchError, droppedEntries: counted.values.reduce(0) { $0 + $1.count })))
            return
        }
        let again: Bool = lock.withLock {
            guard !losses.isEmpty, !drainScheduled else { return false }
            drainScheduled = true
            return true
        }
        if again { queue.async { self.drain() } }
    }

    /// Starts a checkpoint beside the writer once enough rows have gone into the WAL; a failed
    /// one is tried again after the next rows.
    private func wrote(_ rows: Int) {
        guard let checkpointer else { return }
        writtenSinceCheckpoint += rows
        guard writtenSinceCheckpoint >= Self.rowsBetweenCheckpoints else { return }
        let start: Bool = lock.withLock {
            defer { checkpointRunning = true }
            return !checkpointRunning
        }
        guard start else { return }
        writtenSinceCheckpoint = 0
        checkpointQueue.async {
            _ = try? checkpointer.writeWithoutTransaction { try $0.checkpoint(.passive) }
            // The WAL starts over from its beginning (no new blocks, no growth) only once every
            // frame is in the database, and rows written during the copy are not: the writer
            // copies those few itself, between its batches, where no row can come in between.
            self.queue.async {
                _ = try? self.pool.writeWithoutTransaction { try $0.checkpoint(.passive) }
                self.lock.withLock { self.checkpointRunning = false }
            }
        }
    }

    /// Group commit: the first commit after a sync arms the next one, which covers every
    /// commit made before it starts; a drag never waits for it.
    private func scheduleSync() {
        guard let durability else { return }
        let arm: Bool = lock.withLock {
            defer { syncScheduled = true }
            return !syncScheduled
        }
        guard arm else { return }
        // Weakly: a log closed meanwhile had SQLite checkpoint (and sync) it as it closed.
        syncQueue.asyncAfter(deadline: .now() + Self.syncDelay) { [weak self] in
            guard let self else { return }
            // Commits from here on need a sync of their own.
            lock.withLock { syncScheduled = false }
            do {
                try durability.sync()
            } catch {
                lock.withLock { lastError = error }
            }
        }
    }

    /// Called with `lock` held.
    private func countLoss(_ count: Int, reason: String) {
        let now = Date()
        var loss = losses[reason] ?? Loss(count: 0, first: now, last: now)
        loss.count += count
        loss.last = now
        losses[reason] = loss
    }

    /// Failures that a later attempt may not meet: the disk, the file system, a lock, memory.
    static func passes(_ error: any Error) -> Bool {
        guard let error = error as? DatabaseError else { return false }
        switch error.resultCode {
        case .SQLITE_FULL, .SQLITE_IOERR, .SQLITE_BUSY, .SQLITE_LOCKED, .SQLITE_CANTOPEN, .SQLITE_READONLY,
             .SQLITE_NOMEM, .SQLITE_PROTOCOL, .SQLITE_PERM, .SQLITE_NOLFS:
            return true
        default:
            return false
        }
    }
}

extension TransferLog.Entry {
    /// Sessions and loads are written when they begin and completed when they end: the same
    /// row either way, inserted by whichever comes first (the start may have been lost). An end
    /// leaves the indexed columns alone (key and start), so completing a row touches no index.
    func write(_ db: Database) throws {
        switch self {
        case .session(let record):
            try db.cachedStatement(sql: """
                INSERT INTO session (sessionID, kind, sourceApp, destinationApp, itemCount, operation, outcome, errorName, startedAt, endedAt)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(sessionID) DO UPDATE SET
                    kind = excluded.kind, sourceApp = excluded.sourceApp, destinationApp = excluded.destinationApp,
                    itemCount = excluded.itemCount, operation = excluded.operation, outcome = excluded.outcome,
                    errorName = excluded.errorName, endedAt = excluded.endedAt
                """).execute(arguments: [record.sessionID, record.kind, record.sourceApp, record.destinationApp, record.itemCount,
                                 record.operation, record.outcome, record.errorName, MicrosecondTimestamp.microseconds(record.startedAt),
                                 MicrosecondTimestamp.microseconds(record.endedAt)])
        case .load(let record):
            guard let loadID = record.loadID else { return try record.insert(db) }
            try db.cachedStatement(sql: """
                INSERT INTO load (sessionID, loadID, sourceApp, destinationApp, typeIdentifier, bytes, startedAt, endedAt,
                                  outcome, errorName, sourceTeam, destinationTeam)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(sessionID, loadID) DO UPDATE SET
                    sourceApp = excluded.sourceApp, destinationApp = excluded.destinationApp, typeIdentifier = excluded.typeIdentifier,
                    bytes = excluded.bytes, endedAt = excluded.endedAt, outcome = excluded.outcome, errorName = excluded.errorName,
                    sourceTeam = excluded.sourceTeam, destinationTeam = excluded.destinationTeam
                """).execute(arguments: [record.sessionID, loadID, record.sourceApp, record.destinationApp, record.typeIdentifier, record.bytes,
                                 MicrosecondTimestamp.microseconds(record.startedAt), MicrosecondTimestamp.microseconds(record.endedAt),
                                 record.outcome, record.errorName, record.sourceTeam, record.destinationTeam])
        case .refusal(var record):
            try record.insert(db)
        }
    }
}

extension LoadRecord {
    /// A checkpoint is the load's first row when it came before any other (a load's start
    /// record waits for it); it changes only an open row: once the load's end is written, that
    /// is the truth.
    func writeCheckpoint(_ db: Database) throws {
        try db.cachedStatement(sql: """
            INSERT INTO load (sessionID, loadID, sourceApp, destinationApp, typeIdentifier, bytes, startedAt, endedAt,
                              outcome, errorName, sourceTeam, destinationTeam)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT(sessionID, loadID) DO UPDATE SET bytes = excluded.bytes, endedAt = excluded.endedAt
                WHERE load.outcome = excluded.outcome
            """).execute(arguments: [sessionID, loadID, sourceApp, destinationApp, typeIdentifier, bytes,
                                     MicrosecondTimestamp.microseconds(startedAt), MicrosecondTimestamp.microseconds(endedAt),
                                     LoadRecord.open, nil, sourceTeam, destinationTeam])
    }
}

/// The WAL's own descriptor, to sync it without a checkpoint: SQLite's `synchronous=NORMAL`
/// (GRDB's choice for a pool) syncs the WAL only when it checkpoints, and `FULL` would sync
/// at every commit, which a load waiting for its start record (fail-closed) would wait for.
/// Reopened when SQLite made a new WAL file.
final class WriteAheadSync: Sendable {
    private let directory: StateDirectory
    private let walName: String
    private let file = Mutex<(descriptor: FileDescriptor, inode: UInt64)?>(nil)

    /// Opens the WAL now, when there is one, so the descriptor is held from the start.
    init(directory: StateDirectory, walName: String) {
        self.directory = directory
        self.walName = walName
        try? reopenIfReplaced()
    }

    private func reopenIfReplaced() throws {
        try file.withLock { open in
            guard let entry = try directory.checkEntry(walName) else { return }
            guard open?.inode != entry.inode else { return }
            open?.descriptor.closeQuietly()
            open = nil
            let descriptor = try directory.descriptor.openEntry(walName, readOnly: true)
            open = (descriptor, try descriptor.status().inode)
        }
    }

    deinit {
        file.withLock { $0?.descriptor.closeQuietly() }
    }

    /// fdatasync of the WAL as it is now; nothing when there is none yet.
    func sync() throws {
        try reopenIfReplaced()
        try file.withLock { try $0?.descriptor.synchronizeData() }
    }
}

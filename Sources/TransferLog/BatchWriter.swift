import Dispatch
import Foundation
import GRDB

/// Reported when entries could not be written; they are gone from the log.
public struct TransferLogWriteFailure: Error, CustomStringConvertible {
    public let underlying: any Error
    public let droppedEntries: Int

    public var description: String {
        "transfer log lost \(droppedEntries) entr\(droppedEntries == 1 ? "y" : "ies"): \(underlying)"
    }
}

/// Moves entries from any thread to disk on one serial queue, so callers such
/// as the bus event loop never wait for SQLite or fsync.
///
/// `@unchecked` because all mutable state is guarded by `lock`.
final class BatchWriter: @unchecked Sendable {
    private let pool: DatabasePool
    private let capacity: Int
    private let onError: (@Sendable (any Error) -> Void)?
    private let queue = DispatchQueue(label: "dragbroker.transferlog.writer")

    private let lock = NSLock()
    private var pending: [TransferLog.Entry] = []
    /// Taken by a drain but not yet committed; still counts against `capacity`
    /// because it still occupies memory.
    private var inFlight = 0
    /// True while a drain is queued that has not yet taken `pending`; this is
    /// what lets `flush` rely on queue order alone.
    private var drainScheduled = false
    private var lastError: (any Error)?

    init(pool: DatabasePool, capacity: Int, onError: (@Sendable (any Error) -> Void)?) {
        precondition(capacity > 0, "transfer log queue capacity must be positive")
        self.pool = pool
        self.capacity = capacity
        self.onError = onError
    }

    var lastWriteError: (any Error)? {
        lock.withLock { lastError }
    }

    /// Whether the most recent batch lost entries: fail-closed auditing refuses transfers
    /// while this holds, and accepts them again once a batch commits.
    private var failing = false
    var isFailing: Bool {
        lock.withLock { failing }
    }

    var isFull: Bool {
        lock.withLock { pending.count + inFlight >= capacity }
    }

    func submit(_ entry: TransferLog.Entry) -> Bool {
        let mustSchedule: Bool? = lock.withLock {
            guard pending.count + inFlight < capacity else { return nil }
            pending.append(entry)
            defer { drainScheduled = true }
            return !drainScheduled
        }
        guard let mustSchedule else { return false }
        if mustSchedule {
            queue.async { self.drain() }
        }
        return true
    }

    /// Any entry submitted before this call is either in `pending` with a drain
    /// queued behind it, or already taken by an earlier drain; both finish
    /// before this empty block runs on the serial queue.
    func flush() {
        // Waiting for ourselves would hang forever; fail loudly instead.
        dispatchPrecondition(condition: .notOnQueue(queue))
        queue.sync {}
    }

    /// Runs `body` on the writer's queue, after every entry submitted before it.
    func perform(_ body: @escaping @Sendable () -> Void) {
        queue.async(execute: body)
    }

    private func drain() {
        let batch: [TransferLog.Entry] = lock.withLock {
            drainScheduled = false
            inFlight += pending.count
            defer { pending = [] }
            return pending
        }
        if !batch.isEmpty {
            write(batch)
        }
        lock.withLock { inFlight -= batch.count }
    }

    private func write(_ batch: [TransferLog.Entry]) {
        do {
            try pool.write { db in
                for entry in batch { try entry.insert(db) }
            }
            lock.withLock { failing = false }
        } catch {
            // One bad row (say, a duplicate session ID) must not take the rest
            // of the batch with it, so retry entry by entry to isolate it.
            var dropped = batch.count
            if batch.count > 1 {
                dropped = batch.filter { entry in
                    (try? pool.write { try entry.insert($0) }) == nil
                }.count
            }
            if dropped > 0 {
                report(TransferLogWriteFailure(underlying: error, droppedEntries: dropped))
            }
        }
    }

    private func report(_ error: any Error) {
        lock.withLock {
            lastError = error
            failing = true
        }
        onError?(error)
    }
}

extension TransferLog.Entry {
    func insert(_ db: Database) throws {
        switch self {
        case .session(let record): try record.insert(db)
        case .load(let record): try record.insert(db)
        case .refusal(var record): try record.insert(db)
        }
    }
}

import BrokerProtocol
import Foundation
import SystemCalls

/// Threads for the system calls that may block for as long as someone else decides: on a
/// descriptor a client handed over, `fstat`, `open`, even `close` (FUSE sends FLUSH, and a FUSE
/// server may never answer; the kernel waits uninterruptibly). The bus loop never makes such
/// a call; it hands it to one of these threads and hears the result through the loop.
///
/// A thread in such a call may never come back, so threads are bounded per owner (each bucket
/// a client's app falls in, `AppIdentity.buckets`) and in total. New work that would pass
/// either bound is refused at once (`LimitExceeded`), never queued behind a stuck file system,
/// so one app's stalled files cost other apps nothing. Work that must happen whatever the
/// bounds (closing a descriptor the daemon is done with) waits until its owners have a free
/// thread: it never takes a thread beyond their bound either.
///
/// The pump of data loads may run here too: a job is any blocking work with owners.
final class BlockingWorkers: @unchecked Sendable {
    struct Bounds: Sendable, Equatable {
        var perOwner: Int
        var total: Int
    }

    /// One owner's threads at work, for `dragctl stats`.
    struct Usage: Sendable, Equatable {
        var owner: Bucket
        var busy: Int
        /// Microseconds since the oldest of them began.
        var oldestFor: UInt64
    }

    private struct Job {
        let id: UInt64
        let owners: [Bucket]
        let work: () -> Void
    }

    /// A lock TSan sees (`Synchronization.Mutex` is a futex it cannot), with the condition
    /// idle threads wait on.
    private let condition = NSCondition()
    private var queue: [Job] = []
    /// Start time of each job a thread runs, by owner.
    private var running: [Bucket: [UInt64: UInt64]] = [:]
    private var runningCount = 0
    private var threads = 0
    private var idle = 0
    private var nextID: UInt64 = 0
    private var currentBounds: Bounds

    init(bounds: Bounds) {
        currentBounds = bounds
    }

    /// The bounds in force; a reload changes them for work that starts from then on.
    var bounds: Bounds {
        get {
            condition.lock()
            defer { condition.unlock() }
            return currentBounds
        }
        set {
            condition.lock()
            defer { condition.unlock() }
            currentBounds = newValue
            wake()
        }
    }

    /// Refuses, as `start` would, work of owners whose own threads are all stuck: a file
    /// handover checks this before the source is even asked, so an app whose file system stalls
    /// cannot pile up answers that could not be taken. The total is checked by `start` alone:
    /// what the answer holds may be a file in memory, which needs no thread.
    func admit(owners: [Bucket], _ what: String) throws(BrokerError) {
        condition.lock()
        defer { condition.unlock() }
        try checkOwners(owners, what)
    }

    /// Runs `work` on a thread, or refuses with `LimitExceeded` naming the bound that is spent.
    /// `what` says what the work is for, in that message.
    func start(owners: [Bucket], _ what: String, _ work: @escaping @Sendable () -> Void) throws(BrokerError) {
        condition.lock()
        defer { condition.unlock() }
        try checkOwners(owners, what)
        let bounds = currentBounds
        guard runningCount + queue.count < bounds.total else {
            throw .limitExceeded(
                "dragbrokerd has \(runningCount + queue.count) descriptor threads busy, its limit (DescriptorThreadsTotal=\(bounds.total)), so \(what) is refused")
        }
        enqueue(owners, work)
    }

    /// Under the lock.
    private func checkOwners(_ owners: [Bucket], _ what: String) throws(BrokerError) {
        let bounds = currentBounds
        for owner in owners where held(owner) >= bounds.perOwner {
            throw .limitExceeded(
                "\(owner.holder) \(held(owner)) descriptor threads busy, the limit "
                + "(DescriptorThreadsPerApp=\(bounds.perOwner)): a file system its files live on is not answering, so \(what) is refused")
        }
    }

    /// Runs `work` as soon as its owners and the total have a thread free: for what must
    /// happen, such as closing a descriptor.
    func eventually(owners: [Bucket], _ work: @escaping @Sendable () -> Void) {
        condition.lock()
        defer { condition.unlock() }
        enqueue(owners, work)
    }

    /// Threads busy and waiting work of `owner`; under the lock.
    private func held(_ owner: Bucket) -> Int {
        (running[owner]?.count ?? 0) + queue.count { $0.owners.contains(owner) }
    }

    private func enqueue(_ owners: [Bucket], _ work: @escaping () -> Void) {
        nextID += 1
        queue.append(Job(id: nextID, owners: owners, work: work))
        wake()
    }

    /// The first waiting job whose owners all have a thread free; under the lock.
    private func runnable() -> Int? {
        guard runningCount < currentBounds.total else { return nil }
        return queue.firstIndex { job in job.owners.allSatisfy { (running[$0]?.count ?? 0) < currentBounds.perOwner } }
    }

    /// Under the lock: lets an idle thread, or a new one, take a job that may run now.
    private func wake() {
        guard runnable() != nil else { return }
        if idle > 0 {
            condition.broadcast()
        } else if threads < currentBounds.total {
            threads += 1
            let thread = Thread { [unowned self] in
                Kernel.nameCurrentThread("dragbrokerd-blocking")
                serve()
            }
            thread.stackSize = 256 << 10
            thread.start()
        }
    }

    private func serve() {
        condition.lock()
        while true {
            guard let index = runnable() else {
                idle += 1
                condition.wait()
                idle -= 1
                continue
            }
            let job = queue.remove(at: index)
            let now = Kernel.monotonicMicroseconds()
            for owner in job.owners { running[owner, default: [:]][job.id] = now }
            runningCount += 1
            condition.unlock()
            job.work()
            condition.lock()
            for owner in job.owners {
                running[owner]?.removeValue(forKey: job.id)
                if running[owner]?.isEmpty == true { running.removeValue(forKey: owner) }
            }
            runningCount -= 1
            // A job of these owners may have waited for exactly this thread.
            wake()
        }
    }

    /// Who has threads at work now, longest first.
    func usage() -> [Usage] {
        let now = Kernel.monotonicMicroseconds()
        condition.lock()
        defer { condition.unlock() }
        return running.map { owner, jobs in
            Usage(owner: owner, busy: jobs.count, oldestFor: now - (jobs.values.min() ?? now))
        }.sorted { ($0.oldestFor, $0.owner.description) > ($1.oldestFor, $1.owner.description) }
    }

    /// Threads made so far (each lives on, idle, once its work is done), and those busy now.
    var threadCounts: (made: Int, busy: Int) {
        condition.lock()
        defer { condition.unlock() }
        return (threads, runningCount)
    }
}

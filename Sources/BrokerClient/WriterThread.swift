import Foundation
import Glibc
import SystemCalls

/// A thread of one stream load's own, and the task executor its writer runs on: the writer's
/// `DataWriter.write` blocks this thread in write(2), as a plain writer thread would, instead of
/// hopping to a dispatch thread and back for every chunk. With 1 MiB chunks those two hops
/// took about as long as the writes themselves when loads ran at once (`make bench`, (i)).
///
/// Code the writer awaits elsewhere (an actor, the main actor) runs there as usual and comes
/// back here. The thread leaves once `finish` was called and no job is left; a job queued
/// after that (a task that still prefers this executor) runs on a dispatch thread, so no task
/// ever waits for a thread that is gone.
final class WriterThread: TaskExecutor, @unchecked Sendable {
    /// Guards everything below; idle threads wait on it.
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var finishing = false
    private var gone = false
    private var thread: pthread_t?

    init() {
        Thread { [self] in
            Kernel.nameCurrentThread("dragbroker-writ")
            run()
        }.start()
    }

    /// Whether the caller runs on this thread, where blocking is what it is for.
    var isCurrent: Bool {
        condition.lock()
        defer { condition.unlock() }
        guard let thread else { return false }
        return pthread_equal(thread, pthread_self()) != 0
    }

    /// Whether the thread has left (after `finish`, once its jobs ran).
    var hasLeft: Bool {
        condition.lock()
        defer { condition.unlock() }
        return gone
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        if gone {
            condition.unlock()
            DispatchQueue.global().async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
            return
        }
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    /// The writer returned: the thread leaves once the jobs queued by then have run.
    func finish() {
        condition.lock()
        finishing = true
        condition.signal()
        condition.unlock()
    }

    private func run() {
        condition.lock()
        thread = pthread_self()
        while true {
            while jobs.isEmpty && !finishing { condition.wait() }
            if jobs.isEmpty {
                gone = true
                thread = nil
                condition.unlock()
                return
            }
            let batch = jobs
            jobs.removeAll(keepingCapacity: true)
            condition.unlock()
            for job in batch { job.runSynchronously(on: asUnownedTaskExecutor()) }
            condition.lock()
        }
    }
}

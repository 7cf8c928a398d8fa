import CSystemd
import Foundation
import Synchronization
import SystemCalls

/// One sd-event loop on a dedicated thread, usable as the serial executor of actors.
///
/// Bus callbacks, fd watches and actor jobs all run on this one thread, so C callbacks can
/// reach actor state with `assumeIsolated`. The loop sleeps in epoll while nothing happens:
/// other threads wake it through an eventfd only when they hand it work.
///
/// What belongs to the loop (its bus, messages, slots, sources, `LoopBound` values) may be
/// touched only by the thread running it, or, while no thread runs it (before `start()` or
/// `run()`, after it returned), by the one thread that sets it up or tears it down. BusKit
/// checks this with `preconditionCurrentOrIdle` in release builds too.
public final class EventLoop: SerialExecutor, @unchecked Sendable {
    /// The owned `sd_event*`.
    public let handle: OpaquePointer
    private let wakeFD: FileDescriptor
    private var wakeSource: OpaquePointer?
    /// Whether `drain` runs now, which takes work queued meanwhile itself. Loop thread only.
    private var isDraining = false
    /// The loop's own thread queued work outside a drain, which it does only from a callback
    /// of `turn`'s: `turn` takes the work as soon as that callback returns, without the
    /// eventfd. Loop thread only.
    private var ownWorkPending = false
    private let queue = Mutex<[Work]>([])
    /// The batch `drain` runs, swapped with the queue's array: each keeps its capacity, so a
    /// drain allocates nothing (copying the queue out would allocate its replacement). Loop
    /// thread only.
    private var batch: [Work] = []
    /// How many jobs (an actor's or a task's) the loop has run: each is one trip through the
    /// queue. Loop thread only.
    private(set) var jobsRun: UInt64 = 0
    /// The `pthread_t` running the loop, 0 while none does. Read on every checked access to
    /// loop-bound state, hence an atomic rather than a lock.
    private let loopThread = Atomic<UInt>(0)
    private let finished = DispatchSemaphore(value: 0)

    /// The loop as a task executor (see `LoopTaskExecutor`).
    public let taskExecutor = LoopTaskExecutor()

    fileprivate enum Work {
        /// An actor's job: runs isolated to the loop.
        case job(UnownedJob)
        /// A job of a task that prefers the loop: runs nonisolated, on the loop.
        case taskJob(UnownedJob)
        case closure(@Sendable () -> Void)
    }

    public init() throws(BusError) {
        var event: OpaquePointer?
        try check(sd_event_new(&event), "sd_event_new")
        handle = event!
        do {
            wakeFD = try Kernel.makeEventFD()
        } catch {
            sd_event_unref(handle)
            throw BusError.system(-error.rawValue, "eventfd")
        }
        let r = sd_event_add_io(handle, &wakeSource, wakeFD.rawValue, shim_epollin(), { _, fd, _, userdata in
            var counter: UInt64 = 0
            _ = try? withUnsafeMutableBytes(of: &counter) { try FileDescriptor(rawValue: fd).readSome(into: $0) }
            Unmanaged<EventLoop>.fromOpaque(userdata!).takeUnretainedValue().drain()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        if r < 0 {
            wakeFD.closeQuietly()
            sd_event_unref(handle)
            throw BusError.system(r, "sd_event_add_io")
        }
        taskExecutor.loop = self
    }

    deinit {
        sd_event_source_disable_unref(wakeSource)
        wakeFD.closeQuietly()
        sd_event_unref(handle)
    }

    /// Starts the loop thread. The thread keeps the loop alive until `stop()`.
    public func start(name: String = "sd-event") {
        let started = DispatchSemaphore(value: 0)
        let thread = Thread { [self] in
            Kernel.nameCurrentThread(name)
            loopThread.store(pthread_self(), ordering: .releasing)
            started.signal()
            _ = runToExit()
            loopThread.store(0, ordering: .releasing)
            finished.signal()
        }
        thread.start()
        // From here on `isCurrent` answers correctly on the loop thread; jobs enqueued
        // meanwhile wait in the queue.
        started.wait()
    }

    /// Runs the loop on the calling thread until `exit()`; the caller's thread becomes the loop thread.
    public func run() throws(BusError) {
        precondition(!isRunning, "the event loop is already running")
        loopThread.store(pthread_self(), ordering: .releasing)
        defer { loopThread.store(0, ordering: .releasing) }
        try check(runToExit(), "sd_event_run")
    }

    /// Runs the loop on the calling thread, one iteration at a time, until `isDone` holds
    /// (checked after each iteration): a synchronous caller waits for a reply without a
    /// second thread. While it runs, the caller's thread is the loop thread.
    public func run(until isDone: () -> Bool) throws(BusError) {
        precondition(!isRunning, "the event loop is already running")
        loopThread.store(pthread_self(), ordering: .releasing)
        defer { loopThread.store(0, ordering: .releasing) }
        while !isDone() {
            try check(turn(), "sd_event_run")
        }
    }

    /// sd_event_loop, a `turn` at a time: until `exit()`, then its code.
    private func runToExit() -> Int32 {
        while sd_event_get_state(handle) != Int32(SD_EVENT_FINISHED) {
            let r = turn()
            if r < 0 { return r }
        }
        var code: Int32 = 0
        sd_event_get_exit_code(handle, &code)
        return code
    }

    /// One iteration of sd-event, then the work its callback queued for this thread. A task
    /// that a reply resumes runs at once: a deferred event source would have waited for
    /// another iteration, its prepare callbacks (sd-bus re-arms its timeout timer there) and an
    /// epoll_wait that returns at once, for sd-event dispatches one source per iteration.
    private func turn() -> Int32 {
        let r = sd_event_run(handle, UInt64.max)
        if ownWorkPending {
            ownWorkPending = false
            drain()
        }
        return r
    }

    /// Sends WATCHDOG=1 automatically when systemd asked for it ($WATCHDOG_USEC); otherwise
    /// adds no wakeup at all.
    public func enableWatchdog() {
        sd_event_set_watchdog(handle, 1)
    }

    /// Makes `run()` return once the current iteration finishes. Call on the loop thread.
    public func exit(code: Int32 = 0) {
        preconditionCurrentOrIdle("EventLoop.exit called")
        sd_event_exit(handle, code)
    }

    /// Runs `body` on the loop thread after the current callback returns. Call on the loop thread.
    public func soon(_ body: @escaping () -> Void) {
        preconditionCurrentOrIdle("EventLoop.soon called")
        let box = Unmanaged.passRetained(DeferredBox(body))
        var source: OpaquePointer?
        let r = sd_event_add_defer(handle, &source, { source, userdata in
            let box = Unmanaged<DeferredBox>.fromOpaque(userdata!).takeRetainedValue()
            sd_event_source_unref(source)
            box.body()
            return 0
        }, box.toOpaque())
        if r < 0 {
            box.release()
            body()
        }
    }

    /// Asks the loop to return after the work already queued, and waits for it.
    public func stop() {
        guard isRunning else { return }
        execute { [self] in _ = sd_event_exit(handle, 0) }
        finished.wait()
    }

    /// How many iterations sd-event has run: a turn is one.
    var iteration: UInt64 {
        var count: UInt64 = 0
        sd_event_get_iteration(handle, &count)
        return count
    }

    /// Whether the calling thread is the one running the loop.
    public var isCurrent: Bool {
        let owner = loopThread.load(ordering: .acquiring)
        return owner != 0 && pthread_equal(owner, pthread_self()) != 0
    }

    /// Whether the calling task is on the loop's thread and an await will resume it here:
    /// it is isolated to an actor (`isolation`, the caller's `#isolation`: on this thread, one
    /// whose executor is the loop) or prefers the loop as its task executor. A nonisolated
    /// task can be on the loop's thread without preferring it (in an optimized build, after
    /// `withTaskExecutorPreference` returns, it runs on here until it next suspends) and
    /// resume anywhere. Reads the task's executor preference, which takes the task's status
    /// lock, only when the cheaper answers do not decide. `isolation` is passed rather than
    /// defaulted to `#isolation`: inside a closure (an `assert`'s condition) that would be
    /// the closure's own, none.
    public func holdsTask(isolatedTo isolation: (any Actor)?) -> Bool {
        guard isCurrent else { return false }
        guard isolation == nil else { return true }
        return withUnsafeCurrentTask { $0?.unownedTaskExecutor } == taskExecutor.asUnownedTaskExecutor()
    }

    /// Whether a thread runs the loop now (`start()` until `stop()`, or inside `run()`).
    public var isRunning: Bool { loopThread.load(ordering: .acquiring) != 0 }

    /// Whether the calling thread may touch what belongs to the loop: it runs the loop, or
    /// no thread does (set-up before `start()`/`run()`, tear-down after).
    public var isCurrentOrIdle: Bool {
        let owner = loopThread.load(ordering: .acquiring)
        return owner == 0 || pthread_equal(owner, pthread_self()) != 0
    }

    /// Traps, in release builds too, unless `isCurrentOrIdle`: sd-bus and sd-event are not
    /// thread-safe, and a reference count dropped on the wrong thread corrupts them silently.
    public func preconditionCurrentOrIdle(_ what: @autoclosure () -> String,
                                          file: StaticString = #fileID, line: UInt = #line) {
        precondition(isCurrentOrIdle, "\(what()) off the thread of its event loop", file: file, line: line)
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        push(.job(UnownedJob(job)))
    }

    /// Runs a closure on the loop thread, from any thread.
    public func execute(_ body: @escaping @Sendable () -> Void) {
        push(.closure(body))
    }

    public func checkIsolated() {
        precondition(isCurrent, "not on the event loop thread")
    }

    public func isIsolatingCurrentContext() -> Bool? { isCurrent }

    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    /// Queues work for the loop. Another thread wakes the loop through the eventfd when the
    /// queue was empty (else a wake-up or a drain is already due); the loop's own thread, which
    /// queues a task's next step each time a reply resumes it, needs no wake-up: a drain under
    /// way takes the work, or else the turn whose callback queued it does, once it returns.
    fileprivate func push(_ work: Work) {
        let onLoop = isCurrent
        let wasEmpty = queue.withLock { queue in
            queue.append(work)
            return queue.count == 1
        }
        if onLoop {
            if !isDraining { ownWorkPending = true }
        } else if wasEmpty {
            var one: UInt64 = 1
            _ = try? withUnsafeBytes(of: &one) { try wakeFD.writeFully($0) }
        }
    }

    private func drain() {
        isDraining = true
        defer { isDraining = false }
        while true {
            queue.withLock { swap(&$0, &batch) }
            if batch.isEmpty { return }
            for work in batch {
                switch work {
                case .job(let job):
                    jobsRun &+= 1
                    job.runSynchronously(isolatedTo: asUnownedSerialExecutor(), taskExecutor: taskExecutor.asUnownedTaskExecutor())
                case .taskJob(let job):
                    jobsRun &+= 1
                    job.runSynchronously(on: taskExecutor.asUnownedTaskExecutor())
                case .closure(let body): body()
                }
            }
            batch.removeAll(keepingCapacity: true)
        }
    }
}

/// The loop as a task executor: it runs a task's nonisolated code and its continuations too, so
/// a task that prefers it (`Bus.call` does, while it waits) never visits the concurrency pool
/// between the loop's own steps. It is apart from the loop's serial executor, though both
/// queue on the loop, because a job runs differently for each: an actor's isolated to the
/// loop, a task's nonisolated. Were a task's jobs run isolated too, every nonisolated function
/// it entered would have to switch off that isolation, a trip through the queue each time.
public final class LoopTaskExecutor: TaskExecutor, @unchecked Sendable {
    /// Set once, as the loop is made; the loop owns this executor.
    fileprivate unowned(unsafe) var loop: EventLoop?

    fileprivate init() {}

    public func enqueue(_ job: consuming ExecutorJob) {
        loop!.push(.taskJob(UnownedJob(job)))
    }

    public func asUnownedTaskExecutor() -> UnownedTaskExecutor {
        UnownedTaskExecutor(ordinary: self)
    }

    /// The loop whose task executor this is.
    public var eventLoop: EventLoop { loop! }

    /// Whether the calling thread runs the loop.
    public var isCurrent: Bool { loop!.isCurrent }
}

private final class DeferredBox {
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}

/// An fd watched by the loop until it is readable or writable. Disabled and freed on deinit,
/// which must come before the fd is closed (checked, in release builds too): sd-event removes
/// the fd from its epoll set by number, and a closed number removes nothing, while epoll keeps
/// watching the pipe or socket as long as any copy of it is open, in this process or another.
/// The next event then names the freed watch, and sd-event aborts in `process_epoll`.
public final class IOWatch: @unchecked Sendable {
    public enum Readiness: Sendable {
        case readable, writable
    }

    private let loop: EventLoop
    private let fd: Int32
    private var source: OpaquePointer?
    private let callback: () -> Void

    public init(loop: EventLoop, fd: Int32, when readiness: Readiness, callback: @escaping () -> Void) throws(BusError) {
        loop.preconditionCurrentOrIdle("IOWatch created")
        self.loop = loop
        self.fd = fd
        self.callback = callback
        let events = readiness == .readable ? shim_epollin() : shim_epollout()
        let r = sd_event_add_io(loop.handle, &source, fd, events, { _, _, _, userdata in
            Unmanaged<IOWatch>.fromOpaque(userdata!).takeUnretainedValue().callback()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        try check(r, "sd_event_add_io")
    }

    public func setEnabled(_ enabled: Bool) {
        loop.preconditionCurrentOrIdle("IOWatch enabled or disabled")
        sd_event_source_set_enabled(source, enabled ? Int32(SD_EVENT_ON) : Int32(SD_EVENT_OFF))
    }

    deinit {
        loop.preconditionCurrentOrIdle("IOWatch released")
        precondition(FileDescriptor(rawValue: fd).isOpen, "IOWatch on descriptor \(fd) released after the descriptor was closed: release the watch first")
        sd_event_source_disable_unref(source)
    }
}

/// A one-shot monotonic timer on the loop. Cancelled on deinit.
public final class LoopTimer: @unchecked Sendable {
    private let loop: EventLoop
    private var source: OpaquePointer?
    private let callback: () -> Void

    /// `accuracy`: how late, in µs, sd-event may fire it to wake once for several timers; 0
    /// means sd-event's default, 250 ms.
    public init(loop: EventLoop, afterMicroseconds delay: UInt64, accuracy: UInt64 = 0, callback: @escaping () -> Void) throws(BusError) {
        loop.preconditionCurrentOrIdle("LoopTimer created")
        self.loop = loop
        self.callback = callback
        var now: UInt64 = 0
        sd_event_now(loop.handle, CLOCK_MONOTONIC, &now)
        let r = sd_event_add_time(loop.handle, &source, CLOCK_MONOTONIC, now + delay, accuracy, { _, _, userdata in
            Unmanaged<LoopTimer>.fromOpaque(userdata!).takeUnretainedValue().callback()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        try check(r, "sd_event_add_time")
    }

    deinit {
        loop.preconditionCurrentOrIdle("LoopTimer released")
        sd_event_source_disable_unref(source)
    }
}

/// A signal delivered through the loop (signalfd); the signal is blocked for the whole process.
public final class SignalWatch: @unchecked Sendable {
    /// Blocks signals in the calling thread and every thread it starts later; call first
    /// thing in `main`, so no thread can take the default action before the loop reads them.
    public static func block(_ signals: [Int32]) {
        var set = sigset_t()
        sigemptyset(&set)
        for signal in signals { sigaddset(&set, signal) }
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    private let loop: EventLoop
    private var source: OpaquePointer?
    private let callback: () -> Void

    public init(loop: EventLoop, signal: Int32, callback: @escaping () -> Void) throws(BusError) {
        loop.preconditionCurrentOrIdle("SignalWatch created")
        self.loop = loop
        self.callback = callback
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, signal)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        let r = sd_event_add_signal(loop.handle, &source, signal, { _, _, userdata in
            Unmanaged<SignalWatch>.fromOpaque(userdata!).takeUnretainedValue().callback()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        try check(r, "sd_event_add_signal")
    }

    deinit {
        loop.preconditionCurrentOrIdle("SignalWatch released")
        sd_event_source_disable_unref(source)
    }
}

import CSystemd
import Foundation
import Synchronization

/// One sd-event loop on a dedicated thread, usable as the serial executor of actors.
///
/// Bus callbacks, fd watches and actor jobs all run on this one thread, so C callbacks can
/// reach actor state with `assumeIsolated`. The loop sleeps in epoll while nothing happens:
/// other threads wake it through an eventfd only when they hand it work.
public final class EventLoop: SerialExecutor, @unchecked Sendable {
    /// The owned `sd_event*`.
    public let handle: OpaquePointer
    private let wakeFD: Int32
    private var wakeSource: OpaquePointer?
    private let queue = Mutex<[Work]>([])
    private let loopThread = Mutex<pthread_t?>(nil)
    private let finished = DispatchSemaphore(value: 0)

    private enum Work {
        case job(UnownedJob)
        case closure(@Sendable () -> Void)
    }

    public init() throws(BusError) {
        var event: OpaquePointer?
        try check(sd_event_new(&event), "sd_event_new")
        handle = event!
        wakeFD = shim_eventfd()
        if wakeFD < 0 {
            sd_event_unref(handle)
            throw BusError.system(-shim_errno(), "eventfd")
        }
        let r = sd_event_add_io(handle, &wakeSource, wakeFD, shim_epollin(), { _, fd, _, userdata in
            var counter: UInt64 = 0
            _ = read(fd, &counter, 8)
            Unmanaged<EventLoop>.fromOpaque(userdata!).takeUnretainedValue().drain()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        if r < 0 {
            close(wakeFD)
            sd_event_unref(handle)
            throw BusError.system(r, "sd_event_add_io")
        }
    }

    deinit {
        sd_event_source_disable_unref(wakeSource)
        close(wakeFD)
        sd_event_unref(handle)
    }

    /// Starts the loop thread. The thread keeps the loop alive until `stop()`.
    public func start(name: String = "sd-event") {
        let thread = Thread { [self] in
            loopThread.withLock { $0 = pthread_self() }
            _ = sd_event_loop(handle)
            loopThread.withLock { $0 = nil }
            finished.signal()
        }
        thread.name = name
        thread.start()
        // Jobs may be enqueued before the thread records itself; they wait in the queue.
        while loopThread.withLock({ $0 == nil }) { usleep(100) }
    }

    /// Runs the loop on the calling thread until `exit()`; the caller's thread becomes the loop thread.
    public func run() throws(BusError) {
        loopThread.withLock { $0 = pthread_self() }
        defer { loopThread.withLock { $0 = nil } }
        try check(sd_event_loop(handle), "sd_event_loop")
    }

    /// Sends WATCHDOG=1 automatically when systemd asked for it ($WATCHDOG_USEC); otherwise
    /// adds no wakeup at all.
    public func enableWatchdog() {
        sd_event_set_watchdog(handle, 1)
    }

    /// Makes `run()` return once the current iteration finishes. Call on the loop thread.
    public func exit(code: Int32 = 0) {
        sd_event_exit(handle, code)
    }

    /// Runs `body` on the loop thread after the current callback returns. Call on the loop thread.
    public func soon(_ body: @escaping () -> Void) {
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
        guard loopThread.withLock({ $0 != nil }) else { return }
        execute { [self] in _ = sd_event_exit(handle, 0) }
        finished.wait()
    }

    public var isCurrent: Bool {
        guard let owner = loopThread.withLock({ $0 }) else { return false }
        return pthread_equal(owner, pthread_self()) != 0
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

    private func push(_ work: Work) {
        let wasEmpty = queue.withLock { queue in
            queue.append(work)
            return queue.count == 1
        }
        if wasEmpty {
            var one: UInt64 = 1
            _ = write(wakeFD, &one, 8)
        }
    }

    private func drain() {
        while true {
            let batch = queue.withLock { queue in
                let batch = queue
                queue.removeAll(keepingCapacity: true)
                return batch
            }
            if batch.isEmpty { return }
            for work in batch {
                switch work {
                case .job(let job): job.runSynchronously(on: asUnownedSerialExecutor())
                case .closure(let body): body()
                }
            }
        }
    }
}

private final class DeferredBox {
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}

/// An fd watched by the loop; the callback gets the epoll events. Disabled and freed on deinit.
public final class IOWatch: @unchecked Sendable {
    private var source: OpaquePointer?
    private let callback: (UInt32) -> Void

    public init(loop: EventLoop, fd: Int32, events: UInt32, callback: @escaping (UInt32) -> Void) throws(BusError) {
        self.callback = callback
        let r = sd_event_add_io(loop.handle, &source, fd, events, { _, _, revents, userdata in
            Unmanaged<IOWatch>.fromOpaque(userdata!).takeUnretainedValue().callback(revents)
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        try check(r, "sd_event_add_io")
    }

    public func setEnabled(_ enabled: Bool) {
        sd_event_source_set_enabled(source, enabled ? Int32(SD_EVENT_ON) : Int32(SD_EVENT_OFF))
    }

    public func setEvents(_ events: UInt32) {
        sd_event_source_set_io_events(source, events)
    }

    deinit { sd_event_source_disable_unref(source) }
}

/// A one-shot monotonic timer on the loop. Cancelled on deinit.
public final class LoopTimer: @unchecked Sendable {
    private var source: OpaquePointer?
    private let callback: () -> Void

    public init(loop: EventLoop, afterMicroseconds delay: UInt64, callback: @escaping () -> Void) throws(BusError) {
        self.callback = callback
        var now: UInt64 = 0
        sd_event_now(loop.handle, CLOCK_MONOTONIC, &now)
        let r = sd_event_add_time(loop.handle, &source, CLOCK_MONOTONIC, now + delay, 0, { _, _, userdata in
            Unmanaged<LoopTimer>.fromOpaque(userdata!).takeUnretainedValue().callback()
            return 0
        }, Unmanaged.passUnretained(self).toOpaque())
        try check(r, "sd_event_add_time")
    }

    deinit { sd_event_source_disable_unref(source) }
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

    private var source: OpaquePointer?
    private let callback: () -> Void

    public init(loop: EventLoop, signal: Int32, callback: @escaping () -> Void) throws(BusError) {
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

    deinit { sd_event_source_disable_unref(source) }
}

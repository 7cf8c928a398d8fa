import BusKit

/// Work nobody waits for, held back until the reply just sent has had time to reach its
/// caller. A file load's end is such work: the destination's `Load` reply already carries the
/// verdict, and the end (its record, and `LoadFinished` and `PropertiesChanged` to each end,
/// each relayed by the bus and read by the source) sent right behind the reply kept that reply
/// from its caller on two CPUs, about 130 µs of a 650 µs handover (README, Performance).
///
/// Held work runs `delay` µs later, or before the next call is served (`Dispatcher.serve`),
/// whichever comes first: no call ever sees the state from before it ran, so what a call is
/// allowed (loads in flight, fair shares) and the order of a session's signals (a load's end
/// before the session's) are as if it had run at once.
final class AfterReplies {
    /// About three relays by the bus on this machine; a load's end that waits longer is only
    /// later, not faster for anyone.
    static let delay: UInt64 = 200

    private let loop: EventLoop
    private var held: [() -> Void] = []
    private var timer: LoopTimer?

    init(loop: EventLoop) { self.loop = loop }

    /// Runs `work` within `delay` µs, or before the next call is served. Without a timer
    /// (sd-event out of resources), at once.
    func hold(_ work: @escaping () -> Void) {
        held.append(work)
        guard timer == nil else { return }
        timer = try? LoopTimer(loop: loop, afterMicroseconds: Self.delay, accuracy: Self.delay / 4) { [unowned self] in runAll() }
        if timer == nil { runAll() }
    }

    /// Runs everything held, in the order it was held. A timer is armed exactly while work is
    /// held, so on every call's path with nothing held this is one check.
    func runAll() {
        guard !held.isEmpty else { return }
        timer = nil
        let work = held
        held = []
        for body in work { body() }
    }
}

import Glibc
import SystemCalls

/// How many refusals are recorded one by one, after journald's `RateLimitIntervalSec=` and
/// `RateLimitBurst=`: per bucket (an app, and the unsandboxed apps of a user together), the
/// first `burst` refusals of each interval are written; the rest are counted, and one summary
/// says how many once the interval is over. So a client that asks for what it may not have,
/// however fast and from however many connections, makes the log grow by at most
/// `burst + 1` rows per interval and bucket.
struct RefusalRateLimit {
    struct Rule: Sendable, Equatable {
        /// Microseconds.
        var interval: UInt64
        var burst: Int
        /// Microseconds a refusal past the burst waits for its answer (`DelayedRefusals`).
        var delay: UInt64 = 100_000
    }

    /// Refusals suppressed in one bucket's interval, to be summed up when it ends.
    struct Suppressed: Equatable {
        var bucket: Bucket
        var count: Int
        var since: UInt64
        /// A refused identity of the bucket, for the summary row's uid and pid.
        var uid: uid_t
        var pid: pid_t
    }

    private struct Window {
        var start: UInt64
        var written = 0
        var suppressed = 0
        var uid: uid_t = 0
        var pid: pid_t = 0
    }

    private var windows: [Bucket: Window] = [:]
    /// Windows are swept at most this often, so a refusal costs a dictionary probe, not a walk.
    private var lastSweep: UInt64 = 0

    /// Whether a refusal charged to `buckets` is written: only if each is still within its
    /// burst. Every bucket counts it either way; a suppressed one counts in each bucket that is
    /// past its burst. Also returns the windows that ended by `now`, with refusals to sum up.
    mutating func admit(_ buckets: [Bucket], uid: uid_t, pid: pid_t, rule: Rule, now: UInt64) -> (write: Bool, ended: [Suppressed]) {
        var ended: [Suppressed] = []
        if now >= lastSweep + min(rule.interval, 1_000_000) {
            ended = expire(now: now, rule: rule)
        }
        for bucket in buckets {
            if let window = windows[bucket], now >= window.start + rule.interval {
                windows.removeValue(forKey: bucket)
                if window.suppressed > 0 {
                    ended.append(Suppressed(bucket: bucket, count: window.suppressed, since: window.start, uid: window.uid, pid: window.pid))
                }
            }
        }
        let write = buckets.allSatisfy { (windows[$0]?.written ?? 0) < rule.burst }
        for bucket in buckets {
            var window = windows[bucket] ?? Window(start: now)
            if write {
                window.written += 1
            } else if window.written >= rule.burst {
                window.suppressed += 1
                (window.uid, window.pid) = (uid, pid)
            }
            windows[bucket] = window
        }
        return (write, ended)
    }

    /// Ends every window older than the interval; returns those that suppressed refusals.
    mutating func expire(now: UInt64, rule: Rule) -> [Suppressed] {
        lastSweep = now
        var ended: [Suppressed] = []
        for (bucket, window) in windows where now >= window.start + rule.interval {
            windows.removeValue(forKey: bucket)
            if window.suppressed > 0 {
                ended.append(Suppressed(bucket: bucket, count: window.suppressed, since: window.start, uid: window.uid, pid: window.pid))
            }
        }
        return ended.sorted { $0.since < $1.since }
    }

    /// When the earliest window with suppressed refusals ends, if any does.
    func nextSummary(rule: Rule) -> UInt64? {
        windows.values.filter { $0.suppressed > 0 }.map { $0.start + rule.interval }.min()
    }
}

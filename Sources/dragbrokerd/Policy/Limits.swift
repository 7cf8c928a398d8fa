// Policy/ — the administrator's policy as the daemon applies it. Parsing, validation and
// rendering live in the BrokerPolicy library (a new key: its `Policy.swift` tables); a new
// limit also gets a field here, read where the daemon enforces it.
import BrokerPolicy

/// Bounds on everything a client can make the daemon hold. Each is answered with
/// `LimitExceeded` when reached. Most come from the policy's `[Limits]`.
struct Limits: Sendable {
    var sessionsPerConnection = 16
    var sessionsTotal = 1024
    var itemsPerSession = 256
    var representationsPerItem = 32
    var destinationsPerSession = 64
    var concurrentLoadsPerSession = 16
    var sessionsPerApp = 64
    var sessionsPerUser = 256
    var loadsPerApp = 64
    var loadsPerUser = 256
    var loadsTotal = 4096
    var maxStringLength = 255
    /// Microseconds a source may take to produce the first byte (or hand over the file).
    var firstByteTimeout: UInt64 = 30_000_000
    /// Microseconds a load may make no progress.
    var stallTimeout: UInt64 = 30_000_000
    /// Microseconds from BeginSession within which the drag must be dropped.
    var dragTimeout: UInt64 = 300_000_000
    /// Microseconds a dropped session may sit with no load in flight before it ends.
    var concludeTimeout: UInt64 = 60_000_000
    var descriptorThreads = BlockingWorkers.Bounds(perOwner: 4, total: 32)
    var refusalRate = RefusalRateLimit.Rule(interval: 60_000_000, burst: 60)

    init() {}

    init(_ policy: PolicyLimits) {
        sessionsPerConnection = policy.sessionsPerConnection
        sessionsTotal = policy.sessionsTotal
        itemsPerSession = policy.itemsPerSession
        representationsPerItem = policy.representationsPerItem
        destinationsPerSession = policy.destinationsPerSession
        concurrentLoadsPerSession = policy.concurrentLoadsPerSession
        sessionsPerApp = policy.sessionsPerApp
        sessionsPerUser = policy.sessionsPerUser
        loadsPerApp = policy.loadsPerApp
        loadsPerUser = policy.loadsPerUser
        loadsTotal = policy.loadsTotal
        maxStringLength = policy.maxStringLength
        firstByteTimeout = UInt64(policy.firstByteTimeoutSec) * 1_000_000
        stallTimeout = UInt64(policy.stallTimeoutSec) * 1_000_000
        dragTimeout = UInt64(policy.dragTimeoutSec) * 1_000_000
        concludeTimeout = UInt64(policy.concludeTimeoutSec) * 1_000_000
        descriptorThreads = BlockingWorkers.Bounds(perOwner: policy.descriptorThreadsPerApp, total: policy.descriptorThreadsTotal)
        refusalRate = RefusalRateLimit.Rule(interval: UInt64(policy.refusalRateLimitIntervalSec) * 1_000_000,
                                            burst: policy.refusalRateLimitBurst, delay: UInt64(policy.refusalDelayMsec) * 1_000)
    }
}

import BrokerProtocol

/// What each bucket (`AppIdentity.buckets`: an app, and the unsandboxed apps of a user
/// together) holds of the daemon now, against its bounds, so that no app, however many
/// connections it opens or however often it reconnects, takes what other apps need:
///
/// - live sessions it began (`SessionsPerApp=`, `SessionsPerUser=`);
/// - loads in flight, each counted against both its destination, which asked, and its
///   source, which must answer (`LoadsPerApp=`, `LoadsPerUser=`). A data load holds two of the
///   daemon's descriptors while it lasts, a file load at most two while its file is handed
///   over, so this also bounds the descriptors an app holds;
/// - loads in flight for everyone together: the lower of `LoadsTotal=` and what the daemon's
///   own descriptor limit allows once a reserve is kept to answer, record and refuse.
struct Quota {
    private var sessions: [Bucket: Int] = [:]
    private var loads: [Bucket: Int] = [:]
    private(set) var totalLoads = 0

    /// Descriptors kept back from loads: the bus, the event loop, the log and its ledger, and
    /// what stuck descriptor threads may hold, so the daemon can always answer and record.
    static func descriptorReserve(_ limits: Limits) -> Int { 128 + 2 * limits.descriptorThreads.total }

    /// Loads the daemon may have in flight with `descriptors` descriptors at most.
    static func loads(allowedBy descriptors: Int, _ limits: Limits) -> Int {
        max(0, (descriptors - descriptorReserve(limits)) / 2)
    }

    // MARK: Sessions

    func admitSession(of source: AppIdentity, _ limits: Limits) throws(BrokerError) {
        try Self.admit(sessions, source.buckets, "live sessions",
                       app: (limits.sessionsPerApp, "SessionsPerApp"), user: (limits.sessionsPerUser, "SessionsPerUser"))
    }

    mutating func sessionBegan(by source: AppIdentity) {
        for bucket in source.buckets { sessions[bucket, default: 0] += 1 }
    }

    mutating func sessionEnded(by source: AppIdentity) {
        for bucket in source.buckets { Self.decrement(&sessions, bucket) }
    }

    // MARK: Loads

    /// Whether a load from `source` to `destination` may start now, with `descriptors` the
    /// daemon's descriptor limit (nil: none known).
    func admitLoad(from source: AppIdentity, to destination: AppIdentity, _ limits: Limits, descriptors: Int?) throws(BrokerError) {
        try Self.admit(loads, Self.buckets(source, destination), "loads in flight",
                       app: (limits.loadsPerApp, "LoadsPerApp"), user: (limits.loadsPerUser, "LoadsPerUser"))
        let total = min(limits.loadsTotal, descriptors.map { Self.loads(allowedBy: $0, limits) } ?? Int.max)
        guard totalLoads < total else {
            let why = total < limits.loadsTotal
                ? "all that its limit of \(descriptors ?? 0) descriptors allows (LimitNOFILE=, less a reserve of \(Self.descriptorReserve(limits)))"
                : "its limit (LoadsTotal=\(limits.loadsTotal))"
            throw .limitExceeded("dragbrokerd has \(totalLoads) loads in flight, \(why)")
        }
    }

    mutating func loadStarted(from source: AppIdentity, to destination: AppIdentity) {
        for bucket in Self.buckets(source, destination) { loads[bucket, default: 0] += 1 }
        totalLoads += 1
    }

    mutating func loadEnded(from source: AppIdentity, to destination: AppIdentity) {
        for bucket in Self.buckets(source, destination) { Self.decrement(&loads, bucket) }
        totalLoads -= 1
    }

    /// What a bucket holds now, for `dragctl stats`.
    func usage(of bucket: Bucket) -> (sessions: Int, loads: Int) {
        (sessions[bucket, default: 0], loads[bucket, default: 0])
    }

    var buckets: Set<Bucket> { Set(sessions.keys).union(loads.keys) }

    /// A load between two connections of one app counts once for that app.
    private static func buckets(_ source: AppIdentity, _ destination: AppIdentity) -> [Bucket] {
        source.buckets + destination.buckets.filter { !source.buckets.contains($0) }
    }

    private static func decrement(_ counts: inout [Bucket: Int], _ bucket: Bucket) {
        let left = counts[bucket, default: 1] - 1
        counts[bucket] = left > 0 ? left : nil
    }

    /// Refuses the first of `buckets` already holding its limit of what `counts` counts: the
    /// app's limit for an app, the user's for the unsandboxed apps of a user.
    private static func admit(_ counts: [Bucket: Int], _ buckets: [Bucket], _ what: String,
                              app: (limit: Int, key: String), user: (limit: Int, key: String)) throws(BrokerError) {
        for bucket in buckets {
            let (limit, key) = if case .app = bucket { app } else { user }
            let held = counts[bucket, default: 0]
            guard held < limit else {
                throw .limitExceeded("\(bucket.holder) \(held) \(what), \(bucket.possessive) limit (\(key)=\(limit))")
            }
        }
    }
}

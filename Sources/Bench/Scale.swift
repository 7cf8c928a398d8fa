import BrokerProtocol
import BusKit
import Foundation
import Glibc
import Histogram
import TransferLog

/// (e) Scale: the daemon holding 10,000 live sessions, begun by one source connection in a
/// process of its own (the `scale-source` role), so that its disconnect can be measured too.
/// Levels rise 1 → 100 → 10,000 and never fall until the disconnect; each figure is measured
/// at its level the same way as at the level it is compared with.
enum Scale {
    /// The session count the section builds up to, and the policy limits the bench's daemon is
    /// given (per connection and in total) so that one connection may hold them all. The
    /// other sections hold at most a handful of sessions, far below the default limits, so
    /// raising them changes nothing there.
    static let sessions = Smoke.pick(10_000, 300)
    static let policyLimit = 20_000
    /// How many sessions the destination presents and proposes to at 10,000.
    static let sampledSessions = Smoke.pick(200, 20)
    /// The smaller level BeginSession is compared against.
    static let beginLevel = Smoke.pick(100, 20)
    static let beginWarmup = Smoke.pick(30, 3)
    static let beginIterations = Smoke.pick(300, 10)
    static let beginBudget = 30.0
    /// BeginSession calls the source keeps in flight while building up the levels.
    static let setupInFlight = 32
    static let setupBudget = 300.0
    static let managedObjectsCalls = Smoke.pick(5, 2)
    static let managedObjectsBudget = 60.0
    static let disconnectBudget = 60.0
    static let disconnectPollNanoseconds: UInt64 = 500_000
    /// One D-Bus call's timeout in the section, in µs: well above any figure it can meet.
    static let callTimeout: UInt64 = 120_000_000

    /// The drop-in startWorld writes into the bench daemon's policy directory.
    static let policyDropIn = """
        # dragbroker-bench: the scale section holds \(sessions) sessions on one source connection.
        [Limits]
        SessionsPerConnection=\(policyLimit)
        SessionsTotal=\(policyLimit)
        SessionsPerApp=\(policyLimit)
        SessionsPerUser=\(policyLimit)

        """

    struct Result {
        var lines: [String]
        var keys: [String]
    }

    static func run(world: Orchestrator.World) async throws -> Result {
        let sectionStart = monotonicNanos()
        let executable = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        let probe = try ScaleClient(address: world.address, description: "dragbroker-bench-scale-probe")
        defer { probe.close() }
        try await probe.connect()
        // The other sections' sessions end with their source; start from an empty registry.
        try await probe.waitForSessionCount(0, timeout: 30)
        let rssEmpty = residentMiB(world.daemonPID)

        let source = try Child(name: "scale-source", executable: executable, arguments: ["scale-source"],
                               environment: ["PATH": "/usr/local/bin:/usr/bin:/bin", "DRAGBROKER_BUS_ADDRESS": world.address].merging(Smoke.environment) { $1 })
        Cleanup.shared.add(source)
        guard source.answer(timeout: 30, where: { $0.hasPrefix("READY ") }) != nil else {
            throw BenchError("the scale source did not start: \(source.stdout.tail(5))\n\(source.diagnostics())")
        }
        func command(_ line: String, timeout: TimeInterval) throws -> String {
            let verb = String(line.split(separator: " ")[0])
            try source.send(line)
            guard let answer = source.stdout.take(timeout: timeout, where: { $0.hasPrefix("OK \(verb)") || $0.hasPrefix("ERR") }) else {
                throw BenchError("the scale source did not answer `\(line)` within \(Int(timeout)) s\n\(source.diagnostics())")
            }
            guard answer.hasPrefix("OK \(verb)") else { throw BenchError("the scale source failed `\(line)`: \(answer)") }
            return String(answer.dropFirst("OK \(verb)".count)).trimmingCharacters(in: .whitespaces)
        }
        func grow(to level: Int) async throws -> Double {
            let start = monotonicNanos()
            let have = Int(try await probe.sessionCount())
            guard have < level else { return 0 }
            let total = Int(try command("begin \(level - have) \(setupInFlight)", timeout: setupBudget))
            guard total == level else { throw BenchError("the scale source holds \(total ?? -1) sessions, not \(level)") }
            try await probe.waitForSessionCount(UInt32(level), timeout: 30)
            return Double(monotonicNanos() - start) / 1e9
        }
        func sample(_ count: Int) throws -> [String] {
            try command("sample \(count)", timeout: 30).split(separator: " ").map(String.init)
        }
        func timeBegins(level: Int) async throws -> (Histogram<UInt64>, Int) {
            var histogram = latencyHistogram()
            let values = try command("timebegin \(beginWarmup) \(beginIterations) \(beginBudget)", timeout: beginBudget + 60)
                .split(separator: " ").compactMap { UInt64($0) }
            guard !values.isEmpty else { throw BenchError("no BeginSession was timed at \(level) sessions") }
            for value in values { histogram.record(value) }
            // Each timed session was cancelled before the next began: the level is unchanged.
            try await probe.waitForSessionCount(UInt32(level), timeout: 30)
            return (histogram, values.count)
        }

        // Update with 1 live session, then BeginSession at 100.
        Orchestrator.progress("(e) scale: Update at 1 session, BeginSession at \(beginLevel), then both at \(sessions) sessions, "
                              + "GetManagedObjects, daemon RSS, and the disconnect of the source holding them all")
        _ = try await grow(to: 1)
        let destination = try ScaleClient(address: world.address, description: "dragbroker-bench-scale-destination")
        defer { destination.close() }
        try await destination.connect()
        try await destination.join(tokens: try sample(1))
        let (update1, update1Count) = try await measureUpdates(destination)
        _ = try await grow(to: beginLevel)
        let (begin100, begin100Count) = try await timeBegins(level: beginLevel)

        // 10,000 sessions; the destination presents 200 of them, chosen uniformly at random.
        let setupSeconds = try await grow(to: sessions)
        let rssFull = residentMiB(world.daemonPID)
        try await destination.join(tokens: try sample(sampledSessions))
        let (update10k, update10kCount) = try await measureUpdates(destination)
        let (begin10k, begin10kCount) = try await timeBegins(level: sessions)
        let rss = residentMiB(world.daemonPID)

        // GetManagedObjects on the manager path: the median of a few calls.
        var managedTimes: [Double] = []
        var managedObjects = 0
        let managedDeadline = monotonicNanos() + UInt64(managedObjectsBudget * 1e9)
        let daemonCPUBefore = Usage.processCPU(world.daemonPID)
        while managedTimes.count < managedObjectsCalls && (managedTimes.isEmpty || monotonicNanos() < managedDeadline) {
            let (nanos, objects) = try await probe.managedObjects()
            managedTimes.append(Double(nanos) / 1e6)
            managedObjects = objects
        }
        let daemonCPUPerCall = (Usage.processCPU(world.daemonPID) - daemonCPUBefore) / Double(managedTimes.count) * 1000
        guard managedObjects >= sessions else {
            throw BenchError("GetManagedObjects listed \(managedObjects) objects with \(sessions) live sessions")
        }
        let rssAfterManaged = residentMiB(world.daemonPID)

        // The source's connection goes away with its process: SIGKILL, then SessionCount is
        // polled until it reads 0.
        guard try await probe.sessionCount() == UInt32(sessions) else {
            throw BenchError("the daemon does not hold \(sessions) sessions before the disconnect")
        }
        let killed = monotonicNanos()
        kill(source.pid, SIGKILL)
        var polls = 0
        while true {
            let count = try await probe.sessionCount()
            polls += 1
            if count == 0 { break }
            guard monotonicNanos() - killed < UInt64(disconnectBudget * 1e9) else {
                throw BenchError("\(count) sessions were still live \(Int(disconnectBudget)) s after their source disconnected")
            }
            try await Task.sleep(nanoseconds: disconnectPollNanoseconds)
        }
        let disconnectMs = Double(monotonicNanos() - killed) / 1e6
        // The sessions leave the registry at once; telling the other parties and auditing each
        // end follows in slices. This is when the last end is on record in the transfer log.
        let logPath = world.stateDirectory.appendingPathComponent("transfers.sqlite").path
        var recorded = 0
        while recorded < sessions {
            recorded = (try? TransferLog.openReadOnly(path: logPath).sessions(limit: 4 * sessions)
                .filter { $0.outcome == "source-disconnected" }.count) ?? 0
            guard monotonicNanos() - killed < UInt64(disconnectBudget * 1e9) else {
                throw BenchError("only \(recorded) of \(sessions) session ends were recorded \(Int(disconnectBudget)) s after the disconnect")
            }
            if recorded < sessions { try await Task.sleep(nanoseconds: 5_000_000) }
        }
        let recordedMs = Double(monotonicNanos() - killed) / 1e6
        _ = source.waitForExit(timeout: 10)
        let sectionSeconds = Double(monotonicNanos() - sectionStart) / 1e9

        let managedMedian = Orchestrator.median(managedTimes)
        let updateRatio = update10k.micros(99) / update1.micros(99)
        let beginRatio = begin10k.micros(50) / begin100.micros(50)
        var lines: [String] = []
        lines.append("(e) scale: \(sessions) live sessions begun by one library-free source connection (a process of its own; one item,")
        lines.append("    one data representation each; policy limits raised to \(policyLimit) per connection and in total), built up")
        lines.append("    1 → \(beginLevel) → \(sessions) with \(setupInFlight) BeginSession calls in flight (the last step took \(format(setupSeconds, 2)) s);")
        lines.append("    the whole section took \(format(sectionSeconds)) s")
        lines.append("  Update round trip: the destination presents the tokens of N sessions chosen uniformly at random, Enters each,")
        lines.append("    then Updates them round robin (\(Orchestrator.latencyWarmup) warm-up discarded, each after a \(Orchestrator.pauseMicroseconds) µs pause)")
        lines.append("    1 session (N=1): " + percentiles(update1, update1Count))
        lines.append("    \(sessions) sessions (N=\(sampledSessions)): " + percentiles(update10k, update10kCount))
        lines.append("    ratio p99 \(format(updateRatio, 2)) (target ≤ 2), p50 \(format(update10k.micros(50) / update1.micros(50), 2))")
        lines.append("  BeginSession round trip from the source connection, each session cancelled (untimed) before the next begins,")
        lines.append("    so the level stays put; \(beginWarmup) warm-up discarded, each after a \(Orchestrator.pauseMicroseconds) µs pause")
        lines.append("    at \(beginLevel) sessions: " + percentiles(begin100, begin100Count))
        lines.append("    at \(sessions) sessions: " + percentiles(begin10k, begin10kCount))
        lines.append("    ratio p50 \(format(beginRatio, 2)) (target ≤ 1.5), p99 \(format(begin10k.micros(99) / begin100.micros(99), 2))")
        lines.append("  GetManagedObjects on \(BrokerNames.managerPath) at \(sessions) sessions (\(managedObjects) objects listed): "
                     + "\(managedTimes.map { format($0) }.joined(separator: " ")) ms, median \(format(managedMedian)) ms (target ≤ 100 ms);")
        lines.append("    the daemon's CPU time per call \(format(daemonCPUPerCall)) ms (the rest: dbus-daemon relaying the reply, and waiting for a CPU)")
        lines.append("  disconnect: SIGKILL of the source holding \(sessions) sessions (\(sampledSessions + 1) of them with a destination)")
        lines.append("    until SessionCount reads 0 (polled with Properties.Get, \(polls) call\(polls == 1 ? "" : "s")): \(format(disconnectMs)) ms (target ≤ 250 ms)")
        lines.append("    until all \(sessions) ends are in the transfer log (other parties told, each end audited, in slices of")
        lines.append("    \(256) sessions per turn of the daemon's loop; the log polled every 5 ms): \(format(recordedMs)) ms (no target)")
        lines.append("  daemon VmRSS: \(format(rssEmpty)) MiB at 0 sessions, \(format(rssFull)) MiB just after reaching \(sessions), "
                     + "\(format(rss)) MiB after the Update and BeginSession runs (target ≤ 48 MiB), \(format(rssAfterManaged)) MiB after GetManagedObjects")
        let keys = [
            "update_p99_10k_vs_1=\(format(updateRatio, 2))",
            "begin_10k_vs_100=\(format(beginRatio, 2))",
            "managed_objects_10k_ms=\(format(managedMedian))",
            "disconnect_10k_ms=\(format(disconnectMs))",
            "rss_10k_mib=\(format(rss))",
        ]
        return Result(lines: lines, keys: keys)
    }

    /// Update round trips round robin over the destination's sessions, as (d) measures them:
    /// warm-up, then up to the count or the budget, each after the settling pause.
    static func measureUpdates(_ destination: ScaleClient) async throws -> (Histogram<UInt64>, Int) {
        var histogram = latencyHistogram()
        for _ in 0..<Orchestrator.latencyWarmup { _ = try await destination.update() }
        let deadline = monotonicNanos() + UInt64(Orchestrator.latencyBudget * 1e9)
        var count = 0
        while count < Orchestrator.latencyIterations && monotonicNanos() < deadline {
            try await Orchestrator.settle()
            histogram.record(try await destination.update())
            count += 1
        }
        return (histogram, count)
    }

    static func percentiles(_ histogram: Histogram<UInt64>, _ count: Int) -> String {
        "n=\(count): p50 \(format(histogram.micros(50))) µs, p99 \(format(histogram.micros(99))) µs"
    }

    /// VmRSS from /proc/PID/status, in MiB.
    static func residentMiB(_ pid: pid_t) -> Double {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = text.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
              let kib = Double(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else { return .nan }
        return kib / 1024
    }
}

/// The destination and the observer of the scale section, straight on BusKit.
actor ScaleClient {
    let loop: EventLoop
    let bus: Bus
    var broker = ""
    /// The sessions Update goes round, and the next one's index.
    var paths: [String] = []
    var next = 0

    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    init(address: String, description: String) throws(BusError) {
        let loop = try EventLoop()
        bus = try Bus.connect(address: address, loop: loop, description: description)
        loop.start(name: description)
        self.loop = loop
    }

    func connect() async throws(BusError) {
        broker = try await bus.nameOwner(BrokerNames.busName)
    }

    /// Stops the loop, closing the connection: the bus may be released only on its loop's
    /// thread or once no thread runs the loop. Call from outside the loop, once, at the end.
    nonisolated func close() {
        loop.stop()
    }

    func call(_ path: String, _ interface: String, _ member: String, timeout: UInt64 = Scale.callTimeout,
              _ build: (Message) throws(BusError) -> Void = { _ in }) async throws(BusError) -> Message {
        let m = try bus.newMethodCall(destination: broker, path: path, interface: interface, member: member)
        try build(m)
        return try await bus.call(m, timeout: timeout)
    }

    /// Presents each token and Enters its session with a copy proposal; Update then goes
    /// round these sessions only.
    func join(tokens: [String]) async throws {
        var joined: [String] = []
        for token in tokens {
            let reply = try await call(BrokerNames.managerPath, BrokerNames.managerInterface, "PresentToken") { m throws(BusError) in try m.append(token) }
            let path = try reply.readObjectPath()
            let entered = try await call(path, BrokerNames.sessionInterface, "Enter") { m throws(BusError) in try m.append("copy") }
            guard try entered.readString() == "copy" else { throw BenchError("Enter(copy) was not allowed on \(path)") }
            joined.append(path)
        }
        paths = joined
        next = 0
    }

    /// One Update round trip on the next session, in nanoseconds (the message is built before timing).
    func update() async throws -> UInt64 {
        guard !paths.isEmpty else { throw BenchError("Update before any session was joined") }
        let path = paths[next % paths.count]
        next += 1
        let m = try bus.newMethodCall(destination: broker, path: path, interface: BrokerNames.sessionInterface, member: "Update")
        try m.append("copy")
        let start = monotonicNanos()
        let reply = try await bus.call(m, timeout: Scale.callTimeout)
        let elapsed = monotonicNanos() - start
        let allowed = try reply.readString()
        guard allowed == "copy" else { throw BenchError("Update answered \(allowed) on \(path)") }
        return elapsed
    }

    /// The manager's SessionCount, through org.freedesktop.DBus.Properties.Get.
    func sessionCount() async throws -> UInt32 {
        let reply = try await call(BrokerNames.managerPath, "org.freedesktop.DBus.Properties", "Get") { m throws(BusError) in
            try m.append(BrokerNames.managerInterface)
            try m.append("SessionCount")
        }
        _ = try reply.enterContainer("v", "u")
        return try reply.readUInt32()
    }

    /// Polls SessionCount until it reads `count`.
    func waitForSessionCount(_ count: UInt32, timeout: Double) async throws {
        let deadline = monotonicNanos() + UInt64(timeout * 1e9)
        var last = try await sessionCount()
        while last != count {
            guard monotonicNanos() < deadline else { throw BenchError("SessionCount reads \(last), not \(count), after \(Int(timeout)) s") }
            try await Task.sleep(nanoseconds: 10_000_000)
            last = try await sessionCount()
        }
    }

    /// One GetManagedObjects round trip on the manager path: its time in nanoseconds (the
    /// reply is walked after timing) and the number of objects it lists.
    func managedObjects() async throws -> (UInt64, Int) {
        let m = try bus.newMethodCall(destination: broker, path: BrokerNames.managerPath,
                                      interface: "org.freedesktop.DBus.ObjectManager", member: "GetManagedObjects")
        let start = monotonicNanos()
        let reply = try await bus.call(m, timeout: Scale.callTimeout)
        let elapsed = monotonicNanos() - start
        var objects = 0
        _ = try reply.enterContainer("a", "{oa{sa{sv}}}")
        while try reply.enterContainer("e", "oa{sa{sv}}") {
            _ = try reply.readObjectPath()
            try reply.skip("a{sa{sv}}")
            try reply.exitContainer()
            objects += 1
        }
        try reply.exitContainer()
        return (elapsed, objects)
    }
}

/// The `scale-source` role: one library-free source connection that begins and holds many
/// sessions, each of one item with one data representation, all served by one provider
/// object (never called: the section loads nothing). Lines on stdin/stdout:
///
///     → READY <unique bus name>
///     ← begin <count> <in flight>     begin that many more, that many calls in flight
///     → OK begin <sessions held>
///     ← sample <count>                tokens of that many held sessions, distinct, uniformly at random
///     → OK sample <token> …
///     ← timebegin <warm-up> <count> <budget s>   BeginSession timed (ns), each session cancelled before the next
///     → OK timebegin <ns> …
///     ← quit (or end of input) exit
/// Any failure answers `ERR …`.
enum ScaleSourceRole {
    static func run() async -> Never {
        do {
            let source = try ScaleSource(address: ProcessInfo.processInfo.environment["DRAGBROKER_BUS_ADDRESS"] ?? "")
            let name = try await source.start()
            SourceRole.emit("READY \(name)")
            while let line = try await offThread({ readLine() }) {
                let words = line.split(separator: " ").map(String.init)
                do {
                    switch words.first {
                    case "begin":
                        guard words.count == 3, let count = Int(words[1]), let inFlight = Int(words[2]), count >= 0, inFlight > 0 else {
                            throw BenchError("usage: begin <count> <in flight>")
                        }
                        SourceRole.emit("OK begin \(try await source.begin(count: count, inFlight: inFlight))")
                    case "sample":
                        guard words.count == 2, let count = Int(words[1]) else { throw BenchError("usage: sample <count>") }
                        SourceRole.emit("OK sample " + (try await source.sample(count)).joined(separator: " "))
                    case "timebegin":
                        guard words.count == 4, let warmup = Int(words[1]), let count = Int(words[2]), let budget = Double(words[3]) else {
                            throw BenchError("usage: timebegin <warm-up> <count> <budget s>")
                        }
                        let values = try await source.timeBegins(warmup: warmup, count: count, budget: budget)
                        SourceRole.emit("OK timebegin " + values.map(String.init).joined(separator: " "))
                    case "quit":
                        exit(0)
                    default:
                        throw BenchError("unknown command \(line)")
                    }
                } catch {
                    SourceRole.emit("ERR \(words.first ?? "") \(error)")
                }
            }
            exit(0)
        } catch {
            SourceRole.emit("ERR \(error)")
            exit(1)
        }
    }
}

actor ScaleSource {
    struct Held {
        let path: String
        let token: String
    }

    let loop: EventLoop
    let bus: Bus
    private var broker = ""
    private var provider: ExportedObject?
    private var held: [Held] = []
    /// BeginSession calls still to issue in the current `begin`.
    private var toIssue = 0
    static let providerPath = BrokerNames.providerPathPrefix + "scale"
    static let type = "application/x-dragbroker-bench-scale"

    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    init(address: String) throws(BusError) {
        let loop = try EventLoop()
        bus = try Bus.connect(address: address, loop: loop, description: "dragbroker-bench-scale-source")
        loop.start(name: "dragbroker-bench-scale-source")
        self.loop = loop
    }

    func start() async throws(BusError) -> String {
        broker = try await bus.nameOwner(BrokerNames.busName)
        let refuse: InterfaceImplementation.MethodHandler = { _ throws(BusError) in
            throw BusError(name: "org.freedesktop.DBus.Error.Failed", message: "the scale source serves no data")
        }
        provider = try bus.export(path: Self.providerPath, interface: BrokerInterfaces.provider,
                                  implementation: InterfaceImplementation(methods: ["Provide": refuse, "ProvideFile": refuse]))
        return bus.uniqueName
    }

    private func beginMessage() throws(BusError) -> Message {
        let item = ItemDescriptor(suggestedName: "scale.bin", representations: [
            RepresentationDescriptor(typeIdentifier: Self.type, visibility: .all, kind: .data),
        ])
        return try beginSessionCall(on: bus, broker: broker, item: item, provider: Self.providerPath)
    }

    private func claim() -> Bool {
        guard toIssue > 0 else { return false }
        toIssue -= 1
        return true
    }

    private func beginAndHold() async throws(BusError) {
        let reply = try await bus.call(try beginMessage(), timeout: Scale.callTimeout)
        let path = try reply.readObjectPath()
        held.append(Held(path: path, token: try reply.readString()))
    }

    /// Begins `count` more sessions with `inFlight` calls outstanding; returns how many it holds.
    func begin(count: Int, inFlight: Int) async throws -> Int {
        toIssue = count
        defer { toIssue = 0 }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<min(inFlight, count) {
                group.addTask {
                    while await self.claim() { try await self.beginAndHold() }
                }
            }
            try await group.waitForAll()
        }
        return held.count
    }

    func sample(_ count: Int) throws -> [String] {
        guard count <= held.count else { throw BenchError("asked for \(count) of \(held.count) sessions") }
        return held.indices.shuffled().prefix(count).map { held[$0].token }
    }

    /// BeginSession round trips in nanoseconds, each after the settling pause; every session
    /// begun here is cancelled (untimed) before the next begins. Stops at the count or the budget.
    func timeBegins(warmup: Int, count: Int, budget: Double) async throws -> [UInt64] {
        var values: [UInt64] = []
        let deadline = monotonicNanos() + UInt64(budget * 1e9)
        var index = 0
        while index < warmup + count && (index <= warmup || monotonicNanos() < deadline) {
            try await Orchestrator.settle()
            let m = try beginMessage()
            let start = monotonicNanos()
            let reply = try await bus.call(m, timeout: Scale.callTimeout)
            let elapsed = monotonicNanos() - start
            let path = try reply.readObjectPath()
            let cancel = try bus.newMethodCall(destination: broker, path: path, interface: BrokerNames.sessionInterface, member: "Cancel")
            _ = try await bus.call(cancel, timeout: Scale.callTimeout)
            if index >= warmup { values.append(elapsed) }
            index += 1
        }
        return values
    }
}

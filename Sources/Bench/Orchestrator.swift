import BrokerClient
import BrokerProtocol
import BusKit
import Foundation
import Glibc
import Histogram
import SystemCalls
import SystemPackage

/// The orchestrating role, which is also the destination: starts a private bus, the daemon
/// and the source process, measures, cleans up, and prints the report.
enum Orchestrator {
    /// Bounds: every section stops at its count or its time budget, whichever comes first,
    /// and the whole run at the watchdog.
    static let watchdogSeconds = 900.0
    static let latencyWarmup = Smoke.pick(200, 3)
    static let latencyIterations = Smoke.pick(3000, 10)
    static let latencyBudget = 30.0
    static let throughputRepetitions = Smoke.pick(7, 1)
    static let throughputBudget = 120.0

    static func main() async -> Int32 {
        installTerminationHandlers()
        startWatchdog(seconds: watchdogSeconds)
        let report: [String]
        do {
            report = try await run()
        } catch {
            print("dragbroker-bench: FAILED: \(error)")
            print(Cleanup.shared.diagnostics())
            Cleanup.shared.run()
            return 1
        }
        Cleanup.shared.run()
        // The ratios come last, one key=value line each.
        for line in report { print(line) }
        return 0
    }

    struct World {
        let address: String
        let source: Child
        let sourceName: String
        let token: String
        let plainRead: Int32
        let plainPipeSize: Int32
        /// Section (i)'s plain pipes, read here; the source writes them.
        let concurrentReadEnds: [Int32]
        let daemonPID: pid_t
        /// The daemon's state directory, where its transfer log is.
        let stateDirectory: URL
        /// The daemon's policy directory, for drop-ins a section applies with a reload.
        let policyDirectory: URL

        /// Asks the source for another drag or entry (`begin`, `rawbegin`, `copy`) and returns
        /// the token of its `OK <command> <token>` answer; `failure` says what did not happen.
        func sourceToken(_ command: String, _ failure: String) throws -> String {
            let ok = "OK \(command) "
            guard let line = try source.ask(command, timeout: 30, answer: { $0.hasPrefix(ok) }) else {
                throw BenchError("\(failure)\n\(source.diagnostics())")
            }
            return String(line.dropFirst(ok.count))
        }
    }

    /// The private bus, the daemon (beside this binary), and this binary again as the source.
    static func startWorld() throws -> World {
        let executable = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        let binDir = URL(fileURLWithPath: executable).deletingLastPathComponent()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-bench-\(UUID().uuidString)")
        let state = directory.appendingPathComponent("state")
        let policy = directory.appendingPathComponent("policy")
        Cleanup.shared.add(directory: directory)
        try FileManager.default.createDirectory(at: state, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: policy.appendingPathComponent("dragbroker.conf.d"), withIntermediateDirectories: true)
        // The scale section holds 10,000 sessions on one connection: raise the session limits.
        try Scale.policyDropIn.write(to: policy.appendingPathComponent("dragbroker.conf.d/50-bench-scale.conf"), atomically: false, encoding: .utf8)
        // The first drag, loaded from in (c) and (c'), is loaded from again only in (b) and (a),
        // minutes later on a slow machine: past `ConcludeTimeoutSec=`'s 60 s, it ended with the run.
        try Self.deadlineDropIn.write(to: policy.appendingPathComponent("dragbroker.conf.d/50-bench-deadlines.conf"), atomically: false, encoding: .utf8)
        let path = ["PATH": "/usr/local/bin:/usr/bin:/bin"]

        let bus = try Child(name: "dbus-daemon", executable: "/usr/bin/dbus-daemon",
                            arguments: ["--session", "--nofork", "--nopidfile", "--print-address=1"], environment: path)
        Cleanup.shared.add(bus)
        guard let address = bus.stdout.take(timeout: 20, where: { $0.hasPrefix("unix:") }) else {
            throw BenchError("dbus-daemon did not print its address\n\(bus.diagnostics())")
        }

        let daemonPath = binDir.appendingPathComponent("dragbrokerd").path
        guard FileManager.default.isExecutableFile(atPath: daemonPath) else {
            throw BenchError("\(daemonPath) is missing: build it with `swift build -c release --product dragbrokerd`")
        }
        let daemon = try Child(name: "dragbrokerd", executable: daemonPath,
                               arguments: ["--address", address, "--state-directory", state.path, "--policy-directory", policy.path],
                               environment: path, stderrPath: directory.appendingPathComponent("dragbrokerd.log").path)
        Cleanup.shared.add(daemon)
        guard daemon.waitForStderr(containing: "Serving org.dragbroker.Broker1", timeout: 30) else {
            throw BenchError("dragbrokerd did not start\n\(daemon.diagnostics())")
        }

        // The baseline: a plain pipe between the same two processes, enlarged as the daemon
        // enlarges its own. The source opens the write end through /proc.
        let plainPipe = try FileDescriptor.makePipe(nonBlocking: false)
        let fds = [plainPipe.readEnd.rawValue, plainPipe.writeEnd.rawValue]
        try? plainPipe.readEnd.setPipeCapacity(1 << 20)
        let plainPipeSize = (try? plainPipe.readEnd.pipeCapacity()) ?? 0

        let concurrentPipes = try Concurrent.Pipes.make()
        let source = try Child(name: "source", executable: executable,
                               arguments: ["source", "/proc/\(getpid())/fd/\(fds[1])", concurrentPipes.writePaths],
                               environment: path.merging(["DRAGBROKER_BUS_ADDRESS": address]) { $1 }.merging(Smoke.environment) { $1 })
        Cleanup.shared.add(source)
        // Allocating and sealing the 1 GiB memfd takes a moment.
        guard let ready = source.answer(timeout: 120, where: { $0.hasPrefix("READY ") }) else {
            throw BenchError("the source did not start: \(source.stdout.tail(5))\n\(source.diagnostics())\n\(daemon.diagnostics())")
        }
        // From now on only the source holds the write end: if it dies, reads see end of file.
        close(fds[1])
        concurrentPipes.closeWriteEnds()
        let words = ready.split(separator: " ").map(String.init)
        guard words.count == 3 else { throw BenchError("unexpected line from the source: \(ready)") }
        return World(address: address, source: source, sourceName: words[1], token: words[2],
                     plainRead: fds[0], plainPipeSize: plainPipeSize, concurrentReadEnds: concurrentPipes.readEnds, daemonPID: daemon.pid, stateDirectory: state,
                     policyDirectory: policy)
    }

    static func progress(_ line: String) {
        print("# \(line)")
        fflush(nil)
    }

    static func run() async throws -> [String] {
        if Smoke.isOn { progress("smoke run: every section at a few MiB and a few calls; its figures mean nothing") }
        let loadAverageAtStart = loadAverage()
        let world = try startWorld()
        // For work on the registry: only section (e), without the minute the others take.
        if ProcessInfo.processInfo.environment["DRAGBROKER_BENCH_SCALE_ONLY"] != nil {
            try world.source.send("quit")
            _ = world.source.waitForExit(timeout: 10)
            let scale = try await Scale.run(world: world)
            return scale.lines + scale.keys
        }
        let echo = try EchoClient(address: world.address)
        defer { echo.close() }
        let connection = try await BrokerConnection.connect(address: world.address)
        // For work on the pump: only section (i).
        if ProcessInfo.processInfo.environment["DRAGBROKER_BENCH_CONCURRENT_ONLY"] != nil {
            let devNull = try FileDescriptor.open("/dev/null", .writeOnly, options: .closeOnExec)
            defer { try? devNull.close() }
            let concurrent = try await Concurrent.run(world: world, connection: connection, devNull: devNull)
            try world.source.send("quit")
            _ = world.source.waitForExit(timeout: 10)
            return concurrent.lines + concurrent.keys
        }
        let drop = try await connection.presentToken(world.token)
        let items = try await drop.items()
        let expected = Set([BenchTypes.data256M, BenchTypes.data1G, BenchTypes.small, BenchTypes.file, BenchTypes.smallHeld, BenchTypes.fileHeld])
        guard items.count == 1, Set(items[0].typeIdentifiers) == expected else {
            throw BenchError("the destination sees unexpected items: \(items)")
        }
        let sourceName = world.sourceName
        let ping: () async throws -> Void = { try await echo.ping(sourceName) }
        // (h)'s echo: a connection of its own on the destination connection's loop, so that
        // BrokerClient's operation and its echo run on one thread, as the C client's do on its
        // one thread, and no second thread of this process wakes between them.
        guard let connectionLoop = connection.taskExecutor as? LoopTaskExecutor else { throw BenchError("the connection's executor is not its loop") }
        let loopEcho = try await withTaskExecutorPreference(connection.taskExecutor) {
            try EchoClient(address: world.address, sharing: connectionLoop.eventLoop)
        }
        // Never released: its bus may be let go only on that loop's thread.
        _ = Unmanaged.passRetained(loopEcho)
        let pingOnConnectionLoop: () async throws -> Void = { try await loopEcho.ping(sourceName) }

        func handoverOp(_ type: String) -> () async throws -> UInt64 {
            {
                let start = monotonicNanos()
                let fd = try await drop.loadFile(item: 0, typeIdentifier: type)
                let elapsed = monotonicNanos() - start
                try fd.close()
                return elapsed
            }
        }
        // For work on the file load path: (b) and (b') only, without the minutes the rest takes.
        if ProcessInfo.processInfo.environment["DRAGBROKER_BENCH_HANDOVER_ONLY"] != nil {
            guard try await drop.enter(proposing: .copy) == .copy else { throw BenchError("Enter(copy) was not allowed") }
            guard try await drop.performDrop() == .copy else { throw BenchError("PerformDrop did not copy") }
            let handover = try await measurePaired(op: handoverOp(BenchTypes.file), echo: ping)
            let handoverHeld = try await measurePaired(op: handoverOp(BenchTypes.fileHeld), echo: ping)
            try await drop.conclude()
            try world.source.send("quit")
            _ = world.source.waitForExit(timeout: 10)
            return ["dragbroker-bench: load average \(loadAverageAtStart) at start, \(loadAverage()) at end",
                    "(b) file handover", pairLine(handover), "(b') registered as it is", pairLine(handoverHeld),
                    echoRatioKey("file_handover_vs_echo", handover),
                    echoRatioKey("file_handover_held_vs_echo", handoverHeld)]
        }

        // (d) Update round trips: proposals exist only before the drop, so this comes first.
        progress("(d) proposal Update round trip vs echo: \(latencyWarmup) warm-up, up to \(latencyIterations) pairs or \(Int(latencyBudget)) s")
        guard try await drop.enter(proposing: .copy) == .copy else { throw BenchError("Enter(copy) was not allowed") }
        let updateOp: () async throws -> UInt64 = {
            let start = monotonicNanos()
            let allowed = try await drop.update(proposing: .copy)
            let elapsed = monotonicNanos() - start
            guard allowed == .copy else { throw BenchError("Update answered \(allowed)") }
            return elapsed
        }
        let update = try await measurePaired(op: updateOp, echo: ping)
        // (h) The same with the connection's loop as the task's executor, taking turns with a
        // plain C client making the same calls.
        progress("(h) Update round trip on the connection's executor, and from the C client")
        let baseline = try CBaseline(world: world)
        let (updateOnLoop, cUpdate, cUpdateLoop) = try await measureAgainstC(baseline, "update", on: connection, op: updateOp, echo: pingOnConnectionLoop)

        guard try await drop.performDrop() == .copy else { throw BenchError("PerformDrop did not copy") }
        try baseline.drop()
        // The echo again, timed where the reply lands (on the loop's thread): the difference to
        // the echo above is the cost of the hops between the caller's task and the loop.
        let echoOnLoop = try await measurePaired(op: { try await echo.pingOnLoop(sourceName) }, echo: ping)

        // (c) From issuing Load to the first byte in the destination's hands, for a 4 KiB
        // data representation, through `loadStream` (the first chunk it yields).
        progress("(c) Load to first byte (\(BenchSizes.small)-byte data representation, loadStream) vs echo")
        let firstByteOp: () async throws -> UInt64 = { try await timeToFirstByte(from: drop) }
        let firstByte = try await measurePaired(op: firstByteOp, echo: ping)
        // (c''') The same bytes registered as they are: no handler, answered on the source's loop.
        let firstByteHeld = try await measurePaired(op: { try await timeToFirstByte(from: drop, of: BenchTypes.smallHeld) }, echo: ping)
        progress("(h) Load to first byte on the connection's executor, and from the C client")
        let (firstByteOnLoop, cFirstByte, cFirstByteLoop) = try await measureAgainstC(baseline, "firstbyte", on: connection, op: firstByteOp, echo: pingOnConnectionLoop)
        // Gone before the drags in a row are counted, which it would share the machine with.
        try baseline.finish()

        // (c') The same under FailClosed=yes: the source is asked only once the load's start
        // record committed, so the commit is on the path instead of beside it.
        progress("(c') Load to first byte with FailClosed=yes vs echo")
        let failClosedDropIn = world.policyDirectory.appendingPathComponent("dragbroker.conf.d/60-bench-fail-closed.conf")
        try "[Audit]\nFailClosed=yes\n".write(to: failClosedDropIn, atomically: false, encoding: .utf8)
        try await connection.reloadPolicy()
        let failClosedFirstByte = try await measurePaired(op: firstByteOp, echo: ping)
        // Whole drags one after another (begin, present, enter, drop, load, conclude): what the
        // log's commits cost a user who drags, with FailClosed=yes and then without.
        progress("(c'') \(dragRateBursts) bursts of \(dragRateCount) whole drags in a row, FailClosed=yes then =no")
        let failClosedBursts = try await dragRates(world: world, connection: connection)
        try FileManager.default.removeItem(at: failClosedDropIn)
        try await connection.reloadPolicy()
        let defaultBursts = try await dragRates(world: world, connection: connection)
        let (failClosedRate, defaultRate) = (median(failClosedBursts), median(defaultBursts))
        let rateLines = ["(c'') whole drags in a row (begin → present → enter → drop → 4 KiB load → conclude), "
                            + "\(dragRateBursts) bursts of \(dragRateCount) each; the median burst's rate",
                         "  FailClosed=yes: \(format(failClosedRate)) drags/s (\(format(failClosedBursts, separator: ", "))); "
                            + "FailClosed=no: \(format(defaultRate)) drags/s (\(format(defaultBursts, separator: ", ")))",
                         "fail_closed_drags_per_second=\(format(failClosedRate))",
                         "default_drags_per_second=\(format(defaultRate))"]
        // (g) Paste: the same item copied instead of dragged. As for the drop, from Load to the
        // first byte, in a paste; and from the Paste call itself, each iteration a paste of its
        // own (concluded, untimed, before the next), to show what the user's act adds.
        progress("(g) Paste, then Load to first byte, vs echo; and Paste → first byte, a paste each time")
        let entry = try await connection.presentToken(try world.sourceToken("copy", "the source could not copy"))
        let paste = try await entry.paste()
        let pasteFirstByte = try await measurePaired(op: { try await timeToFirstByte(from: paste) }, echo: ping)
        try await paste.conclude()
        let pasteEach = try await measurePaired(op: {
            let start = monotonicNanos()
            let paste = try await entry.paste()
            let first = try await timeToFirstByte(from: paste, since: start)
            try await paste.conclude()
            return first
        }, echo: ping)
        let pasteLines = [
            "(g) Paste: Load → first byte in a paste, as (c) in a drop", pairLine(pasteFirstByte),
            "    Paste → first byte, a paste each time (its Paste round trip included)", pairLine(pasteEach),
            echoRatioKey("paste_first_byte_vs_echo_p50", pasteFirstByte),
            echoRatioKey("paste_call_first_byte_vs_echo_p50", pasteEach),
        ]

        let heldFirstByteLines = [
            "(c''') the same 4 KiB registered as they are (registerDataRepresentation(data:)): no handler runs, the source writes them on its loop",
            pairLine(firstByteHeld),
            echoRatioKey("first_byte_held_vs_echo_p50", firstByteHeld)]

        // For work on the load path: (d) and (c) only, without the minutes the rest takes.
        if ProcessInfo.processInfo.environment["DRAGBROKER_BENCH_FIRST_BYTE_ONLY"] != nil {
            try await drop.conclude()
            try world.source.send("quit")
            _ = world.source.waitForExit(timeout: 10)
            return ["dragbroker-bench: load average \(loadAverageAtStart) at start, \(loadAverage()) at end",
                    "(c) Load → first byte", pairLine(firstByte)] + heldFirstByteLines + [
                    "(c') the same with FailClosed=yes", pairLine(failClosedFirstByte),
                    "(d) Update", pairLine(update)] + rateLines + pasteLines
                    + { $0.lines + $0.keys }(baselineLines(update: (update, updateOnLoop, cUpdate, cUpdateLoop), firstByte: (firstByte, firstByteOnLoop, cFirstByte, cFirstByteLoop), handover: nil,
                                                           echoOnLoop: echoOnLoop)) + [
                    echoRatioKey("first_byte_vs_echo_p50", firstByte),
                    echoRatioKey("fail_closed_first_byte_vs_echo_p50", failClosedFirstByte),
                    echoRatioKey("update_vs_echo_p50", update)]
        }

        // (b) File handover: the source's handler returns a dup of a sealed 1 GiB memfd made
        // before timing; loadFile returns the descriptor the daemon checked and reopened.
        progress("(b) file handover of a 1 GiB sealed memfd (loadFile) vs echo")
        let check = try await drop.loadFile(item: 0, typeIdentifier: BenchTypes.file)
        var info = stat()
        fstat(check.rawValue, &info)
        let seals = try check.seals()
        try check.close()
        guard info.st_size == BenchSizes.file, seals?.contains(.write) == true else {
            throw BenchError("the file handed over has \(info.st_size) bytes and seals \(seals.map { "\($0.rawValue)" } ?? "none")")
        }
        let handover = try await measurePaired(op: handoverOp(BenchTypes.file), echo: ping)
        // (b') The same memfd registered as it is: no handler, answered on the source's loop.
        let handoverHeld = try await measurePaired(op: handoverOp(BenchTypes.fileHeld), echo: ping)
        progress("(h) file handover on the connection's executor, and from the C client")
        let handoverBaseline = try CBaseline(world: world)
        try handoverBaseline.drop()
        let (handoverOnLoop, cHandover, cHandoverLoop) = try await measureAgainstC(handoverBaseline, "handover", on: connection,
                                                                     op: handoverOp(BenchTypes.file), echo: pingOnConnectionLoop)
        try handoverBaseline.finish()

        // (a) Throughput, last: broker and plain pipe runs interleaved (ABBA order) so drift
        // and noise fall on both alike.
        progress("(a) data throughput: 256 MiB and 1 GiB, broker vs plain pipe, \(throughputRepetitions) repetitions each")
        let devNull = try FileDescriptor.open("/dev/null", .writeOnly, options: .closeOnExec)
        defer { try? devNull.close() }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BenchSizes.chunk, alignment: 4096)
        defer { buffer.deallocate() }
        let reader = PlainReader(fd: world.plainRead, buffer: buffer)

        func broker(_ size: Int) async throws -> Double {
            let type = size == BenchSizes.gib1 ? BenchTypes.data1G : BenchTypes.data256M
            let start = monotonicNanos()
            let received = try await drop.load(item: 0, typeIdentifier: type, into: devNull)
            let elapsed = monotonicNanos() - start
            guard received == UInt64(size) else { throw BenchError("the broker delivered \(received) of \(size) bytes") }
            return mibPerSecond(size, elapsed)
        }
        func plain(_ size: Int, _ hop: Bool, _ copying: Bool) async throws -> Double {
            let start = monotonicNanos()
            try world.source.send("\(hop ? "plainhop" : "plain") \(size)")
            let received = copying ? try await reader.readCopying(size, to: devNull.rawValue) : try await reader.read(size)
            let elapsed = monotonicNanos() - start
            guard received == size else { throw BenchError("the plain pipe delivered \(received) of \(size) bytes") }
            guard world.source.answer(timeout: 30, where: { $0.hasPrefix("OK plain") }) != nil else {
                throw BenchError("the source failed to write the plain pipe\n\(world.source.diagnostics())")
            }
            return mibPerSecond(size, elapsed)
        }

        // Warm-up: one of each, discarded.
        _ = try await plain(BenchSizes.mib256, false, false)
        _ = try await broker(BenchSizes.mib256)
        var runs: [Int: (plain: [Double], broker: [Double])] = [:]
        let deadline = monotonicNanos() + UInt64(throughputBudget * 1e9)
        var repetitions = 0
        while repetitions < throughputRepetitions && (repetitions == 0 || monotonicNanos() < deadline) {
            for size in [BenchSizes.mib256, BenchSizes.gib1] {
                if repetitions % 2 == 0 {
                    runs[size, default: ([], [])].plain.append(try await plain(size, false, false))
                    runs[size, default: ([], [])].broker.append(try await broker(size))
                } else {
                    runs[size, default: ([], [])].broker.append(try await broker(size))
                    runs[size, default: ([], [])].plain.append(try await plain(size, false, false))
                }
            }
            repetitions += 1
        }

        let concurrent = try await Concurrent.run(world: world, connection: connection, devNull: devNull)

        var experiments: [String] = []
        if ProcessInfo.processInfo.environment["DRAGBROKER_BENCH_EXPERIMENTS"] != nil {
            progress("experiments (DRAGBROKER_BENCH_EXPERIMENTS is set)")
            experiments = try await Experiments.run(
                world: world, buffer: buffer, devNull: devNull.rawValue, plain: plain, broker: broker,
                libraryHandover: handoverOp(BenchTypes.file), libraryFirstByte: firstByteOp,
                libraryUpdateSession: { token in
                    let session = try await connection.presentToken(token)
                    guard try await session.enter(proposing: .copy) == .copy else { throw BenchError("Enter(copy) was not allowed") }
                    return {
                        let start = monotonicNanos()
                        _ = try await session.update(proposing: .copy)
                        return monotonicNanos() - start
                    }
                },
                timedEcho: {
                    let start = monotonicNanos()
                    try await ping()
                    return monotonicNanos() - start
                })
        }
        // (f) Update on a second drag of the source's, quiet and then under a flood of refused
        // calls from another app; after the others, so the flood's aftermath touches none of them.
        progress("(f) Update p99 quiet and under a flood of refused calls from \(Flood.connections) connections of another app, "
                 + "\(Flood.windows) windows of \(format(Flood.windowSeconds)) s of each in turn")
        let victim = try await connection.presentToken(try world.sourceToken("begin", "the source did not begin a second drag"))
        guard try await victim.enter(proposing: .copy) == .copy else { throw BenchError("Enter(copy) was not allowed") }
        let flood = try await Flood.run(world: world) {
            let start = monotonicNanos()
            let allowed = try await victim.update(proposing: .copy)
            guard allowed == .copy else { throw BenchError("Update answered \(allowed)") }
            return monotonicNanos() - start
        }

        try await drop.conclude()
        try world.source.send("quit")
        _ = world.source.waitForExit(timeout: 10)

        // (e) Scale, last: 10,000 live sessions from a source process of its own.
        let scale = try await Scale.run(world: world)

        // The report: informative lines, then one key=value line per ratio.
        var report: [String] = []
        report.append("dragbroker-bench: \(ProcessInfo.processInfo.activeProcessorCount) cores, load average \(loadAverageAtStart) at start, "
                      + "\(loadAverage()) at end")
        report.append("(a) data throughput, source → dragbrokerd splice proxy → destination, against a plain pipe between")
        report.append("    the same two processes (pipe size \(world.plainPipeSize) bytes, as the daemon sets its own). The source")
        report.append("    writes 1 MiB chunks from one preallocated buffer (stream representation, DataWriter.write / write(2)),")
        report.append("    the destination reads 1 MiB chunks and discards them (load(into: /dev/null) / read(2) into one buffer).")
        report.append("    \(repetitions) repetitions, broker and plain alternating (ABBA), after one warm-up run of each;")
        report.append("    the ratio is the median of each repetition's broker/plain")
        var ratios: [Int: Double] = [:]
        for (label, size) in [("256 MiB", BenchSizes.mib256), ("1 GiB", BenchSizes.gib1)] {
            let (plainRates, brokerRates) = runs[size] ?? ([], [])
            let ratio = median(zip(brokerRates, plainRates).map { $0 / $1 })
            ratios[size] = ratio
            report.append("  \(label): plain pipe median \(format(median(plainRates))) MiB/s, broker median \(format(median(brokerRates))) MiB/s, "
                          + "broker/plain \(format(ratio, 3))")
            report.append("    plain runs (MiB/s):  \(plainRates.map { format($0) }.joined(separator: " "))")
            report.append("    broker runs (MiB/s): \(brokerRates.map { format($0) }.joined(separator: " "))")
        }
        report.append("(b) file handover, 1 GiB sealed memfd made before timing, Load → descriptor (loadFile)")
        report.append(pairLine(handover))
        report.append("(b') the same memfd registered as it is (registerFileRepresentation(file:)): no handler runs, the source answers on its loop")
        report.append(pairLine(handoverHeld))
        report.append("(c) Load (after PerformDrop) → first byte read, 4 KiB data representation, first chunk of loadStream")
        report.append(pairLine(firstByte))
        report.append(heldFirstByteLines[0])
        report.append(heldFirstByteLines[1])
        report.append("(c') the same with FailClosed=yes (the source is asked once the load's start record committed)")
        report.append(pairLine(failClosedFirstByte))
        report += rateLines.prefix(2)
        report += pasteLines.prefix(4)
        report.append("(d) proposal Update round trip (after Enter)")
        report.append(pairLine(update))
        report.append("  echo: org.freedesktop.DBus.Peer.Ping to the source's unique name, answered by its sd-bus, through an actor")
        report.append("  on a BusKit event loop as the library calls; one echo after each operation, each after a \(pauseMicroseconds) µs pause;")
        report.append("  \(latencyWarmup) pairs of warm-up discarded; percentiles from HdrHistogram")
        let cLines = baselineLines(update: (update, updateOnLoop, cUpdate, cUpdateLoop), firstByte: (firstByte, firstByteOnLoop, cFirstByte, cFirstByteLoop),
                                   handover: (handover, handoverOnLoop, cHandover, cHandoverLoop),
                                   echoOnLoop: echoOnLoop)
        report += cLines.lines
        report += concurrent.lines
        report += flood.lines
        report += scale.lines
        report += experiments
        report.append("pipe_ratio_256m=\(format(ratios[BenchSizes.mib256] ?? .nan, 3))")
        report.append("pipe_ratio=\(format(ratios[BenchSizes.gib1] ?? .nan, 3))")
        report.append(echoRatioKey("file_handover_vs_echo", handover))
        report.append(echoRatioKey("file_handover_held_vs_echo", handoverHeld))
        report.append(echoRatioKey("first_byte_vs_echo_p50", firstByte))
        report.append(heldFirstByteLines[2])
        report.append(echoRatioKey("fail_closed_first_byte_vs_echo_p50", failClosedFirstByte))
        report += rateLines.suffix(2)
        report += pasteLines.suffix(2)
        report.append(echoRatioKey("update_vs_echo_p50", update))
        report += cLines.keys
        report += concurrent.keys
        report.append(flood.key)
        report += scale.keys
        return report
    }

    /// (h): the C client's figures beside the library's, and the library's p50 over C's.
    /// The library's figures for one kind of call: from an arbitrary task, and from a task that
    /// prefers the connection's loop as its executor.
    typealias LibraryAndC = (fromTask: Paired, onLoop: Paired, c: CBaseline.Figures, cLoop: CBaseline.Figures)

    static func baselineLines(update: LibraryAndC, firstByte: LibraryAndC, handover: LibraryAndC?,
                              echoOnLoop: Paired) -> (lines: [String], keys: [String]) {
        var lines = ["(h) the same calls from a plain C client on sd-bus (blocking sd_bus_call, no threads); ratio = BrokerClient",
                     "    p50 / C p50. BrokerClient is measured twice: inside withTaskExecutorPreference(connection.taskExecutor),",
                     "    as the C client calls from the thread that reads the replies, taking turns with the C client in blocks of",
                     "    \(cBlock) pairs, each pausing by sleeping that thread and echoing from a connection on that same loop, as",
                     "    the C client pauses and echoes on its one thread (client_*_vs_c); and from an",
                     "    arbitrary task, two thread hops per call, as in (b)-(d) (client_*_from_task_vs_c). The C client also makes",
                     "    each call as an asynchronous C client does, sd_bus_call_method_async on an sd-event loop attached to its",
                     "    bus, waiting in sd_event_run (the first byte through an io source on the pipe), in blocks of its own",
                     "    taking the same turns (client_*_vs_c_loop = BrokerClient on its executor p50 / that p50). Over those",
                     "    blocks, the calling thread's CPU time (getrusage RUSAGE_THREAD, user and system) and involuntary",
                     "    context switches per pair of operation and echo (client_*_cpu_vs_c_loop = BrokerClient's CPU / C's on its loop)",
                     "  echo timed on the loop's thread (no hop to or from the caller's task) against the echo from a task:",
                     pairLine(echoOnLoop)]
        var keys: [String] = []
        for (name, key, figures) in [("Update", "update", update), ("Load → first byte", "first_byte", firstByte)]
            + (handover.map { [("file handover", "handover", $0)] } ?? []) {
            lines.append("  \(name), C:\(figures.c.line)")
            lines.append("    C on its sd-event loop:\(figures.cLoop.line)")
            lines.append("    on the connection's executor:\(pairLine(figures.onLoop))")
            lines.append("    the calling thread per pair: CPU \(format(figures.onLoop.cpuPerPair)) µs, C \(format(figures.c.cpuPerPair)) µs, "
                         + "C on its loop \(format(figures.cLoop.cpuPerPair)) µs; taken off the CPU while runnable "
                         + "\(format(figures.onLoop.switchesPerPair, 2)) times, C \(format(figures.c.switchesPerPair, 2)), "
                         + "C on its loop \(format(figures.cLoop.switchesPerPair, 2))")
            lines.append("    BrokerClient/C p50: on the connection's executor \(format(CBaseline.ratio(figures.onLoop, figures.c), 2)), "
                         + "from a task \(format(CBaseline.ratio(figures.fromTask, figures.c), 2)); "
                         + "C on its loop / blocking C \(format(figures.cLoop.p50 / figures.c.p50, 2))")
            keys.append("client_\(key)_vs_c=\(format(CBaseline.ratio(figures.onLoop, figures.c), 2))")
            keys.append("client_\(key)_from_task_vs_c=\(format(CBaseline.ratio(figures.fromTask, figures.c), 2))")
            keys.append("client_\(key)_vs_c_loop=\(format(CBaseline.ratio(figures.onLoop, figures.cLoop), 2))")
            keys.append("client_\(key)_cpu_vs_c_loop=\(format(figures.onLoop.cpuPerPair / figures.cLoop.cpuPerPair, 2))")
        }
        return (lines, keys)
    }

    /// Drags in a burst, and bursts for each setting. A burst lasts under a second, so one slow
    /// spell on the machine (another process, a commit waiting on the disk) moves its rate by
    /// half; the median of several moves less.
    static let dragRateCount = Smoke.pick(100, 3)
    static let dragRateBursts = Smoke.pick(5, 2)

    /// Drags per second in each burst, each drag whole and one at a time, from the source
    /// process's item.
    static func dragRates(world: World, connection: BrokerConnection) async throws -> [Double] {
        var rates: [Double] = []
        for _ in 0..<dragRateBursts {
            rates.append(try await dragRate(world: world, connection: connection))
        }
        return rates
    }

    private static func dragRate(world: World, connection: BrokerConnection) async throws -> Double {
        let start = monotonicNanos()
        for _ in 0..<dragRateCount {
            let drop = try await connection.presentToken(try world.sourceToken("begin", "the source did not begin a drag"))
            guard try await drop.enter(proposing: .copy) == .copy, try await drop.performDrop() == .copy else {
                throw BenchError("the drag was not dropped as a copy")
            }
            var total = 0
            for try await chunk in drop.loadStream(item: 0, typeIdentifier: BenchTypes.small) { total += chunk.count }
            guard total == BenchSizes.small else { throw BenchError("the small load delivered \(total) bytes") }
            try await drop.conclude()
        }
        return Double(dragRateCount) / (Double(monotonicNanos() - start) / 1e9)
    }

    static func loadAverage() -> String {
        ((try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8)) ?? "?").split(separator: " ").prefix(3).joined(separator: " ")
    }

    struct Paired {
        var op: Histogram<UInt64>
        var echo: Histogram<UInt64>
        var count: Int
        /// The measuring thread's CPU time and involuntary context switches over the pairs,
        /// where counted (`measureAgainstC`, whose pairs all run on one thread).
        var cpuMicroseconds: UInt64 = 0
        var involuntarySwitches = 0

        var cpuPerPair: Double { Double(cpuMicroseconds) / Double(max(count, 1)) }
        var switchesPerPair: Double { Double(involuntarySwitches) / Double(max(count, 1)) }
    }

    /// Alternates one operation and one echo, so both see the same machine; the first
    /// `latencyWarmup` pairs are discarded. `op` returns its own duration in nanoseconds.
    /// Each measurement starts after `settle()`, so the work a load leaves behind once it has
    /// returned (the daemon's transfer log write, the source's signal handling) is charged
    /// neither to the next echo nor to the next operation.
    /// Nanoseconds from `start` (by default, now) to the first byte of the small
    /// representation loaded from `session` through `loadStream`, which is read to its end.
    static func timeToFirstByte(from session: DropSession, of type: String = BenchTypes.small,
                                since start: UInt64 = monotonicNanos()) async throws -> UInt64 {
        var first: UInt64 = 0
        var total = 0
        for try await chunk in session.loadStream(item: 0, typeIdentifier: type) {
            if first == 0 && !chunk.isEmpty { first = monotonicNanos() - start }
            total += chunk.count
        }
        guard total == BenchSizes.small, first > 0 else { throw BenchError("the small load delivered \(total) bytes") }
        return first
    }

    /// Pairs per block when BrokerClient and the C client take turns.
    static let cBlock = Smoke.pick(100, 5)

    /// BrokerClient with `connection`'s loop as the task's executor, as the C client calls from
    /// the thread that reads its replies, against the C client's `kind` of operation, blocking
    /// and on its event loop (`kind-loop`): in alternating blocks of `cBlock` pairs, so that
    /// drift in the machine falls on all three alike.
    /// Each of BrokerClient's pairs pauses as the C client's does, by sleeping the thread that
    /// will make the call (the loop's), so no other thread of this process wakes up just before
    /// it: a `Task.sleep` would wake the concurrency runtime's timer thread and a pool thread on
    /// this 2-core machine at the moment the call starts.
    static func measureAgainstC(_ baseline: CBaseline, _ kind: String, on connection: BrokerConnection,
                                op: () async throws -> UInt64, echo: () async throws -> Void)
        async throws -> (library: Paired, c: CBaseline.Figures, cLoop: CBaseline.Figures) {
        var library = Paired(op: latencyHistogram(), echo: latencyHistogram(), count: 0)
        try await withTaskExecutorPreference(connection.taskExecutor) {
            try await warmUp(op: op, echo: echo)
        }
        let kinds = [kind, "\(kind)-loop"]
        for kind in kinds { try baseline.run(kind, pairs: latencyWarmup, recorded: false) }
        // All take turns within the budget each has alone.
        let deadline = monotonicNanos() + UInt64(Double(1 + kinds.count) * latencyBudget * 1e9)
        while library.count < latencyIterations && monotonicNanos() < deadline {
            let pairs = min(cBlock, latencyIterations - library.count)
            try await withTaskExecutorPreference(connection.taskExecutor) {
                // The whole block runs on the loop's thread, so the thread's usage is the block's.
                guard (connection.taskExecutor as? LoopTaskExecutor)?.isCurrent == true else {
                    throw BenchError("the block does not run on the connection's loop")
                }
                let before = Kernel.currentThreadUsage()
                try await measurePairs(pairs, into: &library, op: op, echo: echo, settle: settleOnThisThread)
                let after = Kernel.currentThreadUsage()
                library.cpuMicroseconds += after.cpuMicroseconds - before.cpuMicroseconds
                library.involuntarySwitches += after.involuntarySwitches - before.involuntarySwitches
            }
            // Off the loop: the C client's block takes a while, and the connection keeps reading.
            for kind in kinds { try baseline.run(kind, pairs: pairs, recorded: true) }
        }
        return (library, try baseline.report(kinds[0]), try baseline.report(kinds[1]))
    }

    static func measurePaired(op: () async throws -> UInt64, echo: () async throws -> Void) async throws -> Paired {
        var result = Paired(op: latencyHistogram(), echo: latencyHistogram(), count: 0)
        try await warmUp(op: op, echo: echo)
        let deadline = monotonicNanos() + UInt64(latencyBudget * 1e9)
        while result.count < latencyIterations && monotonicNanos() < deadline {
            try await measurePairs(1, into: &result, op: op, echo: echo, settle: settle)
        }
        return result
    }

    /// `latencyWarmup` operations, each followed by an echo, recorded nowhere.
    static func warmUp(op: () async throws -> UInt64, echo: () async throws -> Void) async throws {
        for _ in 0..<latencyWarmup {
            _ = try await op()
            try await echo()
        }
    }

    /// `count` pairs, each a pause, the operation, a pause and the echo.
    static func measurePairs(_ count: Int, into result: inout Paired, op: () async throws -> UInt64,
                             echo: () async throws -> Void, settle: () async throws -> Void) async throws {
        for _ in 0..<count {
            try await settle()
            result.op.record(try await op())
            try await settle()
            let start = monotonicNanos()
            try await echo()
            result.echo.record(monotonicNanos() - start)
            result.count += 1
        }
    }

    /// Session deadlines far beyond any run, so that a slow run measures rather than expires.
    static let deadlineDropIn = """
        # dragbroker-bench: its drags live as long as a run.
        [Limits]
        DragTimeoutSec=3600
        ConcludeTimeoutSec=3600

        """

    /// The pause before each operation and each echo: 1 ms, so that every call starts as an
    /// app's does, from a thread that slept and caches that went cold meanwhile.
    /// `DRAGBROKER_BENCH_PAUSE_US` changes it (0: none, the calls back to back, caches warm),
    /// for the C client too.
    static let pauseMicroseconds: UInt64 = ProcessInfo.processInfo.environment["DRAGBROKER_BENCH_PAUSE_US"].flatMap { UInt64($0) } ?? 1000
    static let settleNanoseconds = pauseMicroseconds * 1000

    static func settle() async throws {
        if settleNanoseconds > 0 { try await Task.sleep(nanoseconds: settleNanoseconds) }
    }

    static func settleOnThisThread() {
        if settleNanoseconds == 0 { return }
        var pause = timespec(tv_sec: Int(settleNanoseconds / 1_000_000_000), tv_nsec: Int(settleNanoseconds % 1_000_000_000))
        var left = timespec()
        while nanosleep(&pause, &left) < 0 && errno == EINTR { pause = left }
    }

    /// A report key: the operation's p50 over its echo's.
    static func echoRatioKey(_ key: String, _ pair: Paired) -> String {
        "\(key)=\(format(pair.op.micros(50) / pair.echo.micros(50), 2))"
    }

    static func pairLine(_ pair: Paired) -> String {
        "  n=\(pair.count): p50 \(format(pair.op.micros(50))) µs, p99 \(format(pair.op.micros(99))) µs; "
            + "echo p50 \(format(pair.echo.micros(50))) µs, p99 \(format(pair.echo.micros(99))) µs; "
            + "ratio p50 \(format(pair.op.micros(50) / pair.echo.micros(50), 2)), p99 \(format(pair.op.micros(99) / pair.echo.micros(99), 2))"
    }

    static func mibPerSecond(_ bytes: Int, _ nanos: UInt64) -> Double {
        Double(bytes) / 1_048_576 / (Double(nanos) / 1e9)
    }

    static func median(_ values: [Double]) -> Double {
        guard !values.isEmpty else { return .nan }
        let sorted = values.sorted()
        let middle = sorted.count / 2
        return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
    }
}

/// The baseline reader: exactly `size` bytes from the plain pipe in 1 MiB reads into one
/// preallocated buffer, discarded, on a dispatch thread as the library reads its pipes.
final class PlainReader: @unchecked Sendable {
    let fd: Int32
    let buffer: UnsafeMutableRawBufferPointer

    init(fd: Int32, buffer: UnsafeMutableRawBufferPointer) {
        self.fd = fd
        self.buffer = buffer
    }

    func read(_ size: Int) async throws -> Int {
        try await offThread { [self] in try Self.read(fd, size, into: buffer) }
    }

    /// Up to `size` bytes from `fd`, read(2) after read(2) into `buffer`, discarded; the count.
    static func read(_ fd: Int32, _ size: Int, into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        var total = 0
        while total < size {
            let n = Glibc.read(fd, buffer.baseAddress, min(buffer.count, size - total))
            if n > 0 { total += n; continue }
            if n == 0 { return total }
            if errno == EINTR { continue }
            throw BenchError("read from the plain pipe failed: \(String(cString: strerror(errno)))")
        }
        return total
    }

    /// Experiment: reads as DescriptorIO.readChunks does, a new Data per chunk, written out.
    func readCopying(_ size: Int, to output: Int32) async throws -> Int {
        try await offThread { [self] in
            var total = 0
            var buffer = [UInt8](repeating: 0, count: 1 << 20)
            while total < size {
                let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, min($0.count, size - total)) }
                if n > 0 {
                    total += n
                    let data = Data(buffer[0..<n])
                    _ = data.withUnsafeBytes { Glibc.write(output, $0.baseAddress, $0.count) }
                    continue
                }
                if n == 0 { return total }
                if errno == EINTR { continue }
                throw BenchError("read from the plain pipe failed: \(String(cString: strerror(errno)))")
            }
            return total
        }
    }
}

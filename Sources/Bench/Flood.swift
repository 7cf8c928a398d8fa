import BrokerProtocol
import BusKit
import Foundation
import Glibc
import Histogram
import TransferLog

/// (f) What a flood of refused calls from one app costs another app: the victim's `Update`
/// p99 while 64 connections of one other app each make refused calls as fast as they are
/// answered, reconnecting every 1,000 calls, against its p99 without them. Quiet and flooded
/// windows take turns, five of each, so that both percentiles come from the same stretch of
/// the machine's time: measured one after the other, whatever else the machine did in either
/// moved the ratio more than the flood did.
enum Flood {
    static let connections = Smoke.pick(64, 4)
    static let callsPerConnection = 1000
    /// Windows of each kind, and how long each lasts: ten seconds of flood in all.
    static let windows = Smoke.pick(5, 1)
    static let windowSeconds = Smoke.pick(2.0, 0.5)
    static var seconds: Double { Double(windows) * windowSeconds }

    struct Result {
        var lines: [String]
        var key: String
    }

    /// `update` times one Update round trip of the victim (the orchestrator's drop), in ns.
    static func run(world: Orchestrator.World, update: () async throws -> UInt64) async throws -> Result {
        // The flooder is another app: a copy of this binary at a path of its own.
        let executable = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        let copy = world.stateDirectory.deletingLastPathComponent().appendingPathComponent("flooder/dragbroker-bench-flooder")
        try FileManager.default.createDirectory(at: copy.deletingLastPathComponent(), withIntermediateDirectories: true)
        try? FileManager.default.removeItem(at: copy)
        try FileManager.default.copyItem(atPath: executable, toPath: copy.path)
        let refusalsBefore = try refusalRows(world)
        let flooder = try Child(name: "flooder", executable: copy.path,
                                arguments: ["flood", world.address, "\(connections)"],
                                environment: ["PATH": "/usr/bin:/bin"])
        Cleanup.shared.add(flooder)
        func command(_ verb: String, answer: String) throws {
            guard try flooder.ask(verb, timeout: 60, answer: { $0 == answer }) != nil else {
                throw BenchError("the flooder did not answer `\(verb)`: \(flooder.stdout.tail(3))\n\(flooder.diagnostics())")
            }
        }
        guard flooder.answer(timeout: 30, where: { $0 == "READY" }) != nil else {
            throw BenchError("the flooder did not start\n\(flooder.diagnostics())")
        }
        func measure(into histogram: inout Histogram<UInt64>) async throws {
            let end = monotonicNanos() + UInt64(windowSeconds * 1e9)
            while monotonicNanos() < end {
                try await Orchestrator.settle()
                histogram.record(try await update())
            }
        }
        var quiet = latencyHistogram()
        var flooded = latencyHistogram()
        for _ in 0..<windows {
            try await measure(into: &quiet)
            try command("flood", answer: "FLOODING")
            try await measure(into: &flooded)
            // Every refused call answered: the next quiet window has none left in flight.
            try command("pause", answer: "PAUSED")
        }
        guard let done = try flooder.ask("quit", timeout: 60, answer: { $0.hasPrefix("DONE ") }) else {
            throw BenchError("the flooder did not finish\n\(flooder.diagnostics())")
        }
        let counts = done.split(separator: " ").dropFirst().compactMap { Int($0) }
        guard counts.count == 3 else { throw BenchError("unexpected line from the flooder: \(done)") }
        let (calls, refused, reconnects) = (counts[0], counts[1], counts[2])
        guard refused == calls else { throw BenchError("the flooder's calls were not all refused: \(done)") }
        // Let the daemon's writer settle, then count what the flood made the log keep.
        try await Task.sleep(nanoseconds: 1_000_000_000)
        let written = try refusalRows(world) - refusalsBefore
        let ratio = flooded.micros(99) / quiet.micros(99)
        return Result(lines: [
            "(f) victim's Update under a flood of refused calls: \(connections) connections of one app, each calling",
            "    PresentToken with a bad token as fast as it is answered and reconnecting every \(callsPerConnection) calls,",
            "    in \(windows) window\(windows == 1 ? "" : "s") of \(format(windowSeconds)) s, each after a quiet window as long (the connections idle):",
            "    \(calls) refused calls (\(format(Double(calls) / seconds))/s), \(reconnects) reconnections; \(written) refusal rows written to the log",
            "  quiet (n=\(quiet.totalCount)): p50 \(format(quiet.micros(50))) µs, p99 \(format(quiet.micros(99))) µs",
            "  under the flood (n=\(flooded.totalCount)): p50 \(format(flooded.micros(50))) µs, p99 \(format(flooded.micros(99))) µs",
        ], key: "victim_update_p99_under_flood_vs_quiet=\(format(ratio, 2))")
    }

    private static func refusalRows(_ world: Orchestrator.World) throws -> Int {
        let log = try TransferLog.openReadOnly(path: TransferLog.path(inStateDirectory: world.stateDirectory.path))
        return try log.refusals(limit: Int.max).count
    }
}

/// The `flood ADDRESS CONNECTIONS` role: that many bus connections on one event loop, told
/// on standard input when to flood. `flood`: each connection keeps one refused call in flight
/// at all times, and is replaced by a new connection every `Flood.callsPerConnection` calls;
/// answers `FLOODING`. `pause`: no new calls; answers `PAUSED` once every call in flight has
/// its answer. `quit`: answers `DONE calls refused reconnects` and exits.
final class FloodRole: @unchecked Sendable {
    private let loop: EventLoop
    private let address: String
    /// Touched on the loop thread only.
    private var buses: [Bus?]
    private var pending: [Slot?]
    private var callsOnBus: [Int]
    private var inFlight = 0
    private var calls = 0
    private var refused = 0
    private var reconnects = 0
    private var paused = true
    private var failure: String?

    private init(address: String, connections: Int) throws {
        loop = try EventLoop()
        self.address = address
        buses = Array(repeating: nil, count: connections)
        pending = Array(repeating: nil, count: connections)
        callsOnBus = Array(repeating: 0, count: connections)
    }

    static func run(address: String, connections: Int) -> Never {
        do {
            let role = try FloodRole(address: address, connections: connections)
            role.loop.start(name: "flood")
            say("READY")
            while let line = readLine() {
                switch line {
                case "flood":
                    role.onLoop {
                        role.paused = false
                        for index in 0..<connections { role.fire(index) }
                    }
                    say("FLOODING")
                case "pause":
                    role.onLoop { role.paused = true }
                    while role.onLoop({ role.inFlight > 0 && role.failure == nil }) { usleep(1000) }
                    say(role.onLoop { role.failure.map { "ERR \($0)" } ?? "PAUSED" })
                case "quit":
                    say(role.onLoop {
                        role.paused = true
                        return role.failure.map { "ERR \($0)" } ?? "DONE \(role.calls) \(role.refused) \(role.reconnects)"
                    })
                    exit(0)
                default:
                    say("ERR unknown command \(line)")
                }
            }
            exit(0)
        } catch {
            say("ERR \(error)")
            exit(1)
        }
    }

    /// Runs `body` on the loop's thread, where the role's state lives, and waits for it.
    private func onLoop<T>(_ body: @escaping () -> T) -> T {
        let finished = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var result: T?
        nonisolated(unsafe) let body = body
        loop.execute {
            result = body()
            finished.signal()
        }
        finished.wait()
        return result!
    }

    /// One line to the orchestrator, at once (stdout is a pipe).
    private static func say(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }

    /// One refused call on connection `index`, and on its answer the next.
    private func fire(_ index: Int) {
        guard !paused, failure == nil else { return }
        do {
            if buses[index] == nil || callsOnBus[index] >= Flood.callsPerConnection {
                if buses[index] != nil { reconnects += 1 }
                pending[index] = nil
                buses[index] = try Bus.connect(address: address, loop: loop, description: "flood")
                callsOnBus[index] = 0
            }
            let bus = buses[index]!
            let m = try bus.newMethodCall(destination: BrokerNames.busName, path: BrokerNames.managerPath,
                                          interface: BrokerNames.managerInterface, member: "PresentToken")
            try m.append("00")
            callsOnBus[index] += 1
            pending[index] = try bus.callAsync(m) { [unowned self] result in
                inFlight -= 1
                calls += 1
                if case .failure(let error) = result, error.name == BrokerErrorCode.notFound.busName { refused += 1 }
                // Not from inside the connection's own callback: the next call may replace it.
                loop.soon { [unowned self] in fire(index) }
            }
            inFlight += 1
        } catch {
            failure = "\(error)"
        }
    }
}

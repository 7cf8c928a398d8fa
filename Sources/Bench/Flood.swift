import BrokerProtocol
import BusKit
import Foundation
import Glibc
import Histogram
import TransferLog

/// (f) What a flood of refused calls from one app costs another app: the victim's `Update`
/// p99 while 64 connections of one other app each make refused calls as fast as they can,
/// reconnecting every 1,000 calls, for 10 s; against the same p99 measured quiet just before.
enum Flood {
    static let connections = Smoke.pick(64, 4)
    static let callsPerConnection = 1000
    static let seconds = Smoke.pick(10, 1)
    static let quietUpdates = Smoke.pick(2000, 10)

    struct Result {
        var lines: [String]
        var key: String
    }

    /// `update` times one Update round trip of the victim (the orchestrator's drop), in ns.
    static func run(world: Orchestrator.World, update: () async throws -> UInt64) async throws -> Result {
        var quiet = latencyHistogram()
        for _ in 0..<quietUpdates {
            try await Orchestrator.settle()
            quiet.record(try await update())
        }
        // The flooder is another app: a copy of this binary at a path of its own.
        let executable = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        let copy = world.stateDirectory.deletingLastPathComponent().appendingPathComponent("flooder/dragbroker-bench-flooder")
        try FileManager.default.createDirectory(at: copy.deletingLastPathComponent(), withIntermediateDirectories: true)
        try? FileManager.default.removeItem(at: copy)
        try FileManager.default.copyItem(atPath: executable, toPath: copy.path)
        let refusalsBefore = try refusalRows(world)
        let flooder = try Child(name: "flooder", executable: copy.path,
                                arguments: ["flood", world.address, "\(connections)", "\(seconds)"],
                                environment: ["PATH": "/usr/bin:/bin"])
        Cleanup.shared.add(flooder)
        guard flooder.stdout.take(timeout: 30, where: { $0 == "FLOODING" || $0.hasPrefix("ERR") }) == "FLOODING" else {
            throw BenchError("the flooder did not start\n\(flooder.diagnostics())")
        }
        var flooded = latencyHistogram()
        let end = monotonicNanos() + UInt64(seconds) * 1_000_000_000
        while monotonicNanos() < end {
            try await Orchestrator.settle()
            flooded.record(try await update())
        }
        guard let done = flooder.stdout.take(timeout: 60, where: { $0.hasPrefix("DONE ") || $0.hasPrefix("ERR") }), done.hasPrefix("DONE ") else {
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
            "    PresentToken with a bad token as fast as it can and reconnecting every \(callsPerConnection) calls, for \(seconds) s:",
            "    \(calls) refused calls (\(calls / seconds)/s), \(reconnects) reconnections; \(written) refusal rows written to the log",
            "  quiet (n=\(quiet.totalCount)): p50 \(format(quiet.micros(50))) µs, p99 \(format(quiet.micros(99))) µs",
            "  under the flood (n=\(flooded.totalCount)): p50 \(format(flooded.micros(50))) µs, p99 \(format(flooded.micros(99))) µs",
        ], key: "victim_update_p99_under_flood_vs_quiet=\(format(ratio, 2))")
    }

    private static func refusalRows(_ world: Orchestrator.World) throws -> Int {
        let log = try TransferLog.openReadOnly(path: TransferLog.path(inStateDirectory: world.stateDirectory.path))
        return try log.refusals(limit: Int.max).count
    }
}

/// The `flood ADDRESS CONNECTIONS SECONDS` role: that many bus connections on one event loop,
/// each with one refused call in flight at all times, each replaced by a new connection every
/// `Flood.callsPerConnection` calls. Prints `FLOODING`, then `DONE calls refused reconnects`.
final class FloodRole: @unchecked Sendable {
    private let loop: EventLoop
    private let address: String
    /// Touched on the loop thread only.
    private var buses: [Bus?]
    private var pending: [Slot?]
    private var callsOnBus: [Int]
    private var calls = 0
    private var refused = 0
    private var reconnects = 0
    private var stopping = false
    private var failure: String?

    private init(address: String, connections: Int) throws {
        loop = try EventLoop()
        self.address = address
        buses = Array(repeating: nil, count: connections)
        pending = Array(repeating: nil, count: connections)
        callsOnBus = Array(repeating: 0, count: connections)
    }

    static func run(address: String, connections: Int, seconds: Int) -> Never {
        do {
            let role = try FloodRole(address: address, connections: connections)
            role.loop.start(name: "flood")
            role.loop.execute {
                for index in 0..<connections { role.fire(index) }
            }
            say("FLOODING")
            sleep(UInt32(seconds))
            let finished = DispatchSemaphore(value: 0)
            nonisolated(unsafe) var line = ""
            role.loop.execute {
                role.stopping = true
                line = role.failure.map { "ERR \($0)" } ?? "DONE \(role.calls) \(role.refused) \(role.reconnects)"
                finished.signal()
            }
            finished.wait()
            say(line)
            exit(0)
        } catch {
            say("ERR \(error)")
            exit(1)
        }
    }

    /// One line to the orchestrator, at once (stdout is a pipe).
    private static func say(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }

    /// One refused call on connection `index`, and on its answer the next.
    private func fire(_ index: Int) {
        guard !stopping else { return }
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
                calls += 1
                if case .failure(let error) = result, error.name == BrokerErrorCode.notFound.busName { refused += 1 }
                // Not from inside the connection's own callback: the next call may replace it.
                loop.soon { [unowned self] in fire(index) }
            }
        } catch {
            failure = "\(error)"
            stopping = true
        }
    }
}

import Foundation

/// The same calls BrokerClient makes for a drop, from a plain C client on sd-bus
/// (`dragbroker-bench-c`, beside this binary) with a drag of its own: the yardstick for what
/// the library adds. Its measurements run in blocks that alternate with BrokerClient's of the
/// same kind (`Orchestrator.measureAgainstC`), so both see the same machine.
final class CBaseline {
    /// One measurement's percentiles, in microseconds, with its paired echo's.
    struct Figures {
        let count: Int
        let p50: Double
        let p99: Double
        let echoP50: Double
        let echoP99: Double
        /// The calling thread's CPU time per pair (operation and echo), in microseconds.
        let cpuPerPair: Double
        /// How often per pair the kernel took the CPU from the calling thread while it could run.
        let switchesPerPair: Double

        var line: String {
            "  n=\(count): p50 \(format(p50)) µs, p99 \(format(p99)) µs; echo p50 \(format(echoP50)) µs, p99 \(format(echoP99)) µs; "
                + "ratio p50 \(format(p50 / echoP50, 2))"
        }
    }

    private let child: Child

    /// Starts the C client on a new drag of the source's and waits until it presented it.
    init(world: Orchestrator.World) throws {
        let executable = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        let path = URL(fileURLWithPath: executable).deletingLastPathComponent().appendingPathComponent("dragbroker-bench-c").path
        guard FileManager.default.isExecutableFile(atPath: path) else {
            throw BenchError("\(path) is missing: build it with `swift build -c release --product dragbroker-bench-c`")
        }
        let token = try world.sourceToken("begin", "the source did not begin a drag for the C client")
        child = try Child(name: "dragbroker-bench-c", executable: path,
                          arguments: [world.address, token, world.sourceName, BenchTypes.small, BenchTypes.file,
                                      "\(Orchestrator.latencyIterations)", "\(Orchestrator.pauseMicroseconds)"],
                          environment: [:])
        Cleanup.shared.add(child)
        guard child.answer(timeout: 20, where: { $0.hasPrefix("READY") }) != nil else {
            throw BenchError("the C client did not start: \(child.stdout.tail(3))\n\(child.diagnostics())")
        }
    }

    /// `kind` is `update` (Enter once, then Update round trips), `firstbyte` or `handover`:
    /// `pairs` operations, each paired with an echo; recorded, or a warm-up.
    func run(_ kind: String, pairs: Int, recorded: Bool) throws {
        let command = recorded ? "block" : "warmup"
        let ok = "OK \(command) \(kind)"
        let budget = Double(pairs) * 0.1 + 30
        guard try child.ask("\(command) \(kind) \(pairs)", timeout: budget, answer: { $0 == ok }) != nil else {
            throw BenchError("the C client failed to measure \(kind): \(child.stdout.tail(3))\n\(child.diagnostics())")
        }
    }

    /// The percentiles of every pair of `kind` recorded since the last report.
    func report(_ kind: String) throws -> Figures {
        let ok = "OK \(kind) "
        guard let line = try child.ask("report \(kind)", timeout: 30, answer: { $0.hasPrefix(ok) }) else {
            throw BenchError("the C client did not report \(kind): \(child.stdout.tail(3))\n\(child.diagnostics())")
        }
        let numbers = line.dropFirst(ok.count).split(separator: " ").compactMap { Double($0) }
        guard numbers.count == 7, numbers[0] > 0 else { throw BenchError("unexpected line from the C client: \(line)") }
        return Figures(count: Int(numbers[0]), p50: numbers[1] / 1000, p99: numbers[2] / 1000,
                       echoP50: numbers[3] / 1000, echoP99: numbers[4] / 1000,
                       cpuPerPair: numbers[5] / numbers[0], switchesPerPair: numbers[6] / numbers[0])
    }

    func drop() throws {
        guard try child.ask("drop", timeout: 20, answer: { $0 == "OK drop" }) != nil else {
            throw BenchError("the C client could not drop: \(child.stdout.tail(3))")
        }
    }

    /// Concludes its drag and waits for it to exit.
    func finish() throws {
        try child.send("quit")
        guard child.waitForExit(timeout: 10), child.process.terminationStatus == 0 else {
            throw BenchError("the C client did not conclude cleanly: \(child.stdout.tail(3))")
        }
    }

    /// BrokerClient's p50 over the C client's.
    static func ratio(_ library: Orchestrator.Paired, _ c: Figures) -> Double {
        library.op.micros(50) / c.p50
    }
}

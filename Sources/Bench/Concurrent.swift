import BrokerClient
import Foundation
import Glibc
import Synchronization
import SystemCalls
import SystemPackage

/// Section (i): N loads of 64 MiB at once through the daemon, against N plain pipes at once
/// between the same two processes, for N = 4 and 16. The plain pipes are made here and
/// opened by the source through /proc, as the single plain pipe of (a) is. They are read twice
/// over: into a buffer, as an app reads a pipe, and spliced into /dev/null, as `load(into:)`
/// reads the broker's pipe, so the destination's side costs the same in both.
enum Concurrent {
    static let counts = [4, 16]
    static let size = BenchSizes.mib64
    static let repetitions = Smoke.pick(5, 1)
    static let budget = 90.0

    /// The pipes' ends: this process reads `readEnds`; the source opens `writePaths`.
    struct Pipes {
        let readEnds: [Int32]
        let writeEnds: [Int32]
        var writePaths: String { writeEnds.map { "/proc/\(getpid())/fd/\($0)" }.joined(separator: ",") }

        static func make() throws -> Pipes {
            var reads: [Int32] = [], writes: [Int32] = []
            for _ in 0..<(counts.max() ?? 0) {
                let pipe = try FileDescriptor.makePipe(nonBlocking: false)
                // As large as the daemon makes its own, as (a)'s plain pipe is.
                try? pipe.readEnd.setPipeCapacity(1 << 20)
                reads.append(pipe.readEnd.rawValue)
                writes.append(pipe.writeEnd.rawValue)
            }
            return Pipes(readEnds: reads, writeEnds: writes)
        }

        /// Once the source opened the write ends, only it holds them.
        func closeWriteEnds() {
            for fd in writeEnds { close(fd) }
        }
    }

    struct Result {
        var lines: [String] = []
        var keys: [String] = []
    }

    static func run(world: Orchestrator.World, connection: BrokerConnection, devNull: FileDescriptor) async throws -> Result {
        let drop = try await connection.presentToken(try world.sourceToken("begin64", "the source did not begin the 64 MiB drag"))
        guard try await drop.enter(proposing: .copy) == .copy, try await drop.performDrop() == .copy else {
            throw BenchError("the 64 MiB drag was not dropped as a copy")
        }
        func broker(_ count: Int) async throws -> Double {
            let start = monotonicNanos()
            let received = try await withThrowingTaskGroup(of: UInt64.self) { group in
                for _ in 0..<count {
                    group.addTask { try await drop.load(item: 0, typeIdentifier: BenchTypes.data64M, into: devNull) }
                }
                return try await group.reduce(0, +)
            }
            let elapsed = monotonicNanos() - start
            guard received == UInt64(count * size) else { throw BenchError("\(count) loads delivered \(received) bytes") }
            return Orchestrator.mibPerSecond(count * size, elapsed)
        }
        func plain(_ count: Int, spliced: Bool = false) async throws -> Double {
            let start = monotonicNanos()
            try world.source.send("plainmany \(count) \(size)")
            let received = try await readAll(world.concurrentReadEnds.prefix(count), splicedInto: spliced ? devNull : nil)
            let elapsed = monotonicNanos() - start
            guard received == count * size else { throw BenchError("\(count) plain pipes delivered \(received) bytes") }
            guard world.source.answer(timeout: 30, where: { $0.hasPrefix("OK plainmany") }) != nil else {
                throw BenchError("the source failed to write the plain pipes\n\(world.source.diagnostics())")
            }
            return Orchestrator.mibPerSecond(count * size, elapsed)
        }

        var result = Result()
        result.lines.append("(i) concurrent loads: N loads of 64 MiB at once through the daemon (load(into: /dev/null)), against N plain")
        result.lines.append("    pipes at once between the same two processes, each written and read by a thread of its own, read into a")
        result.lines.append("    buffer (vs_pipes) and spliced into /dev/null as load(into:) does (vs_spliced_pipes);")
        result.lines.append("    \(repetitions) repetitions each, alternating after a warm-up; ratio = median of broker/plain (aggregate MiB/s)")
        for count in counts {
            _ = try await plain(count)
            _ = try await broker(count)
            _ = try await plain(count, spliced: true)
            var ratios: [Double] = [], plainRates: [Double] = [], brokerRates: [Double] = []
            var splicedRatios: [Double] = [], splicedRates: [Double] = []
            var plainCPU = CPUTotals(), brokerCPU = CPUTotals(), splicedCPU = CPUTotals()
            let deadline = monotonicNanos() + UInt64(budget * 1e9)
            var repetition = 0
            while repetition < repetitions && (repetition == 0 || monotonicNanos() < deadline) {
                let (p, b, ps): (Double, Double, Double)
                if repetition % 2 == 0 {
                    p = try await plainCPU.adding(world) { try await plain(count) }
                    b = try await brokerCPU.adding(world) { try await broker(count) }
                    ps = try await splicedCPU.adding(world) { try await plain(count, spliced: true) }
                } else {
                    ps = try await splicedCPU.adding(world) { try await plain(count, spliced: true) }
                    b = try await brokerCPU.adding(world) { try await broker(count) }
                    p = try await plainCPU.adding(world) { try await plain(count) }
                }
                plainRates.append(p)
                brokerRates.append(b)
                splicedRates.append(ps)
                ratios.append(b / p)
                splicedRatios.append(b / ps)
                repetition += 1
            }
            let ratio = Orchestrator.median(ratios)
            result.lines.append("  N=\(count): plain median \(format(Orchestrator.median(plainRates))) MiB/s, broker median "
                                + "\(format(Orchestrator.median(brokerRates))) MiB/s, broker/plain \(format(ratio, 3))")
            result.lines.append("    plain runs (MiB/s):  \(format(plainRates))")
            result.lines.append("    broker runs (MiB/s): \(format(brokerRates))")
            result.lines.append("    plain spliced (MiB/s): \(format(splicedRates)); broker/plain spliced "
                                + format(Orchestrator.median(splicedRatios), 3))
            result.lines.append("    CPU seconds over all repetitions: plain \(plainCPU), broker \(brokerCPU), plain spliced \(splicedCPU)")
            result.keys.append("concurrent_\(count)_vs_pipes=\(format(ratio, 3))")
            result.keys.append("concurrent_\(count)_vs_spliced_pipes=\(format(Orchestrator.median(splicedRatios), 3))")
        }
        try await drop.conclude()
        return result
    }

    /// CPU time each process spent in the runs measured, to show where the broker's time goes.
    struct CPUTotals: CustomStringConvertible {
        var seconds: [String: Double] = [:]

        mutating func adding<T>(_ world: Orchestrator.World, _ run: () async throws -> T) async throws -> T {
            let before = Usage.now(daemon: world.daemonPID, source: world.source.pid)
            let result = try await run()
            let after = Usage.now(daemon: world.daemonPID, source: world.source.pid)
            for (process, value) in after.cpu { seconds[process, default: 0] += value - (before.cpu[process] ?? .nan) }
            return result
        }

        var description: String {
            ["source", "daemon", "destination"].map { "\($0) \(format(seconds[$0] ?? 0, 2))" }.joined(separator: " / ")
        }
    }

    /// Reads every pipe to `size` bytes at once, a thread each, into a buffer or spliced into
    /// `splicedInto`; the total read.
    static func readAll(_ fds: ArraySlice<Int32>, splicedInto output: FileDescriptor? = nil) async throws -> Int {
        try await withThrowingTaskGroup(of: Int.self) { group in
            for fd in fds {
                group.addTask {
                    try await onThread {
                        guard let output else { return try readExactly(fd, size) }
                        return try spliceExactly(fd, size, into: output)
                    }
                }
            }
            return try await group.reduce(0, +)
        }
    }

    /// Up to `size` bytes from `fd`, 1 MiB per read(2) into a buffer of its own, discarded.
    static func readExactly(_ fd: Int32, _ size: Int) throws -> Int {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BenchSizes.chunk, alignment: 4096)
        defer { buffer.deallocate() }
        return try PlainReader.read(fd, size, into: buffer)
    }

    /// Up to `size` bytes from `fd` spliced into `output`, 1 MiB per splice(2).
    static func spliceExactly(_ fd: Int32, _ size: Int, into output: FileDescriptor) throws -> Int {
        var total = 0
        while total < size {
            let n = try FileDescriptor(rawValue: fd).spliceWaiting(to: output, count: min(BenchSizes.chunk, size - total))
            if n == 0 { return total }
            total += n
        }
        return total
    }

    /// Writes `size` bytes into each of `fds` at once, a thread each (the source's side).
    static func writeAll(_ fds: [Int32], size: Int, chunk: Data) throws {
        let group = DispatchGroup()
        let failure = Mutex<String?>(nil)
        for fd in fds {
            group.enter()
            Thread {
                do {
                    try SourceRole.writePlain(fd, size: size, chunk: chunk)
                } catch {
                    failure.withLock { $0 = "\(error)" }
                }
                group.leave()
            }.start()
        }
        group.wait()
        if let failure = failure.withLock({ $0 }) { throw BenchError(failure) }
    }
}

/// Blocking work on a thread of its own, so N of them run at once whatever the dispatch
/// pool's width.
func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try body() }) }.start()
    }
}

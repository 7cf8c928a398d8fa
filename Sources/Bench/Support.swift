import BrokerProtocol
import BusKit
import Foundation
import Glibc
import Histogram
import Synchronization
import SystemCalls

/// The representations the source offers, one item, all visible to everyone.
enum BenchTypes {
    static let data256M = "application/x-dragbroker-bench-256m"
    static let data1G = "application/x-dragbroker-bench-1g"
    static let data64M = "application/x-dragbroker-bench-64m"
    static let small = "application/x-dragbroker-bench-small"
    static let file = "application/x-dragbroker-bench-file"
    /// The same bytes and file, registered as they are rather than through a handler.
    static let smallHeld = "application/x-dragbroker-bench-small-held"
    static let fileHeld = "application/x-dragbroker-bench-file-held"
}

/// The sizes the bench moves, as its lines name them; under `Smoke`, a few chunks each.
enum BenchSizes {
    static let chunk = 1 << 20
    static let small = 4096
    static let mib64 = Smoke.pick(64 << 20, 1 << 20)
    static let mib256 = Smoke.pick(256 << 20, 2 << 20)
    static let gib1 = Smoke.pick(1 << 30, 4 << 20)
    static let file = Smoke.pick(1 << 30, 4 << 20)
}

/// `DRAGBROKER_BENCH_SMOKE=1`: every section once over, at sizes and counts far too small to
/// measure anything, so that the tests can check on a debug build that `make bench` runs to
/// its end and prints every key. The figures such a run prints mean nothing.
enum Smoke {
    static let variable = "DRAGBROKER_BENCH_SMOKE"
    static let isOn = ProcessInfo.processInfo.environment[variable] == "1"
    /// What the bench's own processes (the source, the scale source) inherit it through.
    static var environment: [String: String] { isOn ? [variable: "1"] : [:] }

    static func pick<T>(_ measuring: T, _ smoke: T) -> T { isOn ? smoke : measuring }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func monotonicNanos() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// 1 MiB of non-zero bytes, built once and reused for every write.
func patternChunk(_ size: Int) -> Data {
    Data((0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
}

/// A latency histogram in nanoseconds, up to 100 s, three significant digits.
func latencyHistogram() -> Histogram<UInt64> {
    Histogram<UInt64>(lowestDiscernibleValue: 1, highestTrackableValue: 100_000_000_000, numberOfSignificantValueDigits: .three)
}

extension Histogram where Count == UInt64 {
    /// A percentile in microseconds.
    func micros(_ percentile: Double) -> Double { Double(valueAtPercentile(percentile)) / 1000 }
}

/// `BeginSession` for one item, with default options and the provider at `provider`.
func beginSessionCall(on bus: Bus, broker: String, item: ItemDescriptor, provider: String) throws(BusError) -> Message {
    let m = try bus.newMethodCall(destination: broker, path: BrokerNames.managerPath,
                                  interface: BrokerNames.managerInterface, member: "BeginSession")
    try m.openContainer("a", ItemDescriptor.signature)
    try item.encode(to: m)
    try m.closeContainer()
    try SessionOptions().encode(to: m)
    try m.append(objectPath: provider)
    return m
}

func format(_ value: Double, _ digits: Int = 1) -> String { String(format: "%.\(digits)f", value) }

/// Every run's figure, as the bench lists them beside their median.
func format(_ values: [Double], separator: String = " ") -> String { values.map { format($0) }.joined(separator: separator) }

/// A bus echo with the machinery the client library uses: an actor whose executor is a BusKit
/// event loop, `Bus.call` with a continuation. sd-bus answers `org.freedesktop.DBus.Peer.Ping`
/// itself, so this is the bare round trip through dbus-daemon to a peer and back.
actor EchoClient {
    let loop: EventLoop
    let bus: Bus

    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    private let ownsLoop: Bool

    init(address: String) throws(BusError) {
        let loop = try EventLoop()
        bus = try Bus.connect(address: address, loop: loop, description: "dragbroker-bench-echo")
        loop.start(name: "dragbroker-bench-echo")
        self.loop = loop
        ownsLoop = true
    }

    /// A connection of its own on another's running loop: made on that loop's thread, so that
    /// an operation and its echo run on one thread, as the C client's do. Keep it until the
    /// process exits: its bus may be released only on that loop's thread.
    init(address: String, sharing loop: EventLoop) throws(BusError) {
        bus = try Bus.connect(address: address, loop: loop, description: "dragbroker-bench-echo-shared")
        self.loop = loop
        ownsLoop = false
    }

    /// Stops the loop it owns: the bus may be released only on its loop's thread or once no
    /// thread runs the loop. Call from outside the loop, once, when done.
    nonisolated func close() {
        if ownsLoop { loop.stop() }
    }

    func ping(_ destination: String) async throws(BusError) {
        let message = try bus.newMethodCall(destination: destination, path: "/", interface: "org.freedesktop.DBus.Peer", member: "Ping")
        _ = try await bus.call(message)
    }

    /// The same round trip timed on the loop's own thread, from before the call is made to
    /// the reply's arrival there: what the echo costs without the caller's two thread hops.
    func pingOnLoop(_ destination: String) async throws(BusError) -> UInt64 {
        let start = monotonicNanos()
        try await ping(destination)
        return monotonicNanos() - start
    }
}

/// Lines from a child's output, collected on a thread of their own; only the newest are kept.
final class LineReader: @unchecked Sendable {
    private let condition = NSCondition()
    private var lines: [String] = []
    private var closed = false
    private let keep: Int

    init(_ handle: FileHandle, keep: Int = 2000) {
        self.keep = keep
        let thread = Thread { [self] in
            // The descriptor's own reads, which retry EINTR: `FileHandle.availableData` traps on
            // any error, an interrupted read included (seen as the bench's children were signalled).
            let fd = FileDescriptor(rawValue: handle.fileDescriptor)
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 1)
            defer { buffer.deallocate() }
            var pending = Data()
            // The handle owns the descriptor: it stays open while this thread reads it.
            withExtendedLifetime(handle) {
                while let count = try? fd.readSome(into: buffer), count > 0 {
                    // From the pointer: appending the buffer's slice went through
                    // `Slice.withUnsafeBytes` and once trapped there ("Index out of bounds").
                    pending.append(buffer.baseAddress!.assumingMemoryBound(to: UInt8.self), count: count)
                    while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                        let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
                        pending.removeSubrange(pending.startIndex...newline)
                        condition.lock()
                        lines.append(line)
                        if lines.count > keep { lines.removeFirst(lines.count - keep) }
                        condition.broadcast()
                        condition.unlock()
                    }
                }
            }
            condition.lock(); closed = true; condition.broadcast(); condition.unlock()
        }
        thread.start()
    }

    /// Removes and returns the first line satisfying `match`, waiting up to `timeout` seconds.
    func take(timeout: TimeInterval, where match: (String) -> Bool) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while true {
            if let index = lines.firstIndex(where: match) { return lines.remove(at: index) }
            if closed || !condition.wait(until: deadline) { return lines.firstIndex(where: match).map { lines.remove(at: $0) } }
        }
    }

    func tail(_ count: Int) -> String {
        condition.lock()
        defer { condition.unlock() }
        return lines.suffix(count).joined(separator: "\n")
    }
}

/// A child process with its stdin and stdout on pipes, and its stderr on a pipe or, for a
/// chatty child, in a file (so no reader in this process wakes for each line it logs).
final class Child: @unchecked Sendable {
    let name: String
    let process = Process()
    let stdout: LineReader
    private let stderr: LineReader?
    private let stderrPath: String?
    private let input = Pipe()

    init(name: String, executable: String, arguments: [String], environment: [String: String], stderrPath: String? = nil) throws {
        self.name = name
        self.stderrPath = stderrPath
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = environment
        let out = Pipe()
        process.standardInput = input
        process.standardOutput = out
        stdout = LineReader(out.fileHandleForReading)
        if let stderrPath {
            guard FileManager.default.createFile(atPath: stderrPath, contents: nil),
                  let file = FileHandle(forWritingAtPath: stderrPath) else { throw BenchError("cannot create \(stderrPath)") }
            process.standardError = file
            stderr = nil
        } else {
            let err = Pipe()
            process.standardError = err
            stderr = LineReader(err.fileHandleForReading)
        }
        try Self.spawn(process)
    }

    /// Starts `process` from a thread of its own with no signal blocked: a child inherits the
    /// spawning thread's mask, and the concurrency pool's threads block nearly every signal,
    /// which would leave the child deaf to SIGTERM.
    private static func spawn(_ process: Process) throws {
        let failure = Mutex<(any Error)?>(nil)
        let done = DispatchSemaphore(value: 0)
        let process = UncheckedBox(process)
        let thread = Thread {
            var none = sigset_t()
            sigemptyset(&none)
            pthread_sigmask(SIG_SETMASK, &none, nil)
            do {
                try process.value.run()
            } catch {
                failure.withLock { $0 = error }
            }
            done.signal()
        }
        thread.start()
        done.wait()
        if let error = failure.withLock({ $0 }) { throw error }
    }

    var pid: pid_t { process.processIdentifier }

    /// Waits up to `timeout` seconds for a stderr line containing `text`.
    func waitForStderr(containing text: String, timeout: TimeInterval) -> Bool {
        if let stderr { return stderr.take(timeout: timeout) { $0.contains(text) } != nil }
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if stderrTail(1000).contains(text) { return true }
            if !process.isRunning { return false }
            usleep(20_000)
        }
        return false
    }

    func stderrTail(_ count: Int) -> String {
        if let stderr { return stderr.tail(count) }
        guard let stderrPath, let text = try? String(contentsOfFile: stderrPath, encoding: .utf8) else { return "" }
        return text.split(separator: "\n", omittingEmptySubsequences: false).suffix(count).joined(separator: "\n")
    }

    func send(_ line: String) throws {
        try input.fileHandleForWriting.write(contentsOf: Data((line + "\n").utf8))
    }

    /// Sends `line`, then waits up to `timeout` seconds for its `answer`.
    func ask(_ line: String, timeout: TimeInterval, answer isAnswer: (String) -> Bool) throws -> String? {
        try send(line)
        return answer(timeout: timeout, where: isAnswer)
    }

    /// Waits up to `timeout` seconds for the first line that `isAnswer` accepts, or one starting
    /// with `ERR`. The answer; nil after `ERR` or none.
    func answer(timeout: TimeInterval, where isAnswer: (String) -> Bool) -> String? {
        guard let reply = stdout.take(timeout: timeout, where: { isAnswer($0) || $0.hasPrefix("ERR") }), isAnswer(reply) else { return nil }
        return reply
    }

    func closeInput() {
        try? input.fileHandleForWriting.close()
    }

    /// Waits up to `timeout` seconds for the child to exit.
    func waitForExit(timeout: TimeInterval) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning {
            if Date() > deadline { return false }
            usleep(10_000)
        }
        return true
    }

    /// SIGTERM, then SIGKILL if it has not gone within `grace` seconds.
    func stop(grace: TimeInterval = 5) {
        guard process.isRunning else { return }
        kill(pid, SIGTERM)
        if !waitForExit(timeout: grace) {
            kill(pid, SIGKILL)
            _ = waitForExit(timeout: 5)
        }
    }

    func diagnostics() -> String {
        "\(name) stderr (last lines):\n\(stderrTail(20))"
    }
}

/// Carries a value that is used by one thread at a time across a thread boundary.
struct UncheckedBox<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

/// Everything the orchestrator started, torn down exactly once: on success, on an error,
/// on SIGINT/SIGTERM/SIGHUP, and by the watchdog. A second caller waits for the first to
/// finish, so the process never exits halfway through.
final class Cleanup: @unchecked Sendable {
    static let shared = Cleanup()

    /// Guards everything below; held for the whole teardown.
    private let lock = NSLock()
    private var children: [Child] = []
    private var directories: [URL] = []
    private var done = false

    func add(_ child: Child) {
        lock.withLock {
            children.append(child)
            CrashCleanup.remember(child.pid)
        }
    }
    func add(directory: URL) { lock.withLock { directories.append(directory) } }

    /// The last lines each child wrote to stderr, for a failure report.
    func diagnostics() -> String {
        lock.withLock { children }.map { $0.diagnostics() }.joined(separator: "\n")
    }

    /// Stops children newest first (source, daemon, bus), then removes the directories.
    func run() {
        lock.lock()
        defer { lock.unlock() }
        if done { return }
        done = true
        for child in children.reversed() {
            child.closeInput()
            child.stop()
            CrashCleanup.forget(child.pid)
        }
        for directory in directories { try? FileManager.default.removeItem(at: directory) }
    }
}

/// Signals reach a C handler that only writes to a pipe; a thread turns that into cleanup.
/// Handlers (unlike ignored signals) reset to the default in children after exec.
/// A `let` pointer: reading it in the handler involves no exclusivity check or allocation.
nonisolated(unsafe) private let signalPipe = UnsafeMutablePointer<Int32>.allocate(capacity: 2)

func installTerminationHandlers() {
    CrashCleanup.install()
    guard let pipe = try? FileDescriptor.makePipe(nonBlocking: false) else { return }
    signalPipe[0] = pipe.readEnd.rawValue
    signalPipe[1] = pipe.writeEnd.rawValue
    let handler: @convention(c) (Int32) -> Void = { signal in
        var byte = UInt8(truncatingIfNeeded: signal)
        _ = write(signalPipe[1], &byte, 1)
    }
    for signal in [SIGINT, SIGTERM, SIGHUP] { _ = Glibc.signal(signal, handler) }
    // Writing to a child that is gone must fail with EPIPE, not kill this process; a handler
    // rather than SIG_IGN, which children would inherit.
    _ = Glibc.signal(SIGPIPE, { _ in })
    let thread = Thread {
        var byte: UInt8 = 0
        while read(signalPipe[0], &byte, 1) < 0 && errno == EINTR {}
        FileHandle.standardError.write(Data("dragbroker-bench: interrupted by signal \(byte), cleaning up\n".utf8))
        Cleanup.shared.run()
        exit(130)
    }
    thread.start()
}

/// A crash (a trap, an abort, a bad access) runs no cleanup, and left the bus, the daemon and the
/// source running. The handler sends SIGTERM to every child still on record, with nothing but
/// `kill(2)`, then puts back the handler it replaced (the Swift runtime's backtracer) and raises
/// the signal again, so the crash still reports and ends the process as before.
enum CrashCleanup {
    private static let capacity = 64
    /// Slots of pids, 0 when free; written under `Cleanup`'s lock, read by the handler.
    nonisolated(unsafe) private static let pids: UnsafeMutablePointer<pid_t> = {
        let table = UnsafeMutablePointer<pid_t>.allocate(capacity: capacity)
        table.initialize(repeating: 0, count: capacity)
        return table
    }()
    private static let signals = [SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGTRAP, SIGFPE]
    nonisolated(unsafe) private static let replaced = UnsafeMutablePointer<sigaction>.allocate(capacity: 32)

    static func remember(_ pid: pid_t) {
        for slot in 0..<capacity where pids[slot] == 0 {
            pids[slot] = pid
            return
        }
    }

    static func forget(_ pid: pid_t) {
        for slot in 0..<capacity where pids[slot] == pid { pids[slot] = 0 }
    }

    static func install() {
        _ = pids
        for signal in signals {
            var action = sigaction()
            action.__sigaction_handler.sa_sigaction = { signal, _, _ in
                for slot in 0..<CrashCleanup.capacity where CrashCleanup.pids[slot] > 0 {
                    kill(CrashCleanup.pids[slot], SIGTERM)
                }
                sigaction(signal, CrashCleanup.replaced + Int(signal), nil)
                raise(signal)
            }
            action.sa_flags = SA_SIGINFO
            sigemptyset(&action.sa_mask)
            sigaction(signal, &action, replaced + Int(signal))
        }
    }
}

/// Ends the whole run if it takes longer than `seconds`, cleaning up first.
func startWatchdog(seconds: Double) {
    let thread = Thread {
        Thread.sleep(forTimeInterval: seconds)
        FileHandle.standardError.write(Data("dragbroker-bench: gave up after \(Int(seconds)) s, cleaning up\n".utf8))
        Cleanup.shared.run()
        exit(1)
    }
    thread.start()
}

/// Blocking descriptor work on a dispatch thread, as the client library does its reads.
func offThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async { continuation.resume(with: Result { try body() }) }
    }
}

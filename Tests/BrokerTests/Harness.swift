import BrokerProtocol
import Foundation
import TransferLog
import XCTest

/// Where `swift build` put the products: beside the test bundle.
let productsDirectory: URL = {
    if let dir = ProcessInfo.processInfo.environment["DRAGBROKER_PRODUCTS"] { return URL(fileURLWithPath: dir) }
    return URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
}()

/// Whether `condition` holds within `timeout` seconds, asked every 50 ms.
func eventually(timeout: TimeInterval = 10, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if condition() { return true }
        usleep(50_000)
    }
    return false
}

/// Lines from a child's output, collected on a thread of their own.
final class LineReader: @unchecked Sendable {
    private let condition = NSCondition()
    private var lines: [String] = []
    private var closed = false

    init(_ handle: FileHandle) {
        let thread = Thread { [self] in
            var pending = Data()
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
                    pending.removeSubrange(pending.startIndex...newline)
                    condition.lock(); lines.append(line); condition.broadcast(); condition.unlock()
                }
            }
            condition.lock(); closed = true; condition.broadcast(); condition.unlock()
        }
        thread.start()
    }

    /// Removes and returns the first line satisfying `match`, waiting up to `timeout` seconds.
    func take(timeout: TimeInterval = 20, where match: (String) -> Bool) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while true {
            if let index = lines.firstIndex(where: match) { return lines.remove(at: index) }
            if closed || !condition.wait(until: deadline) { return lines.firstIndex(where: match).map { lines.remove(at: $0) } }
        }
    }

    /// Every line seen so far that satisfies `match`, without removing any.
    func all(where match: (String) -> Bool) -> [String] {
        condition.lock()
        defer { condition.unlock() }
        return lines.filter(match)
    }

    var text: String {
        condition.lock()
        defer { condition.unlock() }
        return lines.joined(separator: "\n")
    }
}

/// A private dbus-daemon for one suite: never the host's bus.
final class PrivateBus {
    let address: String
    private let daemon: Child

    /// `everyUser`: any user may connect, not only the bus's own (a bus several users share).
    init(everyUser: Bool = false) throws {
        var arguments = ["--session", "--nofork", "--nopidfile", "--print-address=1"]
        if everyUser {
            let config = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-bus-\(UUID().uuidString).conf")
            try """
                <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
                 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
                <busconfig>
                  <type>session</type>
                  <listen>unix:tmpdir=/tmp</listen>
                  <auth>EXTERNAL</auth>
                  <policy context="default">
                    <allow user="*"/>
                    <allow send_destination="*" eavesdrop="true"/>
                    <allow eavesdrop="true"/>
                    <allow own="*"/>
                  </policy>
                </busconfig>
                """.write(to: config, atomically: true, encoding: .utf8)
            arguments = ["--config-file=\(config.path)", "--nofork", "--nopidfile", "--print-address=1"]
        }
        daemon = try Child(executable: URL(fileURLWithPath: "/usr/bin/dbus-daemon"), arguments: arguments,
                           environment: ["PATH": "/usr/bin:/bin"])
        guard let address = daemon.stdout.take(where: { $0.hasPrefix("unix:") }) else {
            throw HarnessError("dbus-daemon did not start: \(daemon.stderr.text)")
        }
        self.address = address
    }

    /// The bus dies, as when dbus-daemon crashes or the session ends.
    func kill() {
        daemon.kill(SIGKILL)
    }

    deinit { daemon.terminate() }
}

struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A child process whose stdout we read line by line.
class Child {
    let process = Process()
    let stdout: LineReader
    let stderr: LineReader
    private let input = Pipe()

    init(executable: URL, arguments: [String] = [], environment: [String: String]) throws {
        process.executableURL = executable
        process.arguments = arguments
        process.environment = environment
        let out = Pipe(), err = Pipe()
        process.standardInput = input
        process.standardOutput = out
        process.standardError = err
        stdout = LineReader(out.fileHandleForReading)
        stderr = LineReader(err.fileHandleForReading)
        try process.run()
    }

    /// A child that died must fail its test, not kill the test process with SIGPIPE.
    private static let ignoreBrokenPipes: Void = { signal(SIGPIPE, SIG_IGN) }()

    func send(_ line: String) {
        Self.ignoreBrokenPipes
        do {
            try input.fileHandleForWriting.write(contentsOf: Data((line + "\n").utf8))
        } catch {
            XCTFail("cannot write to \(process.executableURL?.lastPathComponent ?? "a child") (exited \(process.isRunning ? "not yet" : "\(process.terminationStatus)")): \(error)")
        }
    }

    /// End of file on the child's standard input.
    func closeInput() {
        try? input.fileHandleForWriting.close()
    }

    func kill(_ signal: Int32 = SIGKILL) {
        Glibc.kill(process.processIdentifier, signal)
        process.waitUntilExit()
    }

    func terminate() {
        if process.isRunning { kill(SIGTERM) }
    }

    deinit { terminate() }
}

/// The daemon under test, on a private bus with its own state directory.
final class Daemon: Child {
    let stateDirectory: URL
    let policyDirectory: URL

    /// `user`: run as this user (see `TestUser`) rather than as the test's. `launcher`: the
    /// command that starts it, e.g. `prlimit --nofile=…`.
    init(bus: PrivateBus, stateDirectory: URL, policyDirectory: URL, arguments: [String] = [],
         environment: [String: String] = [:], waitUntilServing: Bool = true, user: TestUser? = nil, launcher: [String] = []) throws {
        self.stateDirectory = stateDirectory
        self.policyDirectory = policyDirectory
        let command = [productsDirectory.appendingPathComponent("dragbrokerd").path, "--address", bus.address,
                       "--state-directory", stateDirectory.path, "--policy-directory", policyDirectory.path] + arguments
        let run = launcher + (user.map { $0.command(command) } ?? command)
        try super.init(executable: URL(fileURLWithPath: run[0]), arguments: Array(run.dropFirst()),
                       environment: ["PATH": "/usr/bin:/bin"].merging(environment) { $1 })
        guard !waitUntilServing || stderr.take(where: { $0.contains("Serving org.dragbroker.Broker1") }) != nil else {
            throw HarnessError("dragbrokerd did not start: \(stderr.text)")
        }
    }

    var transferLogPath: String { stateDirectory.appendingPathComponent("transfers.sqlite").path }

    /// Waits until the log holds what `ready` looks for: records are written off the bus path.
    func waitForLog<T>(timeout: TimeInterval = 20, _ ready: (TransferLog) throws -> T?) throws -> T {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let log = try? TransferLog.openReadOnly(path: transferLogPath), let value = try ready(log) { return value }
            usleep(50_000)
        }
        throw HarnessError("the transfer log never showed the expected records")
    }
}

/// How a peer process is started, which decides how the daemon identifies it.
enum Sandbox {
    /// A plain process: identified by its executable (and the registry).
    case none
    /// A fake Flatpak: a private mount namespace, chrooted into a root whose /.flatpak-info
    /// names `appID`; the rest of the root is bind-mounted from the host.
    case flatpak(appID: String)
    /// A sandbox as Flatpak builds one: the app in bubblewrap, with no way to the bus but a
    /// socket of xdg-dbus-proxy that lets it talk to the broker alone. The proxy runs in
    /// bubblewrap too, with the same /.flatpak-info, as Flatpak runs it: the proxy is the
    /// connection the daemon sees, and its root is where the daemon reads the app's ID.
    case bubblewrap(appID: String)
}

/// What a peer process runs.
enum Program {
    /// The scriptable app on the client library (Tests/TestPeer). Behind xdg-dbus-proxy it
    /// needs a proxy that accepts sd-bus's pipelined authentication, which Debian 12's 0.1.4
    /// does not (flatpak/xdg-dbus-proxy#21): there the sandboxed callers are probes.
    case testPeer
    /// The raw D-Bus client in Python (Tests/python/probe.py), for calls the library does not
    /// make: Properties, ObjectManager, SessionCount, manager methods by hand.
    case probe

    static let probeScript = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("python/probe.py")
}

/// The pieces of a bubblewrap command line that every sandbox here shares: a root of its own
/// holding the host's /usr read-only (and the Swift runtime the test peer links), a private
/// /tmp, and a /.flatpak-info naming the app.
func bubblewrapArguments(flatpakInfo: URL) -> [String] {
    ["--die-with-parent",
     "--ro-bind", "/usr", "/usr", "--ro-bind", "/opt/swift", "/opt/swift",
     "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
     "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
     "--ro-bind", flatpakInfo.path, "/.flatpak-info"]
}

/// xdg-dbus-proxy for one sandboxed app, in bubblewrap as Flatpak runs it: `--filter` with
/// `--talk=org.dragbroker.Broker1`, so through it the app may call the broker and hear its
/// signals, and nothing else on the bus.
final class FlatpakBusProxy: Child {
    /// The directory holding the proxy's socket, `bus`, to bind into the app's sandbox.
    let socketDirectory: URL
    /// The proxy's PID: the bus connection is the proxy's, so this is the PID the daemon sees.
    private(set) var pid: pid_t = 0

    init(flatpakInfo: URL, socketDirectory: URL, bus: PrivateBus) throws {
        self.socketDirectory = socketDirectory
        try FileManager.default.createDirectory(at: socketDirectory, withIntermediateDirectories: true)
        var binds = ["--bind", socketDirectory.path, "/run/dbus-proxy"]
        // A socket in the file system must be visible inside; an abstract one is reached as it is.
        if let path = bus.address.split(separator: ",").first.flatMap({ $0.hasPrefix("unix:path=") ? $0.dropFirst("unix:path=".count) : nil }) {
            binds += ["--bind", String(path), String(path)]
        }
        // bubblewrap reports its child's PID as JSON on the info descriptor; the proxy itself prints nothing.
        try super.init(executable: URL(fileURLWithPath: "/usr/bin/bwrap"),
                       arguments: bubblewrapArguments(flatpakInfo: flatpakInfo) + binds + ["--info-fd", "1", "--",
                                   "/usr/bin/xdg-dbus-proxy", bus.address, "/run/dbus-proxy/bus", "--filter", "--talk=\(BrokerNames.busName)"],
                       environment: ["PATH": "/usr/bin:/bin"])
        if let line = stdout.take(where: { $0.contains("\"child-pid\"") }), let value = line.split(separator: ":").last {
            pid = pid_t(value.trimmingCharacters(in: .whitespaces).trimmingCharacters(in: CharacterSet(charactersIn: ","))) ?? 0
        }
        let socket = socketDirectory.appendingPathComponent("bus").path
        let deadline = Date().addingTimeInterval(20)
        while !FileManager.default.fileExists(atPath: socket) && Date() < deadline { usleep(10_000) }
        guard pid > 0, FileManager.default.fileExists(atPath: socket) else {
            throw HarnessError("xdg-dbus-proxy did not start: \(stdout.text) \(stderr.text)")
        }
    }
}

/// One app: a copy of the test peer at its own path, so the daemon sees a distinct executable,
/// or the Python probe.
final class Peer: Child {
    private(set) var uniqueName = ""
    let executable: URL
    /// The bus proxy of a bubblewrap sandbox, which lives as long as the app.
    let proxy: FlatpakBusProxy?

    init(app: String, in directory: URL, bus: PrivateBus, sandbox: Sandbox = .none, program: Program = .testPeer,
         user: TestUser? = nil) throws {
        let binary = directory.appendingPathComponent("apps/\(app)")
        if program == .testPeer && !FileManager.default.fileExists(atPath: binary.path) {
            try FileManager.default.createDirectory(at: binary.deletingLastPathComponent(), withIntermediateDirectories: true)
            try FileManager.default.copyItem(at: productsDirectory.appendingPathComponent("dragbroker-testpeer"), to: binary)
        }
        executable = program == .testPeer ? binary : URL(fileURLWithPath: "/usr/bin/python3")
        let command = program == .testPeer ? [binary.path] : ["/usr/bin/python3", Program.probeScript.path]
        let environment = ["DRAGBROKER_BUS_ADDRESS": bus.address, "PATH": "/usr/bin:/bin"]
        // Each instance gets its own proxy and socket, as each Flatpak instance does.
        let box = directory.appendingPathComponent("boxes/\(app)-\(UUID().uuidString.prefix(8))")
        let info = box.appendingPathComponent("flatpak-info")
        if case .bubblewrap(let appID) = sandbox {
            try FileManager.default.createDirectory(at: box, withIntermediateDirectories: true)
            try "[Application]\nname=\(appID)\nruntime=runtime/org.freedesktop.Platform/x86_64/23.08\n"
                .write(to: info, atomically: true, encoding: .utf8)
            proxy = try FlatpakBusProxy(flatpakInfo: info, socketDirectory: box.appendingPathComponent("proxy"), bus: bus)
        } else {
            proxy = nil
        }
        switch sandbox {
        case .none:
            let run = user.map { $0.command(command) } ?? command
            try super.init(executable: URL(fileURLWithPath: run[0]), arguments: Array(run.dropFirst()), environment: environment)
        case .bubblewrap:
            // No network, IPC or PID namespace of the host, and a /tmp of its own: the proxy's
            // socket is the app's only way to a bus. The app is bound at /app, as in Flatpak.
            let inside = program == .testPeer ? ["/app/bin/\(app)"] : ["/usr/bin/python3", "/app/probe.py"]
            let mounted = program == .testPeer ? binary.path : Program.probeScript.path
            try super.init(executable: URL(fileURLWithPath: "/usr/bin/bwrap"),
                           arguments: bubblewrapArguments(flatpakInfo: info)
                               + ["--unshare-net", "--unshare-ipc", "--unshare-pid",
                                  "--ro-bind", box.appendingPathComponent("proxy").path, "/run/dbus-proxy", "--ro-bind", mounted, inside.last!, "--"] + inside,
                           environment: ["DRAGBROKER_BUS_ADDRESS": "unix:path=/run/dbus-proxy/bus", "PATH": "/usr/bin:/bin"])
        case .flatpak(let appID):
            let root = directory.appendingPathComponent("roots/\(app)")
            try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
            try "[Application]\nname=\(appID)\nruntime=runtime/org.freedesktop.Platform/x86_64/23.08\n"
                .write(to: root.appendingPathComponent(".flatpak-info"), atomically: true, encoding: .utf8)
            let script = """
                set -e
                root=$1; shift
                for d in usr opt tmp proc dev etc sys var run; do
                    [ -d /$d ] || continue
                    mkdir -p "$root/$d"; mount --rbind /$d "$root/$d"
                done
                for l in bin lib lib32 lib64 sbin; do [ -L /$l ] && ln -sfn "$(readlink /$l)" "$root/$l"; done
                exec /usr/sbin/chroot "$root" "$@"
                """
            try super.init(executable: URL(fileURLWithPath: "/usr/bin/unshare"),
                           arguments: ["--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", root.path] + command,
                           environment: environment)
        }
        guard let ready = stdout.take(where: { $0.hasPrefix("READY ") || $0.hasPrefix("ERR ") }), ready.hasPrefix("READY ") else {
            throw HarnessError("peer \(app) did not connect: \(stdout.text) \(stderr.text)")
        }
        uniqueName = String(ready.dropFirst("READY ".count))
    }

    /// The PID the daemon sees: inside the fake Flatpak the peer is a child of `unshare`/`chroot`
    /// exec'd in place, so it is the same process; behind a bus proxy it is the proxy's.
    var reportedPID: pid_t { proxy?.pid ?? process.processIdentifier }

    /// Sends a command and returns its one-line answer (`OK ...` or `ERR <name> <message>`).
    @discardableResult
    func run(_ command: String, timeout: TimeInterval = 30) -> String {
        send(command)
        return stdout.take(timeout: timeout) { $0.hasPrefix("OK") || $0.hasPrefix("ERR") } ?? "TIMEOUT waiting for \(command)"
    }

    /// Waits for an event line, exactly.
    func waitFor(_ line: String, timeout: TimeInterval = 20) -> Bool {
        stdout.take(timeout: timeout) { $0 == line } != nil
    }

    var handlerCalls: [String] { stdout.all { $0.hasPrefix("HANDLER ") } }

    /// This peer's lines that start with `prefix`, once `count` have arrived (or after 20 s):
    /// another peer's answer can overtake this peer's line.
    func lines(startingWith prefix: String, count: Int) -> [String] {
        let deadline = Date().addingTimeInterval(20)
        while true {
            let lines = stdout.all { $0.hasPrefix(prefix) }
            if lines.count >= count || Date() > deadline { return lines }
            usleep(20_000)
        }
    }

    /// Begins a drag from a JSON spec; returns the token.
    func begin(_ json: String) throws -> (token: String, path: String) {
        let answer = run("begin " + json)
        let parts = answer.split(separator: " ")
        guard parts.count == 3, parts[0] == "OK" else { throw HarnessError("begin failed: \(answer)") }
        return (String(parts[1]), String(parts[2]))
    }
}

/// A suite's world: a bus, a daemon, a scratch directory, and the daemon's policy directory
/// (never the host's /etc/dragbroker).
final class World {
    let directory: URL
    let bus: PrivateBus
    private(set) var daemon: Daemon

    /// `policy` gets the world's directory, so registry entries can name the app copies.
    /// `daemonUser` runs the daemon as that user, on a bus every user may join.
    init(policy: ((World.Paths) -> String)? = nil, daemonUser: TestUser? = nil, everyUser: Bool = false,
         daemonLauncher: [String] = []) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-test-\(UUID().uuidString)")
        let paths = Paths(directory: directory)
        try FileManager.default.createDirectory(at: paths.policyDirectory.appendingPathComponent("dragbroker.conf.d"),
                                                withIntermediateDirectories: true)
        if let policy {
            try policy(paths).write(to: paths.policyFile, atomically: true, encoding: .utf8)
        }
        bus = try PrivateBus(everyUser: everyUser || daemonUser != nil)
        let state = directory.appendingPathComponent("state")
        if let daemonUser {
            try FileManager.default.createDirectory(at: state, withIntermediateDirectories: true)
            try daemonUser.own(state)
        }
        daemon = try Daemon(bus: bus, stateDirectory: state, policyDirectory: paths.policyDirectory, user: daemonUser,
                            launcher: daemonLauncher)
    }

    struct Paths {
        let directory: URL
        var policyDirectory: URL { directory.appendingPathComponent("policy") }
        var policyFile: URL { policyDirectory.appendingPathComponent("dragbroker.conf") }
        func app(_ name: String) -> String { directory.appendingPathComponent("apps/\(name)").path }
        func dropIn(_ name: String) -> URL { policyDirectory.appendingPathComponent("dragbroker.conf.d/\(name)") }
    }

    var paths: Paths { Paths(directory: directory) }

    /// Stops the daemon with SIGTERM and starts a new one on the same state directory.
    func restartDaemon() throws {
        daemon.kill(SIGTERM)
        daemon = try Daemon(bus: bus, stateDirectory: daemon.stateDirectory, policyDirectory: daemon.policyDirectory)
    }

    func peer(_ app: String, sandbox: Sandbox = .none, program: Program = .testPeer, user: TestUser? = nil) throws -> Peer {
        try Peer(app: app, in: directory, bus: bus, sandbox: sandbox, program: program, user: user)
    }

    deinit {
        daemon.terminate()
        // Never delete through a bind mount that is somehow still visible here.
        let mounts = (try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)) ?? ""
        if !mounts.contains(directory.path) {
            try? FileManager.default.removeItem(at: directory)
        }
    }
}

/// What the test peer prints for bytes that are text: their base64.
func base64(_ text: String) -> String { Data(text.utf8).base64EncodedString() }

/// The line a peer prints for a failed call.
func err(_ code: BrokerErrorCode, _ message: String) -> String {
    "ERR \(code.busName) \(message)"
}

/// A real user of this machine for tests that cross users, made on first use (as root only:
/// `TestUser.require` skips the test otherwise, saying why).
struct TestUser {
    let name: String
    let uid: uid_t
    let gid: gid_t

    static func require(_ name: String) throws -> TestUser {
        guard geteuid() == 0 else { throw XCTSkip("Needs root, to add the user \(name) and run processes as it") }
        if getpwnam(name) == nil {
            let add = Process()
            add.executableURL = URL(fileURLWithPath: "/usr/sbin/useradd")
            add.arguments = ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name]
            try add.run()
            add.waitUntilExit()
        }
        guard let entry = getpwnam(name) else { throw HarnessError("useradd did not add \(name)") }
        return TestUser(name: name, uid: entry.pointee.pw_uid, gid: entry.pointee.pw_gid)
    }

    /// `command`, run as this user with its own groups only.
    func command(_ command: [String]) -> [String] {
        ["/usr/bin/setpriv", "--reuid=\(uid)", "--regid=\(gid)", "--init-groups", "--"] + command
    }

    func own(_ url: URL) throws {
        guard chown(url.path, uid, gid) == 0 else { throw HarnessError("chown \(url.path) failed: errno \(errno)") }
    }
}

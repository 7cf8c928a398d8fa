import BrokerProtocol
import BusKit
import Foundation
import XCTest

/// The administrator's side: readiness, idle exit, SIGTERM, the units, installation.
final class SystemdTests: XCTestCase {
    static let root = DocumentationTests.root

    /// READY=1 comes only once the bus name is owned, then STATUS lines follow the sessions.
    func testReadinessIsSignalledOnlyAfterTheNameIsOwned() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-notify-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let socketPath = directory.appendingPathComponent("notify").path
        let notify = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        defer { close(notify) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            _ = socketPath.utf8CString.withUnsafeBytes { memcpy(raw.baseAddress!, $0.baseAddress!, $0.count) }
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(notify, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        XCTAssertEqual(bound, 0)
        func receive() -> String {
            var p = pollfd(fd: notify, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 10_000) == 1 else { return "nothing" }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let n = recv(notify, &buffer, buffer.count, 0)
            return String(decoding: buffer[0..<max(n, 0)], as: UTF8.self)
        }

        let bus = try PrivateBus()
        let daemon = try Daemon(bus: bus, stateDirectory: directory.appendingPathComponent("state"),
                                policyDirectory: directory.appendingPathComponent("policy"),
                                environment: ["NOTIFY_SOCKET": socketPath], waitUntilServing: false)
        XCTAssertEqual(receive(), "READY=1\nSTATUS=Serving org.dragbroker.Broker1, no live session")
        // Already owned at the moment READY arrived.
        let probe = try BusProbe(address: bus.address)
        let owner = probe.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetNameOwner") { m throws(BusError) in
            try m.append(BrokerNames.busName)
        }
        XCTAssertEqual(owner.errorName, "OK")

        let peer = try Peer(app: "source-app", in: directory, bus: bus)
        _ = try peer.begin(EndToEndTests.helloDrag)
        XCTAssertEqual(receive(), "STATUS=1 live session")
        XCTAssertEqual(peer.run("cancel"), "OK")
        XCTAssertEqual(receive(), "STATUS=0 live sessions")
        daemon.kill(SIGTERM)
        XCTAssertEqual(receive(), "STOPPING=1\nSTATUS=Ending 0 session(s)")
        XCTAssertEqual(daemon.process.terminationStatus, 0)
    }

    /// Bus-activated, the daemon leaves when it has had no session for a while, never while
    /// one lives, and gives its name back first.
    func testExitsWhenIdleButNotDuringASession() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-idle-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let bus = try PrivateBus()
        let daemon = try Daemon(bus: bus, stateDirectory: directory.appendingPathComponent("state"),
                                policyDirectory: directory.appendingPathComponent("policy"), arguments: ["--exit-idle-time", "1"])
        let peer = try Peer(app: "source-app", in: directory, bus: bus)
        _ = try peer.begin(EndToEndTests.helloDrag)
        usleep(2_000_000)
        XCTAssertTrue(daemon.process.isRunning, "a live session keeps the daemon")
        XCTAssertEqual(peer.run("cancel"), "OK")
        XCTAssertNotNil(daemon.stderr.take(timeout: 10) { $0.contains("No session for 1 s, exiting") })
        daemon.process.waitUntilExit()
        XCTAssertEqual(daemon.process.terminationStatus, 0)
    }

    func testUnitsPassSystemdAnalyzeVerify() throws {
        let prefix = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-prefix-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: prefix) }
        let runtime = prefix.appendingPathComponent("runtime")
        try FileManager.default.createDirectory(at: runtime, withIntermediateDirectories: true)
        try run("/usr/bin/make", ["-C", Self.root.path, "install", "PREFIX=\(prefix.path)", "SYSCONFDIR=\(prefix.path)/etc",
                                  "CONFIGURATION=\(Self.configuration)"])
        let unit = prefix.appendingPathComponent("lib/systemd/user/dragbrokerd.service").path
        // It also asks man for each page the unit's Documentation= names: the installed ones.
        let output = try run("/usr/bin/systemd-analyze", ["verify", "--user", unit],
                             environment: ["XDG_RUNTIME_DIR": runtime.path, "MANPATH": prefix.appendingPathComponent("share/man").path])
        XCTAssertEqual(output, "", "systemd-analyze has nothing to say about the unit")
        // The exit status for state on disk that cannot be used (DamagedStateTests) stops the
        // restarts, and a start limit stops any other loop.
        let properties = try String(contentsOfFile: unit, encoding: .utf8).split(separator: "\n").map(String.init)
        for property in ["RestartPreventExitStatus=65", "Restart=on-failure", "StartLimitIntervalSec=60", "StartLimitBurst=5"] {
            XCTAssertTrue(properties.contains(property), "the unit sets \(property)")
        }
        let activation = try String(contentsOfFile: prefix.appendingPathComponent("share/dbus-1/services/org.dragbroker.Broker1.service").path, encoding: .utf8)
        XCTAssertTrue(activation.contains("Exec=\(prefix.path)/libexec/dragbrokerd --exit-idle-time 300\n"), activation)
        XCTAssertTrue(activation.contains("SystemdService=dragbrokerd.service\n"))
    }

    func testInstallIntoADestdirProducesExactlyTheExpectedFilesAndUninstallRemovesThem() throws {
        let destdir = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-destdir-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: destdir) }
        try run("/usr/bin/make", ["-C", Self.root.path, "install", "DESTDIR=\(destdir.path)", "PREFIX=/usr", "CONFIGURATION=\(Self.configuration)"])
        // Where Debian's own daemons put theirs: the package (`make deb`) is this install.
        XCTAssertEqual(try files(under: destdir), [
            "/etc/dragbroker/dragbroker.conf",
            "/usr/bin/dragctl",
            "/usr/lib/systemd/catalog/dragbroker.catalog",
            "/usr/lib/systemd/user/dragbrokerd.service",
            "/usr/libexec/dragbrokerd",
            "/usr/share/bash-completion/completions/dragctl",
            "/usr/share/dbus-1/services/org.dragbroker.Broker1.service",
            "/usr/share/doc/dragbroker/README.md",
            "/usr/share/doc/dragbroker/examples/dragbroker.conf",
            "/usr/share/fish/vendor_completions.d/dragctl.fish",
            "/usr/share/man/man1/dragctl.1",
            "/usr/share/man/man5/dragbroker.conf.5",
            "/usr/share/man/man7/dragbroker.7",
            "/usr/share/man/man8/dragbrokerd.8",
            "/usr/share/zsh/vendor-completions/_dragctl",
        ])
        let unit = try String(contentsOfFile: destdir.path + "/usr/lib/systemd/user/dragbrokerd.service", encoding: .utf8)
        XCTAssertTrue(unit.contains("ExecStart=/usr/libexec/dragbrokerd --exit-idle-time 300\n"))
        let policy = destdir.path + "/etc/dragbroker/dragbroker.conf"
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: policy)),
                       try Data(contentsOf: Self.root.appendingPathComponent("policy/dragbroker.conf")))
        let manual = try String(contentsOfFile: destdir.path + "/usr/share/man/man1/dragctl.1", encoding: .utf8)
        XCTAssertTrue(manual.contains(".Dt DRAGCTL 1"), String(manual.prefix(300)))
        XCTAssertTrue(manual.contains("show-session"))
        let completion = try String(contentsOfFile: destdir.path + "/usr/share/bash-completion/completions/dragctl", encoding: .utf8)
        XCTAssertTrue(completion.contains("list-sessions"))
        // A second install keeps the administrator's edited policy.
        try "[Audit]\nRetentionDays=30\n".write(toFile: policy, atomically: false, encoding: .utf8)
        try run("/usr/bin/make", ["-C", Self.root.path, "install", "DESTDIR=\(destdir.path)", "PREFIX=/usr", "CONFIGURATION=\(Self.configuration)"])
        XCTAssertEqual(try String(contentsOfFile: policy, encoding: .utf8), "[Audit]\nRetentionDays=30\n")
        try run("/usr/bin/make", ["-C", Self.root.path, "uninstall", "DESTDIR=\(destdir.path)", "PREFIX=/usr"])
        XCTAssertEqual(try files(under: destdir), ["/etc/dragbroker/dragbroker.conf"])
    }

    /// A span too long to count in microseconds is a usage error, not an overflow trap.
    func testAnIdleTimeBeyondAYearIsAUsageError() throws {
        for flag in ["--exit-idle-time", "--retention-interval"] {
            for value in ["18446744073709551615", "31536001", "0", "-1"] {
                let child = try Child(executable: productsDirectory.appendingPathComponent("dragbrokerd"),
                                      arguments: [flag, value], environment: [:])
                XCTAssertEqual(child.stderr.take(timeout: 10) { _ in true },
                               "dragbrokerd: \(flag) needs a positive number of seconds up to 31536000 (a year), not '\(value)'")
                child.process.waitUntilExit()
                XCTAssertEqual(child.process.terminationStatus, 2, "\(flag) \(value)")
            }
        }
    }

    /// `dragctl --version`, `dragbrokerd --version`, the manager's `Version` and the package's
    /// newest changelog entry say one version.
    func testEveryVersionIsTheChangelogs() throws {
        let changelog = try String(contentsOf: Self.root.appendingPathComponent("debian/changelog"), encoding: .utf8)
        let firstLine = try XCTUnwrap(changelog.split(separator: "\n").first)
        XCTAssertTrue(firstLine.hasPrefix("dragbroker (\(BrokerVersion.current)) "), "debian/changelog begins \(firstLine)")
        for (binary, expected) in [("dragctl", BrokerVersion.current), ("dragbrokerd", "dragbrokerd \(BrokerVersion.current)")] {
            let child = try Child(executable: productsDirectory.appendingPathComponent(binary), arguments: ["--version"], environment: [:])
            XCTAssertEqual(child.stdout.take(timeout: 10) { _ in true }, expected)
            child.process.waitUntilExit()
            XCTAssertEqual(child.process.terminationStatus, 0)
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-version-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let bus = try PrivateBus()
        let daemon = try Daemon(bus: bus, stateDirectory: directory.appendingPathComponent("state"),
                                policyDirectory: directory.appendingPathComponent("policy"))
        let reply = try BusProbe(address: bus.address).call(BrokerNames.busName, BrokerNames.managerPath,
                                                           "org.freedesktop.DBus.Properties", "Get") { m throws(BusError) in
            try m.append("org.dragbroker.Broker1.Manager")
            try m.append("Version")
        }.get()
        _ = try reply.enterContainer("v", "s")
        XCTAssertEqual(try reply.readString(), BrokerVersion.current)
        withExtendedLifetime(daemon) {}
    }

    /// The tests install what `swift build` made for them.
    static var configuration: String { productsDirectory.lastPathComponent }

    @discardableResult
    func run(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws -> String {
        let child = try Child(executable: URL(fileURLWithPath: executable), arguments: arguments,
                              environment: ["PATH": "/usr/bin:/bin"].merging(environment) { $1 })
        child.process.waitUntilExit()
        let output = (child.stdout.all { _ in true } + child.stderr.all { _ in true }).joined(separator: "\n")
        guard child.process.terminationStatus == 0 else {
            throw HarnessError("\(executable) \(arguments.joined(separator: " ")) failed:\n\(output)")
        }
        return child.stderr.text
    }

    func files(under directory: URL) throws -> [String] {
        guard let walker = FileManager.default.enumerator(atPath: directory.path) else { return [] }
        var found: [String] = []
        while let path = walker.nextObject() as? String {
            var isDirectory: ObjCBool = false
            if FileManager.default.fileExists(atPath: directory.path + "/" + path, isDirectory: &isDirectory), !isDirectory.boolValue {
                found.append("/" + path)
            }
        }
        return found.sorted()
    }
}

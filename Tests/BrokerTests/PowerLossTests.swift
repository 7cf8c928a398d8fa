import Foundation
import TransferLog
import XCTest

/// The durability contract under real power cuts: LazyFS (the FUSE file system Jepsen uses)
/// keeps every write in a cache of its own until it is synced, and drops what is not on
/// command, as a power cut does. After a cut at most the last second of records may be lost,
/// after a clean stop none, and no session ID is ever handed out twice.
///
/// LazyFS is built from ../shared/tools/lazyfs into .build/lazyfs on first use; without
/// /dev/fuse (some containers) these tests skip, saying so.
final class PowerLossTests: XCTestCase, AuditDrags {
    /// One LazyFS mount over a real directory, with the daemon's state directory inside it.
    final class LazyMount {
        let directory: URL
        let root: URL
        let mountPoint: URL
        private let config: URL
        private let faults: URL
        private let completed: URL
        private var process: Child?

        init() throws {
            guard FileManager.default.fileExists(atPath: "/dev/fuse") else {
                throw XCTSkip("No /dev/fuse here, so LazyFS cannot mount: the power-loss tests skip")
            }
            guard geteuid() == 0 else { throw XCTSkip("Needs root, to mount LazyFS with allow_other") }
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-power-\(UUID().uuidString)")
            root = directory.appendingPathComponent("root")
            mountPoint = directory.appendingPathComponent("mnt")
            config = directory.appendingPathComponent("lazyfs.toml")
            faults = directory.appendingPathComponent("faults.fifo")
            completed = directory.appendingPathComponent("completed.fifo")
            for url in [root, mountPoint] { try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true) }
            for fifo in [faults, completed] { guard mkfifo(fifo.path, 0o600) == 0 else { throw HarnessError("mkfifo \(fifo.path): errno \(errno)") } }
            try """
                [faults]
                fifo_path="\(faults.path)"
                fifo_path_completed="\(completed.path)"
                [cache]
                apply_eviction=false
                [cache.simple]
                custom_size="1gb"
                blocks_per_page=1
                [filesystem]
                log_all_operations=false
                logfile="\(directory.appendingPathComponent("lazyfs.log").path)"
                """.write(to: config, atomically: true, encoding: .utf8)
            try mount()
        }

        static let binary: Result<String, HarnessError> = {
            let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            let script = repository.deletingLastPathComponent().appendingPathComponent("shared/tools/lazyfs/build")
            guard FileManager.default.isExecutableFile(atPath: script.path) else {
                return .failure(HarnessError("LazyFS's build script is missing at \(script.path)"))
            }
            let process = Process()
            process.executableURL = script
            process.arguments = [repository.appendingPathComponent(".build/lazyfs").path]
            // The compiler's warnings about LazyFS's own code belong to LazyFS: shown only if the
            // build fails.
            let output = Pipe()
            process.standardOutput = output
            process.standardError = output
            do { try process.run() } catch { return .failure(HarnessError("cannot run \(script.path): \(error)")) }
            let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            guard process.terminationStatus == 0, let path = text.split(separator: "\n").last.map(String.init),
                  FileManager.default.isExecutableFile(atPath: path) else {
                return .failure(HarnessError("building LazyFS failed (\(process.terminationStatus)): \(text)"))
            }
            return .success(path)
        }()

        func mount() throws {
            let binary = try Self.binary.get()
            process = try Child(executable: URL(fileURLWithPath: binary),
                                arguments: [mountPoint.path, "--config-path", config.path, "-o", "allow_other", "-o", "modules=subdir",
                                            "-o", "subdir=\(root.path)", "-f"],
                                environment: ["PATH": "/usr/bin:/bin"])
            let deadline = Date().addingTimeInterval(20)
            while Date() < deadline {
                if let mounts = try? String(contentsOfFile: "/proc/mounts", encoding: .utf8), mounts.contains(" \(mountPoint.path) ") { return }
                usleep(20_000)
            }
            throw HarnessError("LazyFS did not mount \(mountPoint.path): \(process?.stderr.text ?? "")")
        }

        /// The power goes: every write not yet synced is dropped, and the file system goes away.
        /// Processes with files open on it must be dead first, as the power would take them.
        func cut() throws {
            let writer = try FileHandle(forWritingTo: faults)
            try writer.write(contentsOf: Data("lazyfs::clear-cache\n".utf8))
            try writer.close()
            let reader = try FileHandle(forReadingFrom: completed)
            var said = ""
            while !said.contains("finished") {
                let data = reader.availableData
                if data.isEmpty { break }
                said += String(decoding: data, as: UTF8.self)
            }
            try reader.close()
            guard said.contains("finished") else { throw HarnessError("LazyFS never finished clearing its cache: \(said)") }
            process?.kill(SIGKILL)
            process = nil
            try AuditWorld.run("/bin/umount", "-l", mountPoint.path)
        }

        deinit {
            process?.kill(SIGKILL)
            try? AuditWorld.run("/bin/umount", "-l", mountPoint.path)
            try? FileManager.default.removeItem(at: directory)
        }
    }

    /// A bus, a daemon whose state directory is on LazyFS, and a source and destination.
    final class PowerWorld {
        let mount: LazyMount
        let bus: PrivateBus
        let policyDirectory: URL
        var stateDirectory: URL { mount.mountPoint.appendingPathComponent("state") }
        private(set) var daemon: Daemon
        private(set) var source: Peer
        private(set) var destination: Peer

        init() throws {
            mount = try LazyMount()
            policyDirectory = mount.directory.appendingPathComponent("policy")
            try FileManager.default.createDirectory(at: policyDirectory.appendingPathComponent("dragbroker.conf.d"), withIntermediateDirectories: true)
            bus = try PrivateBus()
            daemon = try Daemon(bus: bus, stateDirectory: mount.mountPoint.appendingPathComponent("state"), policyDirectory: policyDirectory)
            source = try Peer(app: "source-app", in: mount.directory, bus: bus)
            destination = try Peer(app: "destination-app", in: mount.directory, bus: bus)
        }

        /// The machine comes back: LazyFS remounted on what was synced, a new daemon on it.
        func restart() throws {
            try mount.mount()
            daemon = try Daemon(bus: bus, stateDirectory: stateDirectory, policyDirectory: policyDirectory)
            source = try Peer(app: "source-app-2", in: mount.directory, bus: bus)
            destination = try Peer(app: "destination-app-2", in: mount.directory, bus: bus)
        }

        func log() throws -> TransferLog {
            try TransferLog.openReadOnly(path: daemon.transferLogPath)
        }

        deinit { daemon.terminate() }
    }

    static func number(_ id: String) -> Int { Int(id.dropFirst())! }

    /// `count` whole drags, their session IDs in order.
    func drags(_ count: Int, in world: PowerWorld, tag: String) throws -> [String] {
        try (0..<count).map { index in
            let id = try drop("\(tag)-\(index)", from: world.source, on: world.destination)
            XCTAssertEqual(world.destination.run("load 0 text/plain"), loaded("\(tag)-\(index)"))
            XCTAssertEqual(world.destination.run("conclude"), "OK")
            return id
        }
    }

    /// After the cut, the next daemon numbers past every ID handed out before it.
    func assertNoIDComesBack(after handedOut: [String], in world: PowerWorld, file: StaticString = #filePath, line: UInt = #line) throws {
        let next = try drop("after the cut", from: world.source, on: world.destination)
        XCTAssertGreaterThan(Self.number(next), handedOut.map(Self.number).max() ?? 0, "\(next) was handed out before", file: file, line: line)
        let sessions = try world.daemon.waitForLog { log -> [SessionRecord]? in
            let sessions = try log.sessions(limit: 10_000, includingOpen: true)
            return sessions.contains { $0.sessionID == next } ? sessions : nil
        }
        XCTAssertEqual(Set(sessions.map(\.sessionID)).count, sessions.count, "no ID twice in the log", file: file, line: line)
    }

    /// A clean stop syncs everything: a cut right after it loses nothing, and numbering goes on
    /// from the last ID (the reservation was brought back to it).
    func testACutAfterACleanStopLosesNothing() throws {
        let world = try PowerWorld()
        let ids = try drags(20, in: world, tag: "clean")
        world.daemon.kill(SIGTERM)
        try world.mount.cut()
        try world.restart()
        let log = try world.log()
        XCTAssertEqual(Set(try log.sessions(limit: 1_000).map(\.sessionID)), Set(ids))
        XCTAssertEqual(try log.loads(limit: 1_000).filter { $0.outcome == "completed" }.count, 20)
        XCTAssertEqual(try drop("next", from: world.source, on: world.destination), "s21")
        XCTAssertEqual(try integrityCheck(world.daemon), ["ok"])
    }

    /// Records a second old are synced by the group commit: a cut 50 ms after a second batch
    /// loses at most that batch, and says how many sessions it lost.
    func testACut50msAfterABatchLosesAtMostTheLastSecond() throws {
        let world = try PowerWorld()
        let older = try drags(15, in: world, tag: "older")
        Thread.sleep(forTimeInterval: 1.5)
        let newer = try drags(15, in: world, tag: "newer")
        usleep(50_000)
        world.daemon.kill(SIGKILL)
        try world.mount.cut()
        try world.restart()
        let kept = Set(try world.log().sessions(limit: 1_000).filter { $0.outcome == "completed" }.map(\.sessionID))
        XCTAssertTrue(kept.isSuperset(of: older), "lost from more than a second before the cut: \(Set(older).subtracting(kept).sorted())")
        // What the daemon counts as lost is what the log and the ledger's last synced number
        // disagree on: never more than was lost, and at least the sessions handed out before
        // the ledger's last sync.
        let lost = Set(newer).subtracting(kept)
        let said = world.daemon.stderr.all { $0.contains("The transfer log has no record of") }
        if let line = said.first, let range = line.range(of: #"no record of (\d+) session"#, options: .regularExpression) {
            let count = Int(line[range].split(separator: " ")[3])!
            XCTAssertLessThanOrEqual(count, lost.count, line)
        }
        try assertNoIDComesBack(after: older + newer, in: world)
        XCTAssertEqual(try integrityCheck(world.daemon), ["ok"])
    }

    /// Loads running when the power goes: what was synced of them is on record, none of the
    /// drags finished a second before is lost, and no ID comes back.
    func testACutDuringLoadsKeepsEverythingButTheLastSecond() throws {
        let world = try PowerWorld()
        let finished = try drags(10, in: world, tag: "finished")
        Thread.sleep(forTimeInterval: 1.5)
        // Three loads stalled mid-way, each between a source and a destination of its own.
        var running: [(source: Peer, destination: Peer)] = []
        for index in 0..<3 {
            running.append(try FaultTests.loadInFlight { try Peer(app: "\($0)-\(index)", in: world.mount.directory, bus: world.bus) })
        }
        let runningIDs = (1...3).map { "s\(finished.count + $0)" }
        usleep(300_000)
        world.daemon.kill(SIGKILL)
        try world.mount.cut()
        try world.restart()
        let kept = Set(try world.log().sessions(limit: 1_000).map(\.sessionID))
        XCTAssertTrue(kept.isSuperset(of: finished), "lost from more than a second before the cut: \(Set(finished).subtracting(kept).sorted())")
        try assertNoIDComesBack(after: finished + runningIDs, in: world)
        withExtendedLifetime(running) {}
        XCTAssertEqual(try integrityCheck(world.daemon), ["ok"])
    }

    /// Idle for 35 s, then the power goes: every record was synced long before.
    func testACutAfter35sIdleLosesNothing() throws {
        let world = try PowerWorld()
        let ids = try drags(20, in: world, tag: "idle")
        Thread.sleep(forTimeInterval: 35)
        world.daemon.kill(SIGKILL)
        try world.mount.cut()
        try world.restart()
        let log = try world.log()
        XCTAssertEqual(Set(try log.sessions(limit: 1_000).filter { $0.outcome == "completed" }.map(\.sessionID)), Set(ids))
        XCTAssertEqual(try log.loads(limit: 1_000).filter { $0.outcome == "completed" }.count, 20)
        try assertNoIDComesBack(after: ids, in: world)
        XCTAssertEqual(try integrityCheck(world.daemon), ["ok"])
    }
}

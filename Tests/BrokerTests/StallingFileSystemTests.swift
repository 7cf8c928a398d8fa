import BrokerClient
import BrokerProtocol
import Foundation
import XCTest

/// A source hands over a file on a FUSE file system that stalls on command (Tests/fuse/stallfs.c)
/// for the daemon alone: whatever call stalls, the bus loop is never in it. That one load ends
/// with `Timeout`, other apps are served meanwhile, and the threads stuck in the file system
/// are bounded per app and counted in `dragctl stats`.
final class StallingFileSystemTests: XCTestCase {
    private static let content = "bytes on a FUSE mount"

    /// One stallfs mount serving `file` with `content`, for one test.
    final class StallFS {
        let mountPoint: URL
        let control: URL
        private let server: Child

        var file: String { mountPoint.appendingPathComponent("file").path }

        init(in directory: URL) throws {
            guard geteuid() == 0 else { throw XCTSkip("Needs root, to mount a FUSE file system with allow_other") }
            guard FileManager.default.fileExists(atPath: "/dev/fuse") else { throw XCTSkip("Needs /dev/fuse") }
            let binary = try Self.built()
            let backing = directory.appendingPathComponent("fuse-backing")
            mountPoint = directory.appendingPathComponent("fuse-mount")
            control = directory.appendingPathComponent("fuse-control")
            for dir in [backing, mountPoint] { try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true) }
            try Data(StallingFileSystemTests.content.utf8).write(to: backing.appendingPathComponent("file"))
            server = try Child(executable: binary, arguments: [backing.path, control.path, mountPoint.path, "-o", "allow_other"],
                               environment: ["PATH": "/usr/bin:/bin"])
            for _ in 0..<500 where !FileManager.default.fileExists(atPath: file) { usleep(10_000) }
            guard FileManager.default.fileExists(atPath: file) else { throw HarnessError("stallfs did not mount: \(server.stderr.text)") }
        }

        /// Stalls `operations` of process `pid` alone, until `release()`.
        func stall(_ operations: [String], pid: pid_t) throws {
            try write("stall \(operations.joined(separator: " "))\npid \(pid)\n")
        }

        func release() throws { try write("") }

        private func write(_ text: String) throws {
            let temporary = control.appendingPathExtension("new")
            try Data(text.utf8).write(to: temporary)
            guard rename(temporary.path, control.path) == 0 else { throw HarnessError("rename failed: errno \(errno)") }
        }

        /// The requests stalled now, as `OP PID` lines.
        var stalled: [String] {
            ((try? String(contentsOf: control.appendingPathExtension("stalled"), encoding: .utf8)) ?? "")
                .split(separator: "\n").map(String.init)
        }

        func waitUntilStalled(_ line: String) -> Bool {
            for _ in 0..<1000 where !stalled.contains(line) { usleep(10_000) }
            return stalled.contains(line)
        }

        deinit {
            try? release()
            server.terminate()
            let unmount = Process()
            unmount.executableURL = URL(fileURLWithPath: "/bin/umount")
            unmount.arguments = ["-l", mountPoint.path]
            try? unmount.run()
            unmount.waitUntilExit()
        }

        private static let build = Result { () throws -> URL in
            let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("fuse/stallfs.c")
            let output = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-stallfs-\(getpid())")
            let gcc = Process()
            gcc.executableURL = URL(fileURLWithPath: "/bin/sh")
            gcc.arguments = ["-c", "gcc -Wall -Wextra -O2 -o \"$1\" \"$2\" $(pkg-config --cflags --libs fuse3) -lpthread", "sh",
                             output.path, source.path]
            try gcc.run()
            gcc.waitUntilExit()
            guard gcc.terminationStatus == 0 else { throw HarnessError("building stallfs failed (is libfuse3-dev installed?)") }
            return output
        }

        static func built() throws -> URL { try build.get() }
    }

    private func dropped(_ reps: String, source: Peer, destination: Peer) throws {
        let (token, path) = try source.begin(#"{"items":[{"name":"x","reps":[\#(reps)]}]}"#)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
    }

    private let hello = "OK 5 \(Data("hello".utf8).base64EncodedString())"

    /// Each call that can block, stalled for the daemon alone: the load ends with `Timeout`
    /// while another app's drag completes and WhoAmI is answered, and once the file system
    /// answers again the stuck thread lets go and every descriptor is closed.
    func testEachCallThatCanBlockEndsOnlyItsLoad() throws {
        for operation in ["getattr", "open", "flush"] {
            let world = try World { _ in "[Limits]\nFirstByteTimeoutSec=2\n" }
            let fuse = try StallFS(in: world.directory)
            let daemon = world.daemon.process.processIdentifier
            let source = try world.peer("source-app"), destination = try world.peer("destination-app")
            let other = try world.peer("other-source"), otherDestination = try world.peer("other-destination")
            try dropped(#"{"type":"text/plain","kind":"file","file":"path:\#(fuse.file)"}"#, source: source, destination: destination)
            let baseline = try descriptors(of: daemon)
            try fuse.stall([operation], pid: daemon)

            destination.send("loadfile 0 text/plain")
            XCTAssertTrue(fuse.waitUntilStalled("\(operation) \(daemon)"), "\(operation): the daemon reached the stalled call")
            // The loop is free: another app drags and loads, and is told who it is.
            try dropped(#"{"type":"text/plain","text":"hello"}"#, source: other, destination: otherDestination)
            XCTAssertEqual(otherDestination.run("load 0 text/plain"), hello, operation)
            XCTAssertTrue(otherDestination.run("whoami").hasPrefix("OK "), operation)
            XCTAssertEqual(fuse.stalled, ["\(operation) \(daemon)"], "\(operation): still stalled while the others were served")

            let answer = destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") }
            XCTAssertEqual(answer, err(.timeout, "The source produced nothing within 2 s (first-byte deadline)"), operation)
            let stats = try dragctl(world, ["stats", "--state-directory", world.daemon.stateDirectory.path])
            let live = stats.drop { !$0.hasPrefix("NOW ") }
            let row = live.first { $0.hasPrefix(world.paths.app("source-app") + " ") }?.split(separator: " ").map(String.init)
            XCTAssertEqual(row.map { Array($0.dropFirst().prefix(3)) }, ["1", "0", "1"], "\(operation): the stuck thread is counted: \(stats)")

            try fuse.release()
            var now = try descriptors(of: daemon)
            for _ in 0..<100 where now != baseline {
                usleep(50_000)
                now = try descriptors(of: daemon)
            }
            XCTAssertEqual(now, baseline, "\(operation): every descriptor of the handover is closed once the file system answers")
        }
    }

    /// The daemon never reads a handed-over file itself: with its reads stalled the load is served.
    func testTheDaemonNeverReadsTheFile() throws {
        let world = try World()
        let fuse = try StallFS(in: world.directory)
        let source = try world.peer("source-app"), destination = try world.peer("destination-app")
        try dropped(#"{"type":"text/plain","kind":"file","file":"path:\#(fuse.file)"}"#, source: source, destination: destination)
        try fuse.stall(["read"], pid: world.daemon.process.processIdentifier)
        XCTAssertEqual(destination.run("loadfile 0 text/plain"),
                       "OK \(Self.content.utf8.count) readonly \(Data(Self.content.utf8).base64EncodedString())")
    }

    /// Past `DescriptorThreadsPerApp=` stuck threads, that app's file loads are refused at once;
    /// a sandboxed app's files and every app's data still move; once the file system answers,
    /// the app's files move again.
    func testStuckThreadsAreBoundedPerApp() throws {
        let world = try World { _ in "[Limits]\nFirstByteTimeoutSec=1\nDescriptorThreadsPerApp=2\n" }
        let fuse = try StallFS(in: world.directory)
        let daemon = world.daemon.process.processIdentifier
        let source = try world.peer("source-app"), destination = try world.peer("destination-app")
        try dropped(#"{"type":"text/plain","kind":"file","file":"path:\#(fuse.file)"},{"type":"text/html","text":"hello"}"#,
                    source: source, destination: destination)
        try fuse.stall(["getattr"], pid: daemon)
        let timedOut = err(.timeout, "The source produced nothing within 1 s (first-byte deadline)")
        XCTAssertEqual(destination.run("loadfile 0 text/plain"), timedOut)
        XCTAssertEqual(destination.run("loadfile 0 text/plain"), timedOut)
        XCTAssertEqual(destination.run("loadfile 0 text/plain"), err(.limitExceeded,
            "\(world.paths.app("source-app")) has 2 descriptor threads busy, the limit (DescriptorThreadsPerApp=2): "
            + "a file system its files live on is not answering, so the handover of a file from it is refused"))
        XCTAssertEqual(destination.run("load 0 text/html"), hello, "data needs no descriptor thread")

        let sandboxedSource = try world.peer("sandboxed-source", sandbox: .flatpak(appID: "org.example.Source"))
        let sandboxed = try world.peer("sandboxed-destination", sandbox: .flatpak(appID: "org.example.Viewer"))
        try dropped(#"{"type":"image/png","kind":"file","file":"memfd","text":"sealed"}"#, source: sandboxedSource, destination: sandboxed)
        XCTAssertEqual(sandboxed.run("loadfile 0 image/png"), "OK 6 readonly \(Data("sealed".utf8).base64EncodedString())")

        try fuse.release()
        var answer = ""
        for _ in 0..<100 {
            answer = destination.run("loadfile 0 text/plain")
            if answer.hasPrefix("OK") { break }
            usleep(50_000)
        }
        XCTAssertEqual(answer, "OK \(Self.content.utf8.count) readonly \(Data(Self.content.utf8).base64EncodedString())")
    }

    /// Past `DescriptorThreadsTotal=` stuck threads, every app's file loads that need a thread
    /// are refused; a file in memory needs none and still moves.
    func testStuckThreadsAreBoundedInTotal() throws {
        let world = try World { _ in "[Limits]\nFirstByteTimeoutSec=1\nDescriptorThreadsTotal=1\n" }
        let fuse = try StallFS(in: world.directory)
        let source = try world.peer("source-app"), destination = try world.peer("destination-app")
        try dropped(#"{"type":"text/plain","kind":"file","file":"path:\#(fuse.file)"}"#, source: source, destination: destination)
        try fuse.stall(["getattr"], pid: world.daemon.process.processIdentifier)
        XCTAssertEqual(destination.run("loadfile 0 text/plain"), err(.timeout, "The source produced nothing within 1 s (first-byte deadline)"))

        let sandboxedSource = try world.peer("sandboxed-source", sandbox: .flatpak(appID: "org.example.Source"))
        let sandboxed = try world.peer("sandboxed-destination", sandbox: .flatpak(appID: "org.example.Viewer"))
        try dropped(#"{"type":"text/plain","kind":"file","file":"readonly","text":"on disk"},{"type":"image/png","kind":"file","file":"memfd","text":"sealed"}"#,
                    source: sandboxedSource, destination: sandboxed)
        XCTAssertEqual(sandboxed.run("loadfile 0 text/plain"), err(.limitExceeded,
            "dragbrokerd has 1 descriptor threads busy, its limit (DescriptorThreadsTotal=1), so the handover of a file from it is refused"))
        XCTAssertEqual(sandboxed.run("loadfile 0 image/png"), "OK 6 readonly \(Data("sealed".utf8).base64EncodedString())")
    }

    private func descriptors(of pid: pid_t) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").map { fd in
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(fd)")) ?? "?"
        }.sorted()
    }

    /// dragctl's output lines, run against the world's bus.
    private func dragctl(_ world: World, _ arguments: [String]) throws -> [String] {
        let child = try Child(executable: productsDirectory.appendingPathComponent("dragctl"), arguments: arguments + ["--no-pager"],
                              environment: ["DRAGBROKER_BUS_ADDRESS": world.bus.address, "PATH": "/usr/bin:/bin"])
        child.process.waitUntilExit()
        _ = child.stdout.take(timeout: 5) { _ in false }
        return child.stdout.text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    }
}

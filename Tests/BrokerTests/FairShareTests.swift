import BrokerProtocol
import Foundation
import TransferLog
import XCTest

/// No app takes what other apps need: sessions and loads are bounded per app (over all its
/// connections, so reconnecting resets nothing), per user for unsandboxed apps (which can
/// take any ID they like), and in total by the descriptors the daemon has; refusals are
/// recorded at a bounded rate.
final class FairShareTests: XCTestCase {
    private let silent = #"{"type":"application/x-silent","stall":true}"#

    /// A drop of one item, by `destination`, of `source`'s new session.
    private func dropped(_ reps: String, source: Peer, destination: Peer) throws {
        let (token, path) = try source.begin(#"{"items":[{"name":"x","reps":[\#(reps)]}]}"#)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
    }

    /// `count` loads of a source that never answers, held in flight by `destination`.
    private func holdLoads(_ count: Int, source: Peer, destination: Peer) throws {
        let before = source.handlerCalls.count
        try dropped(silent, source: source, destination: destination)
        XCTAssertEqual(destination.run("spawnloads \(count) 0 application/x-silent"), "OK \(count)")
        for _ in 0..<400 where source.handlerCalls.count < before + count { usleep(10_000) }
        XCTAssertEqual(source.handlerCalls.count, before + count, "every load reached the source")
    }

    private func hello(from source: Peer, to destination: Peer) throws -> String {
        try dropped(#"{"type":"text/plain","text":"hello"}"#, source: source, destination: destination)
        return destination.run("load 0 text/plain")
    }

    private let helloLoaded = "OK 5 \(Data("hello".utf8).base64EncodedString())"

    func testLoadsAreBoundedPerAppAndPerUserNotPerConnection() throws {
        let world = try World { _ in "[Limits]\nLoadsPerApp=4\nLoadsPerUser=6\n" }
        let hostile = world.paths.app("hostile")
        let source = try world.peer("hostile"), destination = try world.peer("hostile")
        try holdLoads(4, source: source, destination: destination)
        let appFull = err(.limitExceeded, "\(hostile) has 4 loads in flight, its limit (LoadsPerApp=4)")
        XCTAssertEqual(destination.run("load 0 application/x-silent"), appFull)
        // A new connection of the same app starts from the same count.
        let again = try world.peer("hostile")
        try dropped(silent, source: source, destination: again)
        XCTAssertEqual(again.run("load 0 application/x-silent"), appFull)

        // Another app of the same user is served, exactly.
        let victimSource = try world.peer("victim-source"), victim = try world.peer("victim-destination")
        XCTAssertEqual(try hello(from: victimSource, to: victim), helloLoaded)

        // An unsandboxed app can be any app it likes: copies of it share the user's bucket.
        let copy = try world.peer("hostile-copy"), copyDestination = try world.peer("hostile-copy")
        try holdLoads(2, source: copy, destination: copyDestination)
        let userFull = err(.limitExceeded, "The unsandboxed apps of uid \(getuid()) have 6 loads in flight, their limit (LoadsPerUser=6)")
        XCTAssertEqual(copyDestination.run("load 0 application/x-silent"), userFull)
        XCTAssertEqual(victim.run("load 0 text/plain"), userFull, "the same user's unsandboxed apps share that bucket")

        // A sandboxed app has its own bucket: it is served while the user's is full.
        let sandboxedSource = try world.peer("sandboxed-source", sandbox: .flatpak(appID: "org.example.Source"))
        let sandboxed = try world.peer("sandboxed-destination", sandbox: .flatpak(appID: "org.example.Viewer"))
        XCTAssertEqual(try hello(from: sandboxedSource, to: sandboxed), helloLoaded)

        // The hostile app goes: what it held is given back.
        for peer in [source, destination, again, copy, copyDestination] { peer.kill() }
        var answer = ""
        for _ in 0..<100 {
            answer = victim.run("load 0 text/plain")
            if answer == helloLoaded { break }
            usleep(50_000)
        }
        XCTAssertEqual(answer, helloLoaded)
        let refused = try world.daemon.waitForLog { log -> [RefusalRecord]? in
            let rows = try log.refusals().filter { $0.errorName == BrokerErrorCode.limitExceeded.busName }
            return rows.count >= 4 ? rows : nil
        }
        XCTAssertEqual(Set(refused.map(\.message)), [String(appFull.dropFirst(err(.limitExceeded, "").count)),
                                                       String(userFull.dropFirst(err(.limitExceeded, "").count))])
    }

    func testSessionsAreBoundedPerAppAndPerUserNotPerConnection() throws {
        let world = try World { _ in "[Limits]\nSessionsPerApp=3\nSessionsPerUser=5\n" }
        let hostile = world.paths.app("hostile")
        let first = try world.peer("hostile"), second = try world.peer("hostile")
        let spec = #"{"items":[{"name":"x","reps":[{"type":"text/plain","text":"t"}]}]}"#
        for peer in [first, first, second] { _ = try peer.begin(spec) }
        let appFull = err(.limitExceeded, "\(hostile) has 3 live sessions, its limit (SessionsPerApp=3)")
        XCTAssertEqual(second.run("begin " + spec), appFull)
        XCTAssertEqual(try world.peer("hostile").run("begin " + spec), appFull, "a new connection starts from the same count")

        let copy = try world.peer("hostile-copy")
        for _ in 0..<2 { _ = try copy.begin(spec) }
        XCTAssertEqual(copy.run("begin " + spec),
                       err(.limitExceeded, "The unsandboxed apps of uid \(getuid()) have 5 live sessions, their limit (SessionsPerUser=5)"))
        let sandboxed = try world.peer("sandboxed", sandbox: .flatpak(appID: "org.example.Sandboxed"))
        XCTAssertNoThrow(try sandboxed.begin(spec))
    }

    /// `LoadsTotal=` bounds every app's loads together; `GetUsage` counts them, for administrators only.
    func testLoadsTotalBoundsEveryAppAndUsageCountsThem() throws {
        let world = try World { _ in "[Limits]\nLoadsTotal=3\n" }
        let source = try world.peer("hostile"), destination = try world.peer("hostile")
        try holdLoads(3, source: source, destination: destination)
        let other = try world.peer("other-destination")
        try dropped(silent, source: source, destination: other)
        XCTAssertEqual(other.run("load 0 application/x-silent"),
                       err(.limitExceeded, "dragbrokerd has 3 loads in flight, its limit (LoadsTotal=3)"))
        XCTAssertEqual(other.run("usage"), "OK 2 3 0")
        let sandboxed = try world.peer("sandboxed", sandbox: .flatpak(appID: "org.example.Sandboxed"))
        XCTAssertEqual(sandboxed.run("usage"), err(.accessDenied,
            "Only root or the user dragbrokerd runs as may read what every app holds, from outside any sandbox"))
    }

    /// Started with a soft descriptor limit below its hard one, the daemon raises it; all loads
    /// together are bounded by what its limit allows, less a reserve to answer, record and refuse.
    func testTheDescriptorLimitIsRaisedAndBoundsEveryLoad() throws {
        let raised = try World(daemonLauncher: ["/usr/bin/prlimit", "--nofile=256:4096", "--"])
        let limits = try String(contentsOfFile: "/proc/\(raised.daemon.process.processIdentifier)/limits", encoding: .utf8)
        let line = limits.split(separator: "\n").first { $0.hasPrefix("Max open files") }.map { $0.split(separator: " ", omittingEmptySubsequences: true) }
        XCTAssertEqual(line.map { Array($0.suffix(3)) }, ["4096", "4096", "files"])

        // 300 descriptors, less a reserve of 128 + 2 × DescriptorThreadsTotal (32): 54 loads.
        let world = try World(policy: { _ in "[Limits]\nConcurrentLoadsPerSession=100\nLoadsPerApp=1000\nLoadsPerUser=1000\n" },
                              daemonLauncher: ["/usr/bin/prlimit", "--nofile=300:300", "--"])
        // The client library reads each load on a dispatch thread: 9 loads a process keeps its pool free.
        let source = try world.peer("hostile")
        let destinations = try (0..<6).map { _ in try world.peer("hostile") }
        for destination in destinations { try holdLoads(9, source: source, destination: destination) }
        XCTAssertEqual(destinations[0].run("load 0 application/x-silent"), err(.limitExceeded,
            "dragbrokerd has 54 loads in flight, all that its limit of 300 descriptors allows (LimitNOFILE=, less a reserve of 192)"))
        // The daemon still answers and records.
        let other = try world.peer("other")
        XCTAssertTrue(other.run("whoami").hasPrefix("OK "))
        XCTAssertNoThrow(try other.begin(#"{"items":[{"name":"x","reps":[{"type":"text/plain","text":"t"}]}]}"#))
        let open = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(world.daemon.process.processIdentifier)/fd").count
        XCTAssertLessThan(open, 300 - 64, "the reserve is still free")
        _ = try world.daemon.waitForLog { log in try log.refusals().first { $0.errorName == BrokerErrorCode.limitExceeded.busName } }
    }

    /// Past the burst, refusals of one app are counted, not written, from however many
    /// connections; one row per bucket says how many once the interval is over. They are also
    /// answered late, while other apps are answered at once.
    func testRefusalsAreRecordedAtABoundedRate() throws {
        let world = try World { _ in "[Limits]\nRefusalRateLimitIntervalSec=4\nRefusalRateLimitBurst=5\nRefusalDelayMsec=1\n" }
        let flooder = world.paths.app("flooder")
        let notFound = err(.notFound, "No live session has this token")
        // 4 connections of one app, 10 refused calls each: 40 refusals.
        for _ in 0..<4 {
            let peer = try world.peer("flooder")
            for _ in 0..<10 { XCTAssertEqual(peer.run("present 00"), notFound) }
            peer.kill()
        }
        // A refusal past the burst waits RefusalDelayMsec=; another app's call meanwhile does not.
        try "[Limits]\nRefusalRateLimitIntervalSec=4\nRefusalRateLimitBurst=5\nRefusalDelayMsec=60000\n"
            .write(to: world.paths.policyFile, atomically: true, encoding: .utf8)
        let other = try world.peer("other")
        XCTAssertEqual(other.run("reload"), "OK")
        let late = try world.peer("flooder")
        late.send("present 00")
        XCTAssertTrue(other.run("whoami").hasPrefix("OK "))
        XCTAssertNil(late.stdout.take(timeout: 1) { $0.hasPrefix("OK") || $0.hasPrefix("ERR") }, "the flooder's refusal waits")
        late.kill()
        let rows = try world.daemon.waitForLog { log -> [RefusalRecord]? in
            let rows = try log.refusals(limit: 1000)
            return rows.count >= 7 ? rows : nil
        }
        let written = rows.filter { $0.action == "PresentToken" }
        XCTAssertEqual(written.count, 5, "the burst is written one by one")
        XCTAssertEqual(Set(written.map(\.app)), [flooder])
        let summaries = rows.filter { $0.action == "RateLimited" }.map { "\($0.app) | \($0.errorName) | \($0.message)" }.sorted()
        XCTAssertEqual(summaries, [
            "\(flooder) | \(BrokerErrorCode.limitExceeded.busName) | Suppressed 36 refusals of \(flooder) past the first 5 in 4 s (RefusalRateLimitBurst=5 per RefusalRateLimitIntervalSec=4)",
            "the unsandboxed apps of uid \(getuid()) | \(BrokerErrorCode.limitExceeded.busName) | Suppressed 36 refusals of the unsandboxed apps of uid \(getuid()) past the first 5 in 4 s (RefusalRateLimitBurst=5 per RefusalRateLimitIntervalSec=4)",
        ])
        XCTAssertEqual(rows.count, 7, "5 refusals and one summary per bucket, for 41 refused calls")
    }
}

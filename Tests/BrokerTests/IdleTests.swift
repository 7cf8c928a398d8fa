import Foundation
import XCTest

/// An idle daemon sleeps: no timer, no polling. Counted, not timed: the kernel's count of
/// voluntary context switches of every daemon thread does not move while nothing happens.
final class IdleTests: XCTestCase {
    /// Voluntary context switches per thread.
    func wakeups(_ pid: pid_t) throws -> [String: Int] {
        var counts: [String: Int] = [:]
        for task in try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") {
            guard let status = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8) else { continue }
            let line = status.split(separator: "\n").first { $0.hasPrefix("voluntary_ctxt_switches:") } ?? ""
            counts[task] = Int(line.split(separator: "\t").last ?? "") ?? 0
        }
        return counts
    }

    /// Waits until the set of threads has been stable for a second: a dispatch worker that
    /// retires after a drag wakes once to exit, which is no periodic wakeup.
    func settle(_ pid: pid_t) throws {
        var threads = Set(try wakeups(pid).keys)
        var stableSince = Date()
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            usleep(200_000)
            let now = Set(try wakeups(pid).keys)
            if now != threads {
                threads = now
                stableSince = Date()
            } else if Date().timeIntervalSince(stableSince) >= 1 {
                return
            }
        }
    }

    func testTheIdleDaemonDoesNotWakeUp() throws {
        let world = try World()
        let pid = world.daemon.process.processIdentifier
        // Once after start, and once after a drag, which brings the log's writer to life.
        for round in 0..<2 {
            if round == 1 {
                let source = try world.peer("source-app")
                let destination = try world.peer("destination-app")
                let (token, _) = try source.begin(EndToEndTests.helloDrag)
                _ = destination.run("present \(token)")
                _ = destination.run("enter copy")
                _ = destination.run("drop")
                XCTAssertTrue(destination.run("load 0 text/plain").hasPrefix("OK 11 "))
                _ = destination.run("conclude")
                _ = try world.daemon.waitForLog { try $0.sessions().first }
                source.terminate()
                destination.terminate()
            }
            try settle(pid)
            let before = try wakeups(pid)
            usleep(3_000_000)
            let after = try wakeups(pid)
            // Threads present in both samples: none of them may have woken.
            let woken = before.filter { tid, count in after[tid].map { $0 != count } ?? false }
            XCTAssertEqual(woken, [:], "daemon threads woke while idle (round \(round)): \(woken) → \(after)")
        }
    }
}

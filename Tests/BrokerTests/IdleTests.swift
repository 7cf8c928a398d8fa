import Foundation
import XCTest

/// An idle daemon sleeps: no timer, no polling. Counted, not timed: the kernel's count of
/// voluntary context switches of every daemon thread does not move while nothing happens.
final class IdleTests: XCTestCase {
    func wakeups(_ pid: pid_t) throws -> Int {
        try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task").reduce(0) { total, task in
            let status = try String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)
            let line = status.split(separator: "\n").first { $0.hasPrefix("voluntary_ctxt_switches:") } ?? ""
            return total + (Int(line.split(separator: "\t").last ?? "") ?? 0)
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
            usleep(1_000_000)  // let the last work settle
            let before = try wakeups(pid)
            usleep(3_000_000)
            XCTAssertEqual(try wakeups(pid), before, "the daemon woke up while idle (round \(round))")
        }
    }
}

import Foundation
import XCTest

/// `make bench` is a release build that takes minutes, so nothing else would notice it break:
/// here it runs every section on the debug build at sizes and counts far too small to measure
/// (`DRAGBROKER_BENCH_SMOKE=1`), and must end cleanly with every key the README's Performance
/// section quotes.
final class BenchTests: XCTestCase {
    /// Every key the bench prints, in the order it prints them.
    static let keys = [
        "pipe_ratio_256m", "pipe_ratio",
        "file_handover_vs_echo", "file_handover_held_vs_echo",
        "first_byte_vs_echo_p50", "first_byte_held_vs_echo_p50", "fail_closed_first_byte_vs_echo_p50",
        "fail_closed_drags_per_second", "default_drags_per_second",
        "paste_first_byte_vs_echo_p50", "paste_call_first_byte_vs_echo_p50",
        "update_vs_echo_p50",
        "client_update_vs_c", "client_update_from_task_vs_c", "client_update_vs_c_loop", "client_update_cpu_vs_c_loop",
        "client_first_byte_vs_c", "client_first_byte_from_task_vs_c", "client_first_byte_vs_c_loop", "client_first_byte_cpu_vs_c_loop",
        "client_handover_vs_c", "client_handover_from_task_vs_c", "client_handover_vs_c_loop", "client_handover_cpu_vs_c_loop",
        "concurrent_4_vs_pipes", "concurrent_4_vs_spliced_pipes", "concurrent_16_vs_pipes", "concurrent_16_vs_spliced_pipes",
        "victim_update_p99_under_flood_vs_quiet",
        "update_p99_10k_vs_1", "begin_10k_vs_100", "managed_objects_10k_ms", "disconnect_10k_ms", "rss_10k_mib",
    ]

    func testASmokeRunOfTheBenchPrintsEveryKeyAndLeavesNothingBehind() throws {
        let bench = productsDirectory.appendingPathComponent("dragbroker-bench")
        for product in ["dragbroker-bench", "dragbroker-bench-c", "dragbrokerd"] {
            XCTAssertTrue(FileManager.default.isExecutableFile(atPath: productsDirectory.appendingPathComponent(product).path),
                          "\(product) is not built beside the tests")
        }
        // The bench keeps its bus, daemon state and flooder copy in the temporary directory:
        // a fresh one shows what it leaves there.
        let temporary = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-bench-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: temporary, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: temporary) }

        let run = try Child(executable: bench, environment: ["PATH": "/usr/bin:/bin", "TMPDIR": temporary.path, "DRAGBROKER_BENCH_SMOKE": "1"])
        let deadline = Date().addingTimeInterval(300)
        while run.process.isRunning && Date() < deadline { usleep(50_000) }
        guard !run.process.isRunning else {
            run.kill()
            return XCTFail("the smoke run did not end within 300 s:\n\(run.stdout.text)\n\(run.stderr.text)")
        }
        usleep(50_000)
        XCTAssertEqual(run.process.terminationReason, .exit)
        XCTAssertEqual(run.process.terminationStatus, 0, "\(run.stdout.text)\n\(run.stderr.text)")

        let lines = run.stdout.all { $0.range(of: #"^[a-z0-9_]+="#, options: .regularExpression) != nil }
        XCTAssertEqual(lines.map { String($0.prefix { $0 != "=" }) }, Self.keys, run.stdout.text)
        for line in lines {
            let value = Double(line.drop { $0 != "=" }.dropFirst())
            XCTAssertNotNil(value, line)
            XCTAssertTrue(value.map { $0.isFinite && $0 > 0 } ?? false, "\(line): not a measured figure")
        }
        XCTAssertEqual(run.stdout.all { $0.hasPrefix("# smoke run:") }.count, 1, "the run does not say its figures mean nothing")

        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: temporary.path), [], "the bench left files behind")
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: "/proc").filter { $0.allSatisfy(\.isNumber) }.filter { pid in
            let command = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline"))) ?? Data()
            return String(decoding: command, as: UTF8.self).contains(temporary.path)
        }
        XCTAssertEqual(leftovers, [], "processes of the bench outlived it")
    }

    /// The README's Performance section names every key, so a reader finds what each line is.
    func testTheREADMEQuotesEveryKeyTheBenchPrints() throws {
        let readme = try String(contentsOf: DocumentationTests.root.appendingPathComponent("README.md"), encoding: .utf8)
        guard let start = readme.range(of: "\n## Performance\n") else { return XCTFail("the README has no Performance section") }
        let rest = readme[start.upperBound...]
        let performance = rest[..<(rest.range(of: "\n## ")?.lowerBound ?? rest.endIndex)]
        for key in Self.keys {
            XCTAssertTrue(performance.contains("`\(key)") || performance.contains("\(key)="), "the README's Performance section does not name \(key)")
        }
    }
}

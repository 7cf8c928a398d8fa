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
        let lines = try smokeRun()
        XCTAssertEqual(lines.keys, Self.keys, lines.output)
        XCTAssertEqual(lines.output.split(separator: "\n").filter { $0.hasPrefix("# smoke run:") }.count, 1,
                       "the run does not say its figures mean nothing")
    }

    /// The switches that run one section alone, for work on one path: each still runs to its
    /// end, prints that section's keys and no others, and leaves nothing behind.
    func testEachSectionAloneRunsToItsEnd() throws {
        let sections: [(switch: String, keys: [String])] = [
            ("DRAGBROKER_BENCH_SCALE_ONLY", ["update_p99_10k_vs_1", "begin_10k_vs_100", "managed_objects_10k_ms", "disconnect_10k_ms", "rss_10k_mib"]),
            ("DRAGBROKER_BENCH_CONCURRENT_ONLY", ["concurrent_4_vs_pipes", "concurrent_4_vs_spliced_pipes", "concurrent_16_vs_pipes", "concurrent_16_vs_spliced_pipes"]),
            ("DRAGBROKER_BENCH_HANDOVER_ONLY", ["file_handover_vs_echo", "file_handover_held_vs_echo"]),
            ("DRAGBROKER_BENCH_FIRST_BYTE_ONLY", [
                "first_byte_held_vs_echo_p50", "fail_closed_drags_per_second", "default_drags_per_second",
                "paste_first_byte_vs_echo_p50", "paste_call_first_byte_vs_echo_p50",
                "client_update_vs_c", "client_update_from_task_vs_c", "client_update_vs_c_loop", "client_update_cpu_vs_c_loop",
                "client_first_byte_vs_c", "client_first_byte_from_task_vs_c", "client_first_byte_vs_c_loop", "client_first_byte_cpu_vs_c_loop",
                "first_byte_vs_echo_p50", "fail_closed_first_byte_vs_echo_p50", "update_vs_echo_p50",
            ]),
        ]
        for section in sections {
            let lines = try smokeRun(section.switch)
            XCTAssertEqual(lines.keys, section.keys, "\(section.switch):\n\(lines.output)")
        }
    }

    /// Runs the bench on the debug build in smoke mode, with `section` set if given: it must
    /// end cleanly within 300 s, every key it prints must be a measured figure, and it must
    /// leave no file and no process behind. Its keys, in the order printed, and its output.
    private func smokeRun(_ section: String? = nil, file: StaticString = #filePath, line: UInt = #line) throws -> (keys: [String], output: String) {
        let bench = productsDirectory.appendingPathComponent("dragbroker-bench")
        for product in ["dragbroker-bench", "dragbroker-bench-c", "dragbrokerd"] {
            XCTAssertTrue(FileManager.default.isExecutableFile(atPath: productsDirectory.appendingPathComponent(product).path),
                          "\(product) is not built beside the tests", file: file, line: line)
        }
        // The bench keeps its bus, daemon state and flooder copy in the temporary directory:
        // a fresh one shows what it leaves there.
        let temporary = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-bench-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: temporary, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: temporary) }

        var environment = ["PATH": "/usr/bin:/bin", "TMPDIR": temporary.path, "DRAGBROKER_BENCH_SMOKE": "1"]
        if let section { environment[section] = "1" }
        let run = try Child(executable: bench, environment: environment)
        let what = section ?? "the smoke run"
        let deadline = Date().addingTimeInterval(300)
        while run.process.isRunning && Date() < deadline { usleep(50_000) }
        guard !run.process.isRunning else {
            run.kill()
            XCTFail("\(what) did not end within 300 s:\n\(run.stdout.text)\n\(run.stderr.text)", file: file, line: line)
            return ([], run.stdout.text)
        }
        usleep(50_000)
        XCTAssertEqual(run.process.terminationReason, .exit, what, file: file, line: line)
        XCTAssertEqual(run.process.terminationStatus, 0, "\(what): \(run.stdout.text)\n\(run.stderr.text)", file: file, line: line)

        let lines = run.stdout.all { $0.range(of: #"^[a-z0-9_]+="#, options: .regularExpression) != nil }
        for keyLine in lines {
            let value = Double(keyLine.drop { $0 != "=" }.dropFirst())
            XCTAssertTrue(value.map { $0.isFinite && $0 > 0 } ?? false, "\(what): \(keyLine): not a measured figure", file: file, line: line)
        }

        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: temporary.path), [], "\(what) left files behind", file: file, line: line)
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: "/proc").filter { $0.allSatisfy(\.isNumber) }.filter { pid in
            let command = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline"))) ?? Data()
            return String(decoding: command, as: UTF8.self).contains(temporary.path)
        }
        XCTAssertEqual(leftovers, [], "processes of \(what) outlived it", file: file, line: line)
        return (lines.map { String($0.prefix { $0 != "=" }) }, run.stdout.text)
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

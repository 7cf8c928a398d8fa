import Foundation
import XCTest

/// `make demo`'s script, run as a new user would see it (with the binaries this test run built).
final class DemoTests: XCTestCase {
    func testTheDemoDoesARealDragAndShowsTheLog() throws {
        let demo = try Child(executable: URL(fileURLWithPath: "/bin/bash"),
                             arguments: [DocumentationTests.root.appendingPathComponent("scripts/demo").path],
                             environment: ["PATH": "/usr/bin:/bin", "BIN": productsDirectory.path, "HOME": NSTemporaryDirectory()])
        demo.process.waitUntilExit()
        usleep(50_000)
        let output = demo.stdout.text
        XCTAssertEqual(demo.process.terminationStatus, 0, output + demo.stderr.text)
        for line in [
            "source: began a drag of sunset.png (/org/dragbroker/Broker1/session/s1)",
            "                image/png (data, visible to team)",
            "        └─/org/dragbroker/Broker1/session/s1",
            "target:   item 0: \"sunset.png\" 640x480, types visible to me: image/png, text/plain;charset=utf-8",
            "target: proposed copy, the broker allows copy",
            "target: loading [####################] 922218 of 922218 bytes",
            "source: rendering the PNG now, because the destination asked for it",
            "source: load 1 delivered 922218 bytes",
            "source: every transfer finished",
            "1 load listed.",
        ] {
            XCTAssertTrue(output.contains(line), "missing '\(line)' in:\n\(output)")
        }
        XCTAssertTrue(output.contains("target: received 922218 bytes (89 50 4e 47 0d 0a 1a 0a …)"), output)
        XCTAssertTrue(output.range(of: #"s1 +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \([^)]*\) image/png 922218 org\.dragbroker\.demo\.Target completed"#,
                                   options: .regularExpression) != nil, output)
    }
}

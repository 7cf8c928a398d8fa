import Foundation
import XCTest

/// `make demo`'s script, run as a new user would see it (with the binaries this test run built):
/// real windows on a private X server, a real pointer drag, screenshots.
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
            "source: showing sunset.png; drag the picture, or copy it with Ctrl+C",
            "target: waiting for a drop or a paste (Ctrl+V)",
            "target: the broker allows copy",
            "                image/png (data, visible to team)",
            "        └─/org/dragbroker/Broker1/session/s1",
            "target: incoming item 0 as image/png",
            "target: loading [####################] 922218 of 922218 bytes",
            "target: concluded the copy",
            "source: the drop was performed: copy",
            "source: rendering the PNG now, because the destination asked for it",
            "source: load 1 delivered 922218 bytes",
            "source: every transfer finished",
            "    application/vnd.dragbroker.pasteboard.v1",
            "An app that does not speak the protocol reads the caption in the clear (xclip -o):\n    Sunset over the harbour",
            "source: org.dragbroker.demo.Target pasted the copy",
            "source: paste load 1 delivered 922218 bytes",
            "2 loads listed.",
        ] {
            XCTAssertTrue(output.contains(line), "missing '\(line)' in:\n\(output)")
        }
        XCTAssertTrue(output.contains("target: received 922218 bytes (89 50 4e 47 0d 0a 1a 0a …)"), output)
        XCTAssertTrue(output.range(of: #"s1 +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \([^)]*\) +image/png 922218 org\.dragbroker\.demo\.Target completed"#,
                                   options: .regularExpression) != nil, output)
        XCTAssertTrue(output.range(of: #"s2_1 +paste +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \([^)]*\) +org\.dragbroker\.demo\.Source +org\.dragbroker\.demo\.Target +copy +completed"#,
                                   options: .regularExpression) != nil, output)
        XCTAssertTrue(output.range(of: #"s2_1 +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \([^)]*\) +image/png 922218 org\.dragbroker\.demo\.Target completed"#,
                                   options: .regularExpression) != nil, output)

        // The screenshots it names show the two windows: the target's drop area is empty
        // mid-drag and shows the picture after the drop.
        let screenshots = try XCTUnwrap(output.split(separator: "\n").first { $0.hasPrefix("Screenshots: ") })
        let paths = screenshots.split(separator: " ").filter { $0.hasSuffix(".png") }.map(String.init)
        XCTAssertEqual(paths.count, 2, String(screenshots))
        let background = "srgb(246,245,244)"
        XCTAssertEqual(try Self.pixel(at: (590, 200), in: paths[0]), background, "the drop area before the drop")
        XCTAssertNotEqual(try Self.pixel(at: (590, 200), in: paths[1]), background, "the dropped picture")
        XCTAssertNotEqual(try Self.pixel(at: (190, 140), in: paths[0]), background, "the source's picture")
    }

    /// One pixel of a screenshot, as ImageMagick names its colour.
    static func pixel(at point: (x: Int, y: Int), in path: String) throws -> String {
        let convert = Process()
        convert.executableURL = URL(fileURLWithPath: "/usr/bin/convert")
        convert.arguments = [path, "-format", "%[pixel:p{\(point.x),\(point.y)}]", "info:"]
        let out = Pipe()
        convert.standardOutput = out
        try convert.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        convert.waitUntilExit()
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

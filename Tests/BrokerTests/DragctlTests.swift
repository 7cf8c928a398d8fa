import BrokerProtocol
import Foundation
import TransferLog
import XCTest

/// dragctl against a live daemon: its tables, its JSON, its exit codes.
final class DragctlTests: XCTestCase {
    func dragctl(_ world: World, _ arguments: [String]) throws -> (status: Int32, out: [String], err: [String]) {
        let child = try Child(executable: productsDirectory.appendingPathComponent("dragctl"), arguments: arguments,
                              environment: ["DRAGBROKER_BUS_ADDRESS": world.bus.address, "TZ": "UTC"])
        child.process.waitUntilExit()
        usleep(20_000)  // let the readers take the last lines
        return (child.process.terminationStatus, child.stdout.all { _ in true }, child.stderr.all { _ in true })
    }

    /// `dragctl monitor --json=short | jq`: each event is a line the moment it happens, not
    /// when the monitor exits and its buffer is flushed.
    func testMonitorJSONReachesAPipeAsItHappens() throws {
        let world = try World()
        let monitor = try Child(executable: productsDirectory.appendingPathComponent("dragctl"),
                                arguments: ["monitor", "--json=short", "--address", world.bus.address], environment: ["TZ": "UTC"])
        XCTAssertNotNil(monitor.stderr.take { $0 == "Monitoring drag sessions; press Ctrl-C to stop." })
        let source = try world.peer("source-app")
        _ = try source.begin(EndToEndTests.helloDrag)
        XCTAssertEqual(monitor.stdout.take { _ in true },
                       #"{"bytes":0,"detail":"\#(source.executable.path.replacingOccurrences(of: "/", with: "\\/")), 1 item","event":"begin","expected":0,"session":"s1"}"#)
        XCTAssertTrue(monitor.process.isRunning)
        monitor.terminate()
    }

    func testSessionsShowAndCancel() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(#"{"items":[{"name":"photo.png","width":640,"height":480,"reps":[{"type":"image/png","visibility":"team","size":100},{"type":"text/plain","text":"caption"}]}]}"#)
        _ = destination.run("present \(token)")
        _ = destination.run("enter copy")

        let list = try dragctl(world, ["list-sessions"])
        XCTAssertEqual(list.status, 0)
        XCTAssertEqual(list.out.count, 4)
        XCTAssertTrue(list.out[0].hasPrefix("SESSION STATE  ITEMS SOURCE"), list.out[0])
        XCTAssertTrue(list.out[1].hasPrefix("s1      active 1     \(source.executable.path) "), list.out[1])
        XCTAssertTrue(list.out[1].hasSuffix("ago)") || list.out[1].hasSuffix("(just now)"), list.out[1])
        XCTAssertEqual(list.out[2...], ["", "1 session listed."])
        XCTAssertEqual(try dragctl(world, ["list-sessions", "--no-legend"]).out.count, 1)

        let json = try dragctl(world, ["list-sessions", "--json=short"])
        let sessions = try JSONDecoder().decode([SessionSummary].self, from: Data(json.out.joined().utf8))
        XCTAssertEqual(sessions.map(\.id), ["s1"])
        XCTAssertEqual(sessions[0].path, "/org/dragbroker/Broker1/session/s1")
        XCTAssertEqual(sessions[0].sourceApp, source.executable.path)

        let show = try dragctl(world, ["show-session", "s1"])
        XCTAssertEqual(show.out, [
            "Session s1",
            "      State: active",
            "     Source: \(source.executable.path)",
            "Destination: \(destination.executable.path)",
            " Restricted: no",
            "      Items:",
            "             0: photo.png 640x480",
            "                image/png (data, visible to team)",
            "                text/plain (data, visible to all)",
        ])
        let missing = try dragctl(world, ["show-session", "s9"])
        XCTAssertEqual(missing.status, 1)
        XCTAssertEqual(missing.err, ["dragctl: Failed to show session s9: \(BrokerErrorCode.notFound.busName): No live session s9"])

        XCTAssertEqual(try dragctl(world, ["cancel-session", "s1"]).status, 0)
        XCTAssertTrue(source.waitFor("EVENT ended cancel \(BrokerErrorCode.cancelled.busName)"))
        XCTAssertTrue(destination.waitFor("EVENT ended cancel \(BrokerErrorCode.cancelled.busName)"))
        XCTAssertEqual(try dragctl(world, ["list-sessions"]).out, ["0 sessions listed."])
    }

    func testLogFiltersAndStats() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(#"{"items":[{"reps":[{"type":"image/png","size":1000},{"type":"text/plain","text":"hi"}]}]}"#)
        _ = destination.run("present \(token)")
        _ = destination.run("enter copy")
        _ = destination.run("drop")
        _ = destination.run("loadcheck 0 image/png")
        _ = destination.run("load 0 text/plain")
        _ = destination.run("load 0 text/plain")
        _ = destination.run("conclude")
        _ = try world.daemon.waitForLog { log -> Bool? in try log.sessions().count == 1 && log.loads().count == 3 ? true : nil }
        let state = ["--state-directory", world.daemon.stateDirectory.path]

        let pngOnly = try dragctl(world, ["log", "--type", "image/png", "--json=short"] + state)
        struct Report: Decodable { var loads: [Load]; var sessions: [Session] }
        struct Load: Decodable { var typeIdentifier: String; var bytes: Int64; var outcome: String }
        struct Session: Decodable { var sessionID: String; var outcome: String }
        let report = try JSONDecoder().decode(Report.self, from: Data(pngOnly.out.joined().utf8))
        XCTAssertEqual(report.loads.map(\.typeIdentifier), ["image/png"])
        XCTAssertEqual(report.loads.map(\.bytes), [1000])
        XCTAssertEqual(report.sessions.map(\.sessionID), ["s1"])
        let none = try dragctl(world, ["log", "--outcome", "cancelled"] + state)
        XCTAssertEqual(none.out, ["0 sessions listed.", "", "0 loads listed."])
        let byApp = try dragctl(world, ["log", "--app", destination.executable.path, "--since=-1h", "--json=short"] + state)
        XCTAssertEqual(try JSONDecoder().decode(Report.self, from: Data(byApp.out.joined().utf8)).loads.count, 3)
        let badTime = try dragctl(world, ["log", "--since", "yesterday-ish"] + state)
        XCTAssertEqual(badTime.status, 64)
        XCTAssertTrue(badTime.err.joined().contains("--since: 'yesterday-ish' is not a time"), badTime.err.joined())

        // On a terminal shorter than the output, the log goes through the pager, as with systemd's tools.
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("python/pty_capture.py").path
        func onTerminal(_ arguments: [String]) throws -> String {
            let child = try Child(executable: URL(fileURLWithPath: "/usr/bin/python3"),
                                  arguments: [script, "10", "loads listed.", productsDirectory.appendingPathComponent("dragctl").path] + arguments,
                                  environment: ["PATH": "/usr/bin:/bin", "ROWS": "5", "DRAGCTL_PAGER": "sed 's/^/PAGED:/'"])
            child.process.waitUntilExit()
            usleep(20_000)
            return child.stdout.text
        }
        let paged = try onTerminal(["log"] + state)
        XCTAssertTrue(paged.contains("PAGED:3 loads listed."), paged)
        let unpaged = try onTerminal(["log", "--no-pager"] + state)
        XCTAssertFalse(unpaged.contains("PAGED:"), unpaged)
        XCTAssertTrue(unpaged.contains("3 loads listed."), unpaged)

        let stats = try dragctl(world, ["stats"] + state)
        XCTAssertEqual(Array(stats.out[0...3]), [
            "SOURCE APP\(String(repeating: " ", count: max(source.executable.path.count - 9, 1)))LOADS BYTES",
            "\(source.executable.path) 3     1004B",
            "",
            "1 entry listed.",
        ])
        let statsJSON = try dragctl(world, ["stats", "--json=short"] + state)
        XCTAssertTrue(statsJSON.out.joined().contains(#""byType":[{"bytes":1000,"key":"image\/png","loads":1},{"bytes":4,"key":"text\/plain","loads":2}]"#),
                      statsJSON.out.joined())
    }

    /// Requests the daemon refused, as `dragctl refusals` shows them: a load before the drop
    /// (WrongState) and a load of a type the item does not have, in a table and as JSON.
    func testRefusalsListsWhatTheDaemonRefused() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(#"{"items":[{"reps":[{"type":"text/plain","text":"hi"}]}]}"#)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("load 0 text/plain"), err(.wrongState, "Loads are allowed only after PerformDrop"))
        _ = destination.run("enter copy")
        _ = destination.run("drop")
        let missing = destination.run("load 0 image/png")
        let notFound = "ERR \(BrokerErrorCode.notFound.busName) "
        XCTAssertTrue(missing.hasPrefix(notFound), missing)
        let missingMessage = String(missing.dropFirst(notFound.count))
        let records = try world.daemon.waitForLog { log -> [RefusalRecord]? in
            let refusals = try log.refusals()
            return refusals.count == 2 ? refusals : nil
        }
        let state = ["--state-directory", world.daemon.stateDirectory.path]
        let app = destination.executable.path
        let wrongState = BrokerErrorCode.wrongState.busName, notFoundName = BrokerErrorCode.notFound.busName

        // Times are local (TZ=UTC here) with how long ago, the one part that depends on when the
        // test runs: it is read back from each row, checked, and the rest compared byte for byte.
        let table = try dragctl(world, ["refusals"] + state)
        XCTAssertEqual(table.status, 0)
        XCTAssertEqual(table.err, [])
        let formatter = DateFormatter()
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd HH:mm:ss"
        let times = try records.enumerated().map { index, record in
            let time = formatter.string(from: record.at)
            let row = try XCTUnwrap(table.out.dropFirst(index + 1).first, table.out.joined(separator: "\n"))
            XCTAssertTrue(row.hasPrefix(time + " ("), row)
            let ago = row.dropFirst(time.count + 2).prefix { $0 != ")" }
            XCTAssertTrue(ago == "just now" || ago.wholeMatch(of: /[0-9]+s ago/) != nil, String(ago))
            return "\(time) (\(ago))"
        }
        func pad(_ cell: String, _ width: Int) -> String { cell + String(repeating: " ", count: width - cell.count) }
        let timeWidth = times.map(\.count).max()! + 1
        XCTAssertEqual(table.out, [
            pad("TIME", timeWidth) + pad("APP", app.count + 1) + "ACTION SESSION TYPE       " + pad("ERROR", wrongState.count + 1) + "MESSAGE",
            pad(times[0], timeWidth) + pad(app, app.count + 1) + "Load   s1      image/png  " + pad(notFoundName, wrongState.count + 1) + missingMessage,
            pad(times[1], timeWidth) + pad(app, app.count + 1) + "Load   s1      text/plain " + wrongState + " Loads are allowed only after PerformDrop",
            "",
            "2 refusals listed.",
        ])
        XCTAssertEqual(try dragctl(world, ["refusals", "--no-legend", "--no-pager", "--error", "WrongState"] + state).out, [
            pad(times[1], timeWidth) + pad(app, app.count + 1) + "Load   s1      text/plain " + wrongState + " Loads are allowed only after PerformDrop",
        ])

        // JSON: every field of the record, dates as ISO 8601, keys sorted; absent fields (the rule) left out.
        let at = records.map { ISO8601DateFormatter().string(from: $0.at) }
        let escapedApp = app.replacingOccurrences(of: "/", with: #"\/"#)
        let pid = destination.reportedPID, uid = getuid()
        func short(_ id: Int, _ at: String, _ type: String, _ error: String, _ message: String) -> String {
            let message = message.replacingOccurrences(of: "/", with: #"\/"#)
            return #"{"action":"Load","app":"\#(escapedApp)","at":"\#(at)","errorName":"\#(error)","id":\#(id),"message":"\#(message)","#
                + #""pid":\#(pid),"sessionID":"s1","subject":"\#(type)","uid":\#(uid)}"#
        }
        let json = try dragctl(world, ["refusals", "--json=short"] + state)
        XCTAssertEqual(json.out, ["[" + short(2, at[0], #"image\/png"#, notFoundName, missingMessage) + ","
                                  + short(1, at[1], #"text\/plain"#, wrongState, "Loads are allowed only after PerformDrop") + "]"])
        let pretty = try dragctl(world, ["refusals", "-j", "--type", "text/plain", "--action", "Load", "--app", app, "--since=-1h",
                                         "--error", wrongState] + state)
        XCTAssertEqual(pretty.out, [
            "[",
            "  {",
            #"    "action" : "Load","#,
            #"    "app" : "\#(escapedApp)","#,
            #"    "at" : "\#(at[1])","#,
            #"    "errorName" : "\#(wrongState)","#,
            #"    "id" : 1,"#,
            #"    "message" : "Loads are allowed only after PerformDrop","#,
            #"    "pid" : \#(pid),"#,
            #"    "sessionID" : "s1","#,
            #"    "subject" : "text\/plain","#,
            #"    "uid" : \#(uid)"#,
            "  }",
            "]",
        ])
        XCTAssertEqual(try dragctl(world, ["refusals", "--limit", "1", "--json=short"] + state).out,
                       ["[" + short(2, at[0], #"image\/png"#, notFoundName, missingMessage) + "]"])

        // Filters that match nothing, and the errors log's own options give.
        for filter in [["--type", "text/html"], ["--action", "BeginSession"], ["--app", source.executable.path],
                       ["--error", "AccessDenied"], ["--until", "2000-01-01"]] {
            XCTAssertEqual(try dragctl(world, ["refusals"] + filter + state).out, ["0 refusals listed."], "\(filter)")
        }
        XCTAssertEqual(try dragctl(world, ["refusals", "--json=short", "--since=-1h", "--action", "BeginSession"] + state).out, ["[]"])
        let badTime = try dragctl(world, ["refusals", "--since", "yesterday-ish"] + state)
        XCTAssertEqual(badTime.status, 64)
        XCTAssertTrue(badTime.err.joined().contains("--since: 'yesterday-ish' is not a time"), badTime.err.joined())
        XCTAssertEqual(try dragctl(world, ["refusals", "--limit", "0"] + state).status, 64)
        let noLog = try dragctl(world, ["refusals", "--state-directory", world.directory.appendingPathComponent("nowhere").path])
        XCTAssertEqual(noLog.status, 1)
        XCTAssertEqual(noLog.err, ["dragctl: Failed to read the transfer log: no transfer log at "
                                   + world.directory.appendingPathComponent("nowhere/transfers.sqlite").path + " (has dragbrokerd run yet?)"])
    }
}

/// `dragctl monitor` in a pseudo-terminal during a real drag: the events, and a progress
/// bar redrawn in place.
final class MonitorTests: XCTestCase {
    func testMonitorShowsTheEventsAndProgressOfARealDrag() throws {
        let world = try World()
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("python/pty_capture.py")
        let monitor = try Child(executable: URL(fileURLWithPath: "/usr/bin/python3"),
                                arguments: [script.path, "30", " end ", productsDirectory.appendingPathComponent("dragctl").path,
                                            "monitor", "--address", world.bus.address],
                                environment: ["PATH": "/usr/bin:/bin", "TERM": "xterm"])
        usleep(500_000)  // let it subscribe
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(#"{"items":[{"name":"movie","reps":[{"type":"video/mp4","size":4194304,"chunk":131072,"pauseMs":10,"announce":true}]}]}"#)
        _ = destination.run("present \(token)")
        _ = destination.run("enter copy")
        _ = destination.run("update copy")
        _ = destination.run("drop")
        XCTAssertEqual(destination.run("loadcheck 0 video/mp4"), "OK 4194304 pattern")
        _ = destination.run("conclude")
        monitor.process.waitUntilExit()
        usleep(50_000)
        let screen = monitor.stdout.text
        for expected in [
            " s1 begin \(source.executable.path), 1 item",
            " s1 enter \(destination.executable.path) proposes copy, allowed copy",
            " s1 update \(destination.executable.path) proposes copy, allowed copy",
            " s1 drop \(destination.executable.path), copy",
            " s1 load 1 video/mp4 (data) to \(destination.executable.path)",
            " s1 loaded 1 video/mp4 completed 4.0M",
            " s1 end completed",
        ] {
            XCTAssertTrue(screen.contains(expected), "missing '\(expected)' in:\n\(screen)")
        }
        XCTAssertTrue(screen.contains("\r\u{1B}[K"), "progress redraws in place on a terminal")
        XCTAssertTrue(screen.contains("] ") && screen.contains("% ") && screen.contains(" of 4.0M"), screen)
    }
}

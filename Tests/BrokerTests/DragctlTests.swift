import BrokerProtocol
import Foundation
import TransferLog
import XCTest

/// dragctl against a live daemon: its tables, its JSON, its exit codes.
final class DragctlTests: XCTestCase {
    func dragctl(_ world: World, _ arguments: [String], executable: URL = productsDirectory.appendingPathComponent("dragctl"))
        throws -> (status: Int32, out: [String], err: [String], pid: pid_t) {
        let child = try Child(executable: executable, arguments: arguments,
                              environment: ["DRAGBROKER_BUS_ADDRESS": world.bus.address, "TZ": "UTC"])
        child.process.waitUntilExit()
        usleep(20_000)  // let the readers take the last lines
        return (child.process.terminationStatus, child.stdout.all { _ in true }, child.stderr.all { _ in true },
                child.process.processIdentifier)
    }

    func pad(_ cell: String, _ width: Int) -> String { cell + String(repeating: " ", count: width - cell.count) }

    /// A time as dragctl shows it, "2026-11-21 09:12:03 (just now)", read back from where it starts in a
    /// row: how long ago is the one part that depends on when the test runs.
    func timeCell(_ row: String, at offset: Int) throws -> String {
        let time = try XCTUnwrap(row.dropFirst(offset).prefixMatch(
            of: /[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} \((just now|[0-9]+s ago)\)/), row)
        return String(time.output.0)
    }

    /// dragctl's text without how long ago each time was, nor the padding that moves with it: two
    /// runs on either side of a second print "(just now)" and "(1s ago)", in wider columns.
    func withoutHowLongAgo(_ lines: [String]) -> [String] {
        lines.map { $0.replacing(/\((just now|[0-9]+s ago)\)/, with: "(ago)").replacing(/[ ]+/, with: " ") }
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

    /// A monitor that nobody reads keeps the newest 4096 events, however many sessions come
    /// and go meanwhile.
    func testMonitorEventsNobodyReadsAreBounded() throws {
        let world = try World()
        let watcher = try world.peer("watcher-app"), source = try world.peer("source-app")
        XCTAssertEqual(watcher.run("monitorunread"), "OK")
        // Each drag begins and ends: 4200 events.
        XCTAssertEqual(source.run("churndrags 2100"), "OK")
        XCTAssertEqual(watcher.run("readmonitor"), "OK 4096 s2100 end")
    }

    /// Pastes and live pasteboard entries, told apart from drags wherever dragctl shows
    /// sessions: list-sessions, monitor, log and stats.
    func testPastesAndPasteboardEntriesAreToldApartFromDrags() throws {
        let world = try World()
        let monitor = try Child(executable: productsDirectory.appendingPathComponent("dragctl"),
                                arguments: ["monitor", "--json=short", "--address", world.bus.address], environment: ["TZ": "UTC"])
        XCTAssertNotNil(monitor.stderr.take { $0.hasPrefix("Monitoring") })
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let copied = source.run("copy " + EndToEndTests.helloDrag).split(separator: " ").map(String.init)
        XCTAssertEqual(copied.first, "OK")
        XCTAssertEqual(destination.run("present \(copied[1])"), "OK \(copied[2])")
        XCTAssertEqual(destination.run("paste"), "OK \(copied[2])_1")
        _ = try source.begin(EndToEndTests.helloDrag)

        let list = try dragctl(world, ["list-sessions", "--no-legend"])
        XCTAssertEqual(list.out.map { $0.split(separator: " ").prefix(4).joined(separator: " ") },
                       ["s1 copy copied 1", "s1_1 paste pasted 1", "s2 drag active 1"])
        let path = source.executable.path.replacingOccurrences(of: "/", with: "\\/")
        let destinationPath = destination.executable.path.replacingOccurrences(of: "/", with: "\\/")
        XCTAssertEqual(monitor.stdout.take { _ in true },
                       #"{"bytes":0,"detail":"\#(path), 1 item","event":"copy","expected":0,"session":"s1"}"#)
        XCTAssertEqual(monitor.stdout.take { _ in true },
                       #"{"bytes":0,"detail":"s1 of \#(path) into \#(destinationPath), 1 item","event":"paste","expected":0,"session":"s1_1"}"#)
        XCTAssertEqual(monitor.stdout.take { _ in true },
                       #"{"bytes":0,"detail":"\#(path), 1 item","event":"begin","expected":0,"session":"s2"}"#)
        monitor.terminate()

        XCTAssertTrue(destination.run("load 0 text/plain").hasPrefix("OK 11 "))
        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertEqual(source.run("withdraw"), "OK")
        _ = try world.daemon.waitForLog { log -> Bool? in try log.sessions().count == 2 && log.loads().count == 1 ? true : nil }
        let state = ["--state-directory", world.daemon.stateDirectory.path]
        let log = try dragctl(world, ["log", "--no-pager"] + state)
        XCTAssertEqual(log.out.dropFirst().prefix(3).map { $0.split(separator: " ").prefix(2).joined(separator: " ") },
                       ["s2 drag", "s1_1 paste", "s1 copy"])
        let stats = try dragctl(world, ["stats", "--no-live"] + state)
        let channel = try XCTUnwrap(stats.out.firstIndex(of: "CHANNEL LOADS BYTES"))
        XCTAssertEqual(stats.out[channel + 1], "paste   1     11B")
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
        XCTAssertTrue(list.out[0].hasPrefix("SESSION KIND STATE  ITEMS SOURCE"), list.out[0])
        XCTAssertTrue(list.out[1].hasPrefix("s1      drag active 1     \(source.executable.path) "), list.out[1])
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
        // As JSONEncoder writes them, which cuts the fraction off: ISO8601DateFormatter rounds
        // it to milliseconds first, so a record made at hh:mm:ss.9996 would read one second later.
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        let at = try records.map { String(decoding: try encoder.encode($0.at), as: UTF8.self).trimmingCharacters(in: ["\""]) }
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

    // MARK: What clients chose, escaped

    /// A file name that, printed raw, retitles the terminal, clears the screen, starts a C1 CSI
    /// and breaks the row; and the same as dragctl must show it.
    static let hostileName = "evil\u{1B}]0;pwned\u{07}\u{1B}[2J\u{9B}31m\ttab\\back\nline"
    static let hostileNameShown = #"evil\x1b]0;pwned\a\x1b[2J\xc2\x9b31m\ttab\\back\nline"#

    /// Nothing a terminal acts on: no C0 byte (newline only ends the lines these were split at), DEL or C1.
    func assertNoControlCharacters(_ lines: [String], file: StaticString = #filePath, line: UInt = #line) {
        for text in lines {
            let raw = text.unicodeScalars.filter { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) }
            XCTAssertEqual(raw.map { String($0.value, radix: 16) }, [], text.debugDescription, file: file, line: line)
        }
    }

    /// An app whose executable's name holds escape sequences, as the source and the destination of
    /// a live session: list-sessions, show-session, monitor and whoami show its path escaped, the
    /// suggested name was stripped by the daemon, and JSON keeps the exact strings.
    func testLiveViewsEscapeAnExecutablePathTheClientChose() throws {
        let world = try World()
        let monitor = try Child(executable: productsDirectory.appendingPathComponent("dragctl"),
                                arguments: ["monitor", "--address", world.bus.address], environment: ["TZ": "UTC"])
        XCTAssertNotNil(monitor.stderr.take { $0 == "Monitoring drag sessions; press Ctrl-C to stop." })
        let app = try world.peer(Self.hostileName)
        let path = app.executable.path
        let shown = world.directory.appendingPathComponent("apps").path + "/" + Self.hostileNameShown
        let (token, _) = try app.begin(#"{"items":[{"name":"caption\u001b[2J\u009b1m\u0007.txt","reps":[{"type":"text/plain","text":"hi"}]}]}"#)
        _ = app.run("present \(token)")
        XCTAssertEqual(app.run("enter copy"), "OK copy")

        let list = try dragctl(world, ["list-sessions"])
        XCTAssertEqual(list.status, 0)
        assertNoControlCharacters(list.out)
        let rowStart = "s1      drag active 1     " + shown + " "
        let since = try timeCell(try XCTUnwrap(list.out.dropFirst().first), at: rowStart.count)
        XCTAssertEqual(list.out, ["SESSION KIND STATE  ITEMS " + pad("SOURCE", shown.count + 1) + "SINCE", rowStart + since, "", "1 session listed."])
        let listed = try JSONDecoder().decode([SessionSummary].self, from: Data(try dragctl(world, ["list-sessions", "--json=short"]).out.joined().utf8))
        XCTAssertEqual(listed.map(\.sourceApp), [path])

        let show = try dragctl(world, ["show-session", "s1"])
        XCTAssertEqual(show.status, 0)
        assertNoControlCharacters(show.out)
        XCTAssertEqual(show.out, [
            "Session s1",
            "      State: active",
            "     Source: \(shown)",
            "Destination: \(shown)",
            " Restricted: no",
            "      Items:",
            "             0: caption[2J1m.txt",
            "                text/plain (data, visible to all)",
        ])
        let details = try JSONDecoder().decode(SessionDetails.self, from: Data(try dragctl(world, ["show-session", "s1", "--json=short"]).out.joined().utf8))
        XCTAssertEqual([details.sourceApp, details.destinationApp], [path, path])
        XCTAssertEqual(details.items.map(\.suggestedName), ["caption[2J1m.txt"], "the daemon strips control characters from suggested names")

        // In a pipe every event is a line, its time first.
        let events = try [" s1 begin ", " s1 enter "].map { event in
            let line = try XCTUnwrap(monitor.stdout.take { $0.dropFirst(8).hasPrefix(event) }, monitor.stdout.text)
            XCTAssertNotNil(line.prefixMatch(of: #/[0-9]{2}:[0-9]{2}:[0-9]{2} /#), line)
            return String(line.dropFirst(9))
        }
        XCTAssertEqual(events, ["s1 begin \(shown), 1 item", "s1 enter \(shown) proposes copy, allowed copy"])
        assertNoControlCharacters(monitor.stdout.all { _ in true })
        monitor.terminate()

        // whoami describes its caller: dragctl itself, run from a file so named.
        let hostileDragctl = world.directory.appendingPathComponent("apps/dragctl-" + Self.hostileName)
        try FileManager.default.copyItem(at: productsDirectory.appendingPathComponent("dragctl"), to: hostileDragctl)
        let ownShown = world.directory.appendingPathComponent("apps").path + "/dragctl-" + Self.hostileNameShown
        let whoami = try dragctl(world, ["whoami"], executable: hostileDragctl)
        XCTAssertEqual(whoami.status, 0)
        assertNoControlCharacters(whoami.out)
        XCTAssertEqual(whoami.out, ["App ID     \(ownShown)", "Team       -", "Managed    no", "Source     executable", "Sandboxed  no",
                                    "Executable \(ownShown)", "PID        \(whoami.pid)", "UID        \(getuid())"])
    }

    /// A sandbox names its own app ID, and with it its team: show-session escapes both.
    func testShowSessionEscapesASandboxChosenAppIDAndTeam() throws {
        let world = try World()
        let app = try world.peer("sandboxed-app", sandbox: .flatpak(appID: "org.evil\u{1B}[2J.Editor\u{07}"))
        _ = try app.begin(EndToEndTests.helloDrag)
        let show = try dragctl(world, ["show-session", "s1"])
        assertNoControlCharacters(show.out)
        XCTAssertEqual(Array(show.out.prefix(4)), [
            "Session s1",
            "      State: active",
            #"     Source: org.evil\x1b[2J.Editor\a (team org.evil\x1b[2J)"#,
            "Destination: -",
        ])
        let details = try JSONDecoder().decode(SessionDetails.self, from: Data(try dragctl(world, ["show-session", "s1", "-j"]).out.joined().utf8))
        XCTAssertEqual([details.sourceApp, details.sourceTeam], ["org.evil\u{1B}[2J.Editor\u{07}", "org.evil\u{1B}[2J"])
    }

    /// The transfer log keeps what the app chose: its path in every session, load and total, and
    /// in its refusals the app, the type it asked for and the message quoting it. log, stats and
    /// refusals show each escaped; their JSON holds the exact strings.
    func testLogStatsAndRefusalsEscapeWhatTheClientChose() throws {
        let world = try World { _ in "[Flow]\nFrom=any\nTo=any\nTypes=text/html\nAction=deny\n" }
        let app = try world.peer(Self.hostileName)
        let path = app.executable.path
        let shown = world.directory.appendingPathComponent("apps").path + "/" + Self.hostileNameShown
        let badType = "text/x\u{1B}]0;pwned\u{07}", badTypeShown = #"text/x\x1b]0;pwned\a"#
        let (token, _) = try app.begin(#"{"items":[{"reps":[{"type":"text/plain","text":"hi"},{"type":"text/html","text":"<b>hi</b>"}]}]}"#)
        _ = app.run("present \(token)")
        XCTAssertEqual(app.run(#"begin {"items":[{"reps":[{"type":"text/x\u001b[2J","text":"hi"}]}]}"#),
                       err(.invalidArgument, "Item 0: 'text/x\\u{1B}[2J' is not a type identifier: it contains the control character U+001B"))
        XCTAssertEqual(app.run("load 0 \(badType)"), err(.wrongState, "Loads are allowed only after PerformDrop"))
        _ = app.run("enter copy")
        _ = app.run("drop")
        XCTAssertEqual(app.run("load 0 text/plain"), "OK 2 \(Data("hi".utf8).base64EncodedString())")
        _ = app.run("conclude")
        _ = try world.daemon.waitForLog { log -> Bool? in
            try log.sessions().first?.outcome == "completed" && log.loads().first?.outcome == "completed" && log.refusals().count == 3 ? true : nil
        }
        let state = ["--state-directory", world.daemon.stateDirectory.path]

        let log = try dragctl(world, ["log"] + state)
        XCTAssertEqual(log.status, 0)
        assertNoControlCharacters(log.out)
        let sessionStarted = try timeCell(try XCTUnwrap(log.out.dropFirst().first), at: 13)
        let loadStarted = try timeCell(try XCTUnwrap(log.out.dropFirst(6).first), at: 8)
        XCTAssertEqual(log.out, [
            "SESSION KIND " + pad("STARTED", sessionStarted.count + 1) + pad("SOURCE", shown.count + 1) + pad("DESTINATION", shown.count + 1) + "OPERATION OUTCOME",
            "s1      drag " + pad(sessionStarted, sessionStarted.count + 1) + pad(shown, shown.count + 1) + pad(shown, shown.count + 1) + "copy      completed",
            "",
            "1 session listed.",
            "",
            "SESSION " + pad("STARTED", loadStarted.count + 1) + "TYPE       BYTES " + pad("DESTINATION", shown.count + 1) + "OUTCOME",
            "s1      " + pad(loadStarted, loadStarted.count + 1) + "text/plain 2     " + pad(shown, shown.count + 1) + "completed",
            "",
            "1 load listed.",
        ])
        struct Report: Decodable { var sessions: [SessionRecord]; var loads: [LoadRecord] }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        let report = try decoder.decode(Report.self, from: Data(try dragctl(world, ["log", "--json=short"] + state).out.joined().utf8))
        XCTAssertEqual(report.sessions.map { [$0.sourceApp, $0.destinationApp] }, [[path, path]])
        XCTAssertEqual(report.loads.map { [$0.sourceApp, $0.destinationApp] }, [[path, path]])

        let stats = try dragctl(world, ["stats"] + state)
        assertNoControlCharacters(stats.out)
        XCTAssertEqual(stats.out, [
            pad("SOURCE APP", shown.count + 1) + "LOADS BYTES", pad(shown, shown.count + 1) + "1     2B", "", "1 entry listed.", "",
            pad("DESTINATION APP", shown.count + 1) + "LOADS BYTES", pad(shown, shown.count + 1) + "1     2B", "", "1 entry listed.", "",
            "TYPE       LOADS BYTES", "text/plain 1     2B", "", "1 entry listed.", "",
            "OUTCOME   LOADS BYTES", "completed 1     2B", "", "1 entry listed.", "",
            "CHANNEL LOADS BYTES", "drag    1     2B", "", "1 entry listed.", "",
            "0 live sessions, 0 loads in flight, 0 of 0 descriptor threads busy.", "",
        ])

        let refusals = try dragctl(world, ["refusals"] + state)
        XCTAssertEqual(refusals.status, 0)
        assertNoControlCharacters(refusals.out)
        let times = try refusals.out.dropFirst().prefix(3).map { try timeCell($0, at: 0) }
        let timeWidth = times.map(\.count).max()! + 1
        let typeWidth = badTypeShown.count + 1, errorWidth = BrokerErrorCode.invalidArgument.busName.count + 1
        let rule = "\(world.paths.policyFile.path):1"
        func row(_ time: String, _ action: String, _ session: String, _ type: String, _ error: BrokerErrorCode, _ message: String) -> String {
            pad(time, timeWidth) + pad(shown, shown.count + 1) + pad(action, 13) + pad(session, 8) + pad(type, typeWidth)
                + pad(error.busName, errorWidth) + message
        }
        XCTAssertEqual(refusals.out, [
            pad("TIME", timeWidth) + pad("APP", shown.count + 1) + "ACTION       SESSION " + pad("TYPE", typeWidth) + pad("ERROR", errorWidth) + "MESSAGE",
            row(times[0], "Load", "s1", badTypeShown, .wrongState, "Loads are allowed only after PerformDrop"),
            row(times[1], "BeginSession", "-", "-", .invalidArgument,
                #"Item 0: 'text/x\\u{1B}[2J' is not a type identifier: it contains the control character U+001B"#),
            row(times[2], "PresentToken", "s1", "text/html", .accessDenied,
                "The administrator's policy hides text/html from \(shown) to \(shown) (rule at \(rule))"),
            "",
            "3 refusals listed.",
        ])
        let records = try decoder.decode([RefusalRecord].self, from: Data(try dragctl(world, ["refusals", "--json=short"] + state).out.joined().utf8))
        XCTAssertEqual(records.map(\.app), [path, path, path])
        XCTAssertEqual(records.map(\.subject), [badType, nil, "text/html"])
        XCTAssertEqual(records.map(\.message), [
            "Loads are allowed only after PerformDrop",
            "Item 0: 'text/x\\u{1B}[2J' is not a type identifier: it contains the control character U+001B",
            "The administrator's policy hides text/html from \(path) to \(path) (rule at \(rule))",
        ])
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

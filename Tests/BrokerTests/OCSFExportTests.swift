import BrokerProtocol
import Foundation
import TransferLog
import XCTest

@testable import dragctl

/// The OCSF 1.6.0 schema's own source, unpacked for one test, and `Tests/python/ocsf_validate.py` run over events.
struct OCSFSchema {
    /// Beside the project, where CI keeps it too; never inside the project.
    static let archive = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("../shared/tools/ocsf/ocsf-schema-1.6.0.tar.gz").standardized
    static let validator = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("python/ocsf_validate.py")

    let directory: URL
    var root: URL { directory.appendingPathComponent("ocsf-schema-1.6.0") }

    /// Unpacks into a temporary directory that `test` removes when it ends.
    init(for test: XCTestCase) throws {
        guard FileManager.default.fileExists(atPath: Self.archive.path) else {
            throw XCTSkip("The OCSF schema is not at \(Self.archive.path) (../shared/tools/ocsf/ beside the project): "
                          + "dragctl log --format=ocsf is not checked against it")
        }
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-ocsf-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let directory = directory
        test.addTeardownBlock { try? FileManager.default.removeItem(at: directory) }
        let tar = Process()
        tar.executableURL = URL(fileURLWithPath: "/bin/tar")
        tar.arguments = ["-xzf", Self.archive.path, "-C", directory.path]
        try tar.run()
        tar.waitUntilExit()
        XCTAssertEqual(tar.terminationStatus, 0, "tar -xzf \(Self.archive.path)")
    }

    /// The validator's verdict on `events`, one a line: its status and every line it printed.
    func validate(_ events: [String]) throws -> (status: Int32, out: [String]) {
        let file = directory.appendingPathComponent("events-\(UUID().uuidString).ndjson")
        try events.map { $0 + "\n" }.joined().write(to: file, atomically: true, encoding: .utf8)
        let child = try Child(executable: URL(fileURLWithPath: "/usr/bin/python3"),
                              arguments: [Self.validator.path, root.path, file.path], environment: ["PATH": "/usr/bin:/bin"])
        child.process.waitUntilExit()
        // Its last line says how many it checked; the reader may not have taken it yet when the process is gone.
        let deadline = Date().addingTimeInterval(5)
        while child.stdout.all(where: { $0.hasSuffix(" problem(s)") }).isEmpty && Date() < deadline { usleep(10_000) }
        return (child.process.terminationStatus, child.stdout.all { _ in true } + child.stderr.all { _ in true })
    }
}

fileprivate func milliseconds(_ date: Date) -> Int64 { MicrosecondTimestamp.microseconds(date) / 1000 }

fileprivate func jsonObject(_ line: String) throws -> [String: Any] {
    try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], line)
}

/// JSON as dragctl writes it, keys sorted: what an expected event is compared in.
fileprivate func json(_ value: Any?) throws -> String {
    String(decoding: try JSONSerialization.data(withJSONObject: value ?? NSNull(), options: [.sortedKeys, .withoutEscapingSlashes, .fragmentsAllowed]),
           as: UTF8.self)
}

/// The value at a dotted path of an event, e.g. "metadata.uid".
fileprivate func field(_ event: [String: Any], _ path: String) -> Any? {
    path.split(separator: ".").reduce(event as Any?) { value, key in (value as? [String: Any])?[String(key)] }
}

extension DragctlTests {
    /// Real records from the daemon, through `dragctl log --format=ocsf`: a flow rule's refusal, a load out of turn, a
    /// transfer and the session's end, each a line that the OCSF 1.6.0 schema accepts, with exact values.
    func testLogFormatOCSFValidatesAgainstTheSchema() throws {
        let schema = try OCSFSchema(for: self)
        let world = try World { _ in "[Flow]\nFrom=any\nTo=any\nTypes=text/html\nAction=deny\n" }
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(EndToEndTests.helloDrag)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("load 0 text/plain"), err(.wrongState, "Loads are allowed only after PerformDrop"))
        _ = destination.run("enter copy")
        _ = destination.run("drop")
        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 11 \(Data("hello, drop".utf8).base64EncodedString())")
        XCTAssertEqual(destination.run("conclude"), "OK")
        let (session, load, refusals) = try world.daemon.waitForLog { log -> (SessionRecord, LoadRecord, [RefusalRecord])? in
            guard let session = try log.sessions().first, session.outcome == "completed", let load = try log.loads().first,
                  case let refusals = try log.refusals(), refusals.count == 2 else { return nil }
            return (session, load, Array(refusals.reversed()))
        }
        let state = ["--state-directory", world.daemon.stateDirectory.path]

        let ocsf = try dragctl(world, ["log", "--format=ocsf"] + state)
        XCTAssertEqual(ocsf.status, 0)
        XCTAssertEqual(ocsf.err, [])
        XCTAssertEqual(try schema.validate(ocsf.out).out, ["4 event(s) checked, 0 problem(s)"])
        XCTAssertTrue(ocsf.out.allSatisfy { $0.hasPrefix("{") && $0.hasSuffix("}") && !$0.contains("\\/") }, "compact, one a line")
        let events = try ocsf.out.map(jsonObject)
        XCTAssertEqual(events.map { (field($0, "metadata.uid") as? String) ?? "?" },
                       ["refusal-1", "refusal-2", "load-\(try XCTUnwrap(load.id))", "session-s1"], "oldest first")

        let from = source.executable.path, to = destination.executable.path
        let product: [String: Any] = ["name": "dragbroker", "vendor_name": "dragbroker", "version": "0.1.0"]
        func metadata(_ uid: String, profiles: [String]? = nil) -> [String: Any] {
            var metadata: [String: Any] = ["version": "1.6.0", "product": product, "uid": uid, "correlation_uid": "s1",
                                           "log_name": "transfers", "log_provider": "dragbrokerd"]
            metadata["profiles"] = profiles
            return metadata
        }
        XCTAssertEqual(ocsf.out[2], try json([
            "class_uid": 6006, "class_name": "File Hosting Activity", "category_uid": 6, "category_name": "Application Activity",
            "activity_id": 6, "activity_name": "Copy", "type_uid": 600606, "type_name": "File Hosting Activity: Copy",
            "severity_id": 1, "severity": "Informational", "status_id": 1, "status": "Success", "status_detail": "completed",
            "time": milliseconds(load.endedAt), "start_time": milliseconds(load.startedAt), "end_time": milliseconds(load.endedAt),
            "duration": milliseconds(load.endedAt) - milliseconds(load.startedAt),
            "message": "Transfer of text/plain from \(from) to \(to): completed, 11 bytes",
            "actor": ["app_uid": to], "src_endpoint": ["uid": from], "dst_endpoint": ["uid": to],
            "file": ["name": "text/plain", "mime_type": "text/plain", "type_id": 0, "size": 11],
            "unmapped": ["channel": "drag", "load": try XCTUnwrap(load.loadID)],
            "metadata": metadata("load-\(try XCTUnwrap(load.id))"),
        ] as [String: Any]))

        let rule = "\(world.paths.policyFile.path):1"
        let hidden = "The administrator's policy hides text/html from \(from) to \(to) (rule at \(rule))"
        let accessDenied = BrokerErrorCode.accessDenied.busName
        XCTAssertEqual(refusals[0].message, hidden)
        XCTAssertEqual(ocsf.out[0], try json([
            "class_uid": 2006, "class_name": "Data Security Finding", "category_uid": 2, "category_name": "Findings",
            "activity_id": 1, "activity_name": "Create", "type_uid": 200601, "type_name": "Data Security Finding: Create",
            "severity_id": 2, "severity": "Low", "status_id": 1, "status": "New", "status_code": accessDenied, "status_detail": hidden,
            "time": milliseconds(refusals[0].at), "message": "Refused PresentToken for \(to): \(hidden)",
            "actor": ["app_uid": to, "process": ["pid": destination.reportedPID, "user": ["uid": "\(getuid())"]] as [String: Any]] as [String: Any],
            "file": ["name": "text/html", "mime_type": "text/html", "type_id": 0] as [String: Any],
            "finding_info": ["uid": "refusal-1", "title": "Refused PresentToken", "desc": hidden, "types": [accessDenied],
                             "created_time": milliseconds(refusals[0].at)] as [String: Any],
            "data_security": ["detection_system_id": 10, "detection_system": "Application-Level DLP", "data_lifecycle_state_id": 2,
                              "data_lifecycle_state": "Data in-Transit",
                              "policy": ["name": rule, "uid": rule, "is_applied": true] as [String: Any]] as [String: Any],
            "action_id": 2, "action": "Denied", "disposition_id": 2, "disposition": "Blocked", "is_alert": true,
            "unmapped": ["action": "PresentToken"],
            "metadata": metadata("refusal-1", profiles: ["security_control"]),
        ] as [String: Any]))
        XCTAssertEqual(field(events[1], "finding_info.title") as? String, "Refused Load")
        XCTAssertEqual(field(events[1], "status_code") as? String, BrokerErrorCode.wrongState.busName)
        XCTAssertEqual(try json(field(events[1], "is_alert")), "false", "no rule decided")
        XCTAssertNil(field(events[1], "data_security.policy"))
        XCTAssertEqual(field(events[3], "activity_name") as? String, "Copy")
        XCTAssertEqual(try json(field(events[3], "time")), "\(milliseconds(session.endedAt))")
        XCTAssertEqual(try json(field(events[3], "file")), #"{"name":"s1","type":"drag session","type_id":99,"uid":"s1"}"#)
        XCTAssertEqual(try json(field(events[3], "unmapped")), #"{"channel":"drag","items":1,"kind":"drag"}"#)

        // Filters: --app and --type match refusals too; --outcome is the loads' alone.
        XCTAssertEqual(try dragctl(world, ["log", "--format=ocsf", "--type", "text/html"] + state).out.map { try json(field(try jsonObject($0), "class_uid")) },
                       ["2006"])
        XCTAssertEqual(try dragctl(world, ["log", "--format=ocsf", "--outcome", "completed"] + state).out.count, 2)
        XCTAssertEqual(try dragctl(world, ["log", "--format=ocsf", "--app", from] + state).out.count, 2, "the load and its session")

        // --format=json is --json=short; --json is kept, and does not mix with another format.
        XCTAssertEqual(try dragctl(world, ["log", "--format=json"] + state).out, try dragctl(world, ["log", "--json=short"] + state).out)
        let mixed = try dragctl(world, ["log", "--format=ocsf", "-j"] + state)
        XCTAssertEqual(mixed.status, 64)
        XCTAssertTrue(mixed.err.joined().contains("--format=ocsf prints no JSON report: leave out --json and -j, or use --format=json"),
                      mixed.err.joined())
        let text = try dragctl(world, ["log", "--format=text", "--no-pager"] + state).out
        XCTAssertEqual(withoutHowLongAgo(text), withoutHowLongAgo(try dragctl(world, ["log", "--no-pager"] + state).out))
        XCTAssertEqual(text.count, 9, text.joined(separator: "\n"))
    }
}

/// The validator itself, so a pass means something: every kind of record dragctl maps is accepted, and events broken in
/// the ways an export goes wrong are each rejected with the exact reason.
final class OCSFSchemaTests: XCTestCase {
    static let start = Date(timeIntervalSince1970: 1_764_245_000.120)
    static let end = Date(timeIntervalSince1970: 1_764_245_000.123)

    static let load = LoadRecord(id: 7, sessionID: "s3", loadID: 1, sourceApp: "org.example.Photos", destinationApp: "/usr/bin/editor",
                                 typeIdentifier: "image/png", bytes: 4096, startedAt: start, endedAt: end, outcome: "completed",
                                 sourceTeam: "org.example")
    static let refusal = RefusalRecord(id: 9, at: end, app: "com.other.Mail", uid: 1000, pid: 4242, action: "PresentToken",
                                       sessionID: "s3", subject: "text/plain, text/html", errorName: BrokerErrorCode.accessDenied.busName,
                                       message: "The administrator's policy hides text/plain, text/html", rule: "/etc/dragbroker/dragbroker.conf:4")

    func line(_ event: OCSF.Event) throws -> String { try OCSF.line(event) }

    func testEveryKindOfRecordIsAValidEvent() throws {
        let schema = try OCSFSchema(for: self)
        var denied = Self.load
        denied.outcome = "denied"
        denied.errorName = BrokerErrorCode.accessDenied.busName
        var cancelled = Self.load
        cancelled.outcome = "cancelled"
        let sessions = [
            SessionRecord(sessionID: "s3", sourceApp: "org.example.Photos", destinationApp: "/usr/bin/editor", itemCount: 2,
                          operation: "move", outcome: "completed", startedAt: Self.start, endedAt: Self.end),
            SessionRecord(sessionID: "s4", sourceApp: "org.example.Photos", destinationApp: nil, itemCount: 1,
                          operation: "cancel", outcome: "cancelled", errorName: BrokerErrorCode.cancelled.busName,
                          startedAt: Self.start, endedAt: Self.end),
            SessionRecord(sessionID: "s5", kind: "copy", sourceApp: "org.example.Photos", destinationApp: nil, itemCount: 1,
                          operation: "copy", outcome: "expired", startedAt: Self.start, endedAt: Self.end),
        ]
        let suppressed = RefusalRecord(id: 10, at: Self.end, app: "app com.other.Mail", uid: 0, pid: 0, action: "RateLimited",
                                       sessionID: nil, subject: nil, errorName: BrokerErrorCode.limitExceeded.busName,
                                       message: "Suppressed 3 refusals", rule: nil)
        let events = [OCSF.event(for: Self.load), OCSF.event(for: denied), OCSF.event(for: cancelled)]
            + sessions.compactMap(OCSF.event(for:)) + [OCSF.event(for: Self.refusal), OCSF.event(for: suppressed)]
        XCTAssertEqual(try schema.validate(try events.map(line)).out, ["8 event(s) checked, 0 problem(s)"])

        XCTAssertEqual(events.map { "\($0["type_uid"]!) \($0["activity_name"]!) \($0["status_id"]!)" },
                       ["600606 Copy 1", "200601 Create 1", "600606 Copy 2", "600607 Move 1", "600699 cancel 2", "600606 Copy 2",
                        "200601 Create 1", "200601 Create 1"])
        XCTAssertEqual(try json(field(try jsonObject(try line(events[1])), "file.size")), "4096", "the bytes a denied load moved")
        XCTAssertNil(OCSF.event(for: SessionRecord(sessionID: "s6", sourceApp: "a", destinationApp: nil, itemCount: 1, operation: "cancel",
                                                   outcome: SessionRecord.open, startedAt: Self.start, endedAt: Self.start)),
                     "an open session has not ended")
        XCTAssertEqual(try line(OCSF.event(for: Self.load)),
                       #"{"activity_id":6,"activity_name":"Copy","actor":{"app_uid":"/usr/bin/editor"},"category_name":"Application Activity","#
                       + #""category_uid":6,"class_name":"File Hosting Activity","class_uid":6006,"dst_endpoint":{"uid":"/usr/bin/editor"},"#
                       + #""duration":3,"end_time":1764245000123,"file":{"mime_type":"image/png","name":"image/png","size":4096,"type_id":0},"#
                       + #""message":"Transfer of image/png from org.example.Photos to /usr/bin/editor: completed, 4096 bytes","#
                       + #""metadata":{"correlation_uid":"s3","log_name":"transfers","log_provider":"dragbrokerd","#
                       + #""product":{"name":"dragbroker","vendor_name":"dragbroker","version":"0.1.0"},"uid":"load-7","version":"1.6.0"},"#
                       + #""severity":"Informational","severity_id":1,"src_endpoint":{"uid":"org.example.Photos"},"start_time":1764245000120,"#
                       + #""status":"Success","status_detail":"completed","status_id":1,"time":1764245000123,"#
                       + #""type_name":"File Hosting Activity: Copy","type_uid":600606,"unmapped":{"channel":"drag","load":1,"source_team":"org.example"}}"#)
    }

    func testBrokenEventsAreRejectedWithTheReason() throws {
        let schema = try OCSFSchema(for: self)
        let transfer = OCSF.event(for: Self.load), refusal = OCSF.event(for: Self.refusal)
        func broken(_ event: OCSF.Event, _ change: (inout OCSF.Event) -> Void) throws -> String {
            var event = event
            change(&event)
            return try line(event)
        }
        let verdict = try schema.validate([
            try line(transfer),
            try broken(transfer) { $0["class_uid"] = nil },
            try broken(transfer) { $0["severity_id"] = 7 },
            try broken(transfer) { $0["activity_id"] = 42 },
            try broken(transfer) { $0["time"] = 1_764_245_000 },
            try broken(transfer) { $0["file"] = ["type_id": 0, "size": 4096] as OCSF.Event },
            try broken(transfer) { $0["actor"] = ["app_uid": 7] as OCSF.Event },
            try broken(transfer) { $0["bytes"] = 4096 },
            try broken(refusal) { $0["metadata"] = (($0["metadata"] as? OCSF.Event) ?? [:]).merging(["profiles": []]) { $1 } },
            try broken(refusal) { $0["metadata"] = (($0["metadata"] as? OCSF.Event) ?? [:]).merging(["profiles": ["security_control", "cloud", "drag"]]) { $1 } },
            try broken(refusal) { $0["type_uid"] = 600601 },
            try broken(refusal) { $0["finding_info"] = ["title": "Refused PresentToken"] as OCSF.Event },
        ])
        XCTAssertEqual(verdict.status, 1)
        XCTAssertEqual(verdict.out, [
            "line 2: class_uid: required by base_event, missing",
            "line 3: severity_id: 7 is not one of 0, 1, 2, 3, 4, 5, 6, 99",
            "line 4: type_uid: 600606, but file_hosting makes it 600642",
            "line 4: activity_id: 42 is not one of 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 99",
            "line 5: time: 1764245000 is not a time in milliseconds since 1970",
            "line 6: file.name: required by file, missing",
            "line 7: actor.app_uid: 7 is not a string (string_t)",
            "line 8: bytes: not an attribute of file_hosting",
            "line 9: action: belongs to the profile security_control, not claimed in metadata.profiles",
            "line 9: action_id: belongs to the profile security_control, not claimed in metadata.profiles",
            "line 9: disposition: belongs to the profile security_control, not claimed in metadata.profiles",
            "line 9: disposition_id: belongs to the profile security_control, not claimed in metadata.profiles",
            "line 10: metadata.profiles: \"drag\" is no profile of this schema",
            "line 10: cloud: required by data_security_finding, missing",
            "line 11: type_uid: 600601, but data_security_finding makes it 200601",
            "line 12: finding_info.uid: required by finding_info, missing",
            "12 event(s) checked, 16 problem(s)",
        ])
    }
}

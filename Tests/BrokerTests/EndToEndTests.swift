import BrokerProtocol
import BusKit
import Foundation
import TransferLog
import XCTest

/// A real drag through the real daemon: separate source and destination processes on a
/// private dbus-daemon, bytes through pipes, the record in SQLite.
final class EndToEndTests: XCTestCase {
    static let helloDrag = #"{"items":[{"name":"hello.txt","width":320,"height":200,"reps":[{"type":"text/plain","text":"hello, drop"},{"type":"text/html","text":"<p>hello, drop</p>"}]}]}"#

    func testDropDeliversExactBytesLazilyAndLogsTheTransfer() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, path) = try source.begin(Self.helloDrag)
        XCTAssertEqual(token.count, 64, "a 256-bit token in hex")

        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("items"),
                       #"OK [{"preferredHeight":200,"preferredWidth":320,"suggestedName":"hello.txt","typeIdentifiers":["text\/plain","text\/html"]}]"#)
        XCTAssertEqual(destination.run("load 0 text/plain"), err(.wrongState, "Loads are allowed only after PerformDrop"))
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("update move"), "OK copy", "a move across apps is answered as a copy")
        XCTAssertEqual(destination.run("update copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertTrue(source.waitFor("EVENT willEnd copy"))
        XCTAssertEqual(source.handlerCalls, [], "no load handler runs before a load")

        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 11 " + Data("hello, drop".utf8).base64EncodedString())
        XCTAssertEqual(source.handlerCalls, ["HANDLER 0 text/plain"], "exactly one handler call, for the requested type")

        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertTrue(source.waitFor("EVENT ended copy -"))
        XCTAssertTrue(source.waitFor("EVENT transferFinished"))
        XCTAssertTrue(destination.waitFor("EVENT ended copy -"))
        XCTAssertEqual(destination.run("load 0 text/plain"),
                       err(.notFound, "No live session at \(path): it ended or never existed"))

        let (sessions, loads) = try world.daemon.waitForLog { log -> ([SessionRecord], [LoadRecord])? in
            let sessions = try log.sessions()
            let loads = try log.loads()
            return sessions.isEmpty || loads.isEmpty ? nil : (sessions, loads)
        }
        XCTAssertEqual(sessions.count, 1)
        XCTAssertEqual(sessions[0].sessionID, "s1")
        XCTAssertEqual(sessions[0].sourceApp, source.executable.path)
        XCTAssertEqual(sessions[0].destinationApp, destination.executable.path)
        XCTAssertEqual(sessions[0].itemCount, 1)
        XCTAssertEqual(sessions[0].operation, "copy")
        XCTAssertEqual(sessions[0].outcome, "completed")
        XCTAssertNil(sessions[0].errorName)
        XCTAssertEqual(loads.count, 1)
        XCTAssertEqual(loads[0].sessionID, "s1")
        XCTAssertEqual(loads[0].sourceApp, source.executable.path)
        XCTAssertEqual(loads[0].destinationApp, destination.executable.path)
        XCTAssertEqual(loads[0].typeIdentifier, "text/plain")
        XCTAssertEqual(loads[0].bytes, 11)
        XCTAssertEqual(loads[0].outcome, "completed")
        XCTAssertLessThanOrEqual(loads[0].startedAt, loads[0].endedAt)
    }

    /// A bystander that read the token (any X11 client can read the selection) presents it and
    /// calls Enter while the drag is over the real destination: the real drop still succeeds,
    /// bytes exact, and the bystander's own Exit and Enter change nothing for it.
    func testABystandersEnterDoesNotBreakTheRealDrop() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let bystander = try world.peer("bystander-app")
        let (token, path) = try source.begin(Self.helloDrag)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(bystander.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(bystander.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("update copy"), "OK copy")
        XCTAssertEqual(bystander.run("exit"), "OK")
        XCTAssertEqual(bystander.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 11 \(Data("hello, drop".utf8).base64EncodedString())")
        XCTAssertEqual(bystander.run("load 0 text/plain"), err(.accessDenied, "Only the destination that performed the drop may load from session \(path.split(separator: "/").last!)"))
        XCTAssertEqual(destination.run("conclude"), "OK")
    }

    /// One matching rule for ConformingItems and Load: the exact listed type always works, a
    /// bare MIME type takes a listed type with parameters (the first listed of two charsets),
    /// a UTI or a wildcard loads what ConformingItems says yes to, and the closest match wins
    /// over one listed before it that only conforms.
    func testLoadServesWhatConformingItemsSaysYesTo() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let drag = #"{"items":[{"name":"note","reps":[{"type":"text/html","text":"<b>x</b>"},"#
            + #"{"type":"text/plain;charset=iso-8859-1","text":"latin"},{"type":"text/plain;charset=utf-8","text":"utf"}]},"#
            + #"{"name":"picture","reps":[{"type":"image/png","text":"PNG"}]}]}"#
        let (token, path) = try source.begin(drag)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("conforming text/plain"), "OK 0")
        XCTAssertEqual(destination.run("conforming text/plain;charset=utf-8"), "OK 0")
        XCTAssertEqual(destination.run("conforming text/plain;charset=utf-16"), "OK ")
        XCTAssertEqual(destination.run("conforming public.png"), "OK 1")
        XCTAssertEqual(destination.run("conforming public.image"), "OK 1")
        XCTAssertEqual(destination.run("conforming */*"), "OK 0,1")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")

        let expectations: [(request: String, bytes: String, served: String)] = [
            ("text/plain", "latin", "text/plain;charset=iso-8859-1"),
            ("text/plain;charset=utf-8", "utf", "text/plain;charset=utf-8"),
            ("TEXT/PLAIN;charset=\"UTF-8\"", "utf", "text/plain;charset=utf-8"),
            ("public.utf8-plain-text", "utf", "text/plain;charset=utf-8"),
            ("text/html", "<b>x</b>", "text/html"),
            ("text/*", "<b>x</b>", "text/html"),
        ]
        for (request, bytes, served) in expectations {
            XCTAssertEqual(destination.run("load 0 \(request)"), "OK \(bytes.utf8.count) \(Data(bytes.utf8).base64EncodedString())", request)
            XCTAssertTrue(source.waitFor("HANDLER 0 \(served)"), "\(request) is served as \(served)")
        }
        for request in ["public.png", "image/*", "public.image"] {
            XCTAssertEqual(destination.run("load 1 \(request)"), "OK 3 \(Data("PNG".utf8).base64EncodedString())", request)
            XCTAssertTrue(source.waitFor("HANDLER 1 image/png"), request)
        }
        for request in ["image/png", "text/plain;charset=utf-16", "public.image"] {
            XCTAssertEqual(destination.run("load 0 \(request)"),
                           err(.notFound, "Item 0 has no representation that matches '\(request)'"), request)
        }
        XCTAssertEqual(destination.run("load 0 image/"), err(.invalidArgument, "'image/' is not a type pattern: the subtype after '/' is empty"))
        // A wrong D-Bus type is the bus layer's refusal, as the page says, before any broker rule.
        let probe = try BusProbe(address: world.bus.address)
        let wrongType = probe.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "Load") { m throws(BusError) in
            try m.append(Int32(0))
            try m.append("text/plain")
        }
        XCTAssertEqual(wrongType.errorName, "org.freedesktop.DBus.Error.InvalidArgs")
        XCTAssertEqual(destination.run("conclude"), "OK")
    }

    func testUnknownTokenIsNotFound() throws {
        let world = try World()
        let destination = try world.peer("destination-app")
        XCTAssertEqual(destination.run("present " + String(repeating: "ab", count: 32)), err(.notFound, "No live session has this token"))
        XCTAssertEqual(destination.run("present not-hex"), err(.notFound, "No live session has this token"))
    }

    func testKillingTheSourceEndsTheSessionForTheDestination() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, path) = try source.begin(Self.helloDrag)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        source.kill()
        XCTAssertTrue(destination.waitFor("EVENT ended copy \(BrokerErrorCode.disconnected.busName)"), destination.stdout.text)
        XCTAssertEqual(destination.run("load 0 text/plain"), err(.notFound, "No live session at \(path): it ended or never existed"))
        let record = try world.daemon.waitForLog { try $0.sessions().first }
        XCTAssertEqual(record.outcome, "source-disconnected")
        XCTAssertEqual(record.errorName, BrokerErrorCode.disconnected.busName)
    }

    func testKillingTheSourceMidLoadFailsTheLoadWithDisconnected() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(#"{"items":[{"reps":[{"type":"text/plain","stall":true}]}]}"#)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        destination.send("load 0 text/plain")
        XCTAssertNotNil(source.stdout.take { $0 == "HANDLER 0 text/plain" })
        source.kill()
        XCTAssertEqual(destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") },
                       err(.disconnected, "The source app \(source.executable.path) disconnected"))
        XCTAssertTrue(destination.waitFor("EVENT ended copy \(BrokerErrorCode.disconnected.busName)"))
        let load = try world.daemon.waitForLog { try $0.loads().first }
        XCTAssertEqual(load.outcome, "disconnected")
        XCTAssertEqual(load.bytes, 0)
    }

    func testSourceCancelTellsTheDestination() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(Self.helloDrag)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("cancel"), err(.notFound, "no presented drag"), "a destination cannot cancel through a drag it does not own")
        XCTAssertEqual(source.run("cancel"), "OK")
        XCTAssertTrue(destination.waitFor("EVENT ended cancel \(BrokerErrorCode.cancelled.busName)"))
        XCTAssertTrue(source.waitFor("EVENT ended cancel \(BrokerErrorCode.cancelled.busName)"))
    }

    func testProviderFailureReachesTheDestinationByName() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(#"{"items":[{"reps":[{"type":"image/png","fail":"render failed"}]}]}"#)
        _ = destination.run("present \(token)")
        _ = destination.run("enter copy")
        _ = destination.run("drop")
        XCTAssertEqual(destination.run("load 0 image/png"),
                       err(.providerFailed, "The source failed to provide the data: \(BrokerErrorCode.providerFailed.busName): render failed"))
        XCTAssertEqual(destination.run("load 0 image/gif"), err(.notFound, "Item 0 has no representation that matches 'image/gif'"))
        XCTAssertEqual(destination.run("load 3 image/png"), err(.notFound, "No item 3: session s1 has 1 item(s)"))
    }

    func testPartiesAreCheckedAtEverySurface() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let bystander = try world.peer("bystander-app")
        let (token, path) = try source.begin(Self.helloDrag)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("update copy"), err(.wrongState, "Call Enter before Update: the drag is not over this destination"))
        XCTAssertEqual(destination.run("drop"), err(.wrongState, "Call Enter with a proposal before PerformDrop"))
        XCTAssertEqual(destination.run("enter forbidden"), "OK forbidden")
        XCTAssertEqual(destination.run("drop"), err(.wrongState, "The current proposal allows 'forbidden': a drop needs copy or move"))
        XCTAssertEqual(destination.run("enter bogus"), err(.invalidArgument, "peer: bad operation bogus"))
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("drop"), err(.wrongState, "Session s1 is dropped: it has already been dropped"))

        // A bystander that joins late may not load: the drop belongs to the destination.
        XCTAssertEqual(bystander.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(bystander.run("load 0 text/plain"),
                       err(.accessDenied, "Only the destination that performed the drop may load from session s1"))
        XCTAssertEqual(bystander.run("conclude"), err(.accessDenied, "Only the destination that performed the drop may conclude session s1"))
        XCTAssertEqual(source.handlerCalls, [])
    }

    func testSessionIDsAreNotReusedAfterARestart() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let (_, first) = try source.begin(Self.helloDrag)
        XCTAssertEqual(first, "/org/dragbroker/Broker1/session/s1")
        try world.restartDaemon()
        XCTAssertTrue(source.waitFor("EVENT ended cancel \(BrokerErrorCode.cancelled.busName)"), "shutdown ends live sessions with a reason")
        let record = try world.daemon.waitForLog { try $0.sessions().first }
        XCTAssertEqual(record.outcome, "cancelled")
        XCTAssertEqual(record.errorName, BrokerErrorCode.cancelled.busName)

        let newSource = try world.peer("source-app")
        let (_, second) = try newSource.begin(Self.helloDrag)
        XCTAssertEqual(second, "/org/dragbroker/Broker1/session/s2")
    }
}

import BrokerProtocol
import Foundation
import TransferLog
import XCTest

/// The session follows the drag: a drag released over nothing, or a drop never concluded,
/// does not keep its items and token alive until the source disconnects.
final class DeadlineTests: XCTestCase {
    func testADragNeverDroppedEndsAtDragTimeoutForEveryParty() throws {
        let world = try World { _ in "[Limits]\nDragTimeoutSec=1\n" }
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let latecomer = try world.peer("latecomer-app")
        let (token, _) = try source.begin(EndToEndTests.helloDrag)
        XCTAssertEqual(destination.run("present \(token)").prefix(3), "OK ")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("exit"), "OK")

        let why = "WHY Session s1 was not dropped within 1 s of BeginSession (DragTimeoutSec=)"
        XCTAssertTrue(source.waitFor("EVENT ended cancel \(BrokerErrorCode.timeout.busName)"), source.stdout.text)
        XCTAssertTrue(source.waitFor(why))
        XCTAssertTrue(destination.waitFor("EVENT ended cancel \(BrokerErrorCode.timeout.busName)"), destination.stdout.text)
        XCTAssertTrue(destination.waitFor(why))
        XCTAssertEqual(latecomer.run("present \(token)"), err(.notFound, "No live session has this token"), "the token died with the session")

        let record = try world.daemon.waitForLog { try $0.sessions().first }
        XCTAssertEqual(record.outcome, "timed-out")
        XCTAssertEqual(record.errorName, BrokerErrorCode.timeout.busName)
        XCTAssertEqual(record.operation, "cancel")
    }

    func testADropNeverConcludedEndsAtConcludeTimeoutCountedFromTheLastLoad() throws {
        let world = try World { _ in "[Limits]\nConcludeTimeoutSec=2\n" }
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(EndToEndTests.helloDrag)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 11 " + Data("hello, drop".utf8).base64EncodedString())

        let why = "WHY The destination of session s1 neither loaded nor concluded within 2 s (ConcludeTimeoutSec=)"
        XCTAssertTrue(source.waitFor("EVENT ended copy \(BrokerErrorCode.timeout.busName)"), source.stdout.text)
        XCTAssertTrue(source.waitFor(why))
        XCTAssertTrue(destination.waitFor("EVENT ended copy \(BrokerErrorCode.timeout.busName)"), destination.stdout.text)
        XCTAssertTrue(destination.waitFor(why))
        XCTAssertEqual(destination.run("conclude"), err(.notFound, "No live session at /org/dragbroker/Broker1/session/s1: it ended or never existed"))
        XCTAssertFalse(source.stdout.text.contains("EVENT transferFinished"), "a transfer cut short is not finished")

        let (sessions, loads) = try world.daemon.waitForLog { log -> ([SessionRecord], [LoadRecord])? in
            let sessions = try log.sessions()
            return sessions.isEmpty ? nil : (sessions, try log.loads())
        }
        XCTAssertEqual(sessions.map(\.outcome), ["timed-out"])
        XCTAssertEqual(sessions.map(\.errorName), [BrokerErrorCode.timeout.busName])
        XCTAssertEqual(loads.map(\.outcome), ["completed"], "the load that finished before the deadline stays complete")
    }

    func testTheClientCancelsADragReleasedOverNothingAtOnce() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(EndToEndTests.helloDrag)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("exit"), "OK")
        XCTAssertEqual(source.run("dragended nodrop"), "OK")
        XCTAssertTrue(destination.waitFor("EVENT ended cancel \(BrokerErrorCode.cancelled.busName)"), destination.stdout.text)
        XCTAssertTrue(destination.waitFor("WHY The source cancelled the drag"))
        XCTAssertTrue(source.waitFor("EVENT ended cancel \(BrokerErrorCode.cancelled.busName)"))

        // After a drop the toolkit says the drag ended with one: the transfer goes on.
        let (second, _) = try source.begin(EndToEndTests.helloDrag)
        _ = destination.run("present \(second)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertTrue(source.waitFor("EVENT willEnd copy"))
        XCTAssertEqual(source.run("dragended drop"), "OK")
        XCTAssertEqual(source.run("dragended nodrop"), "OK", "a toolkit that reports no drop after the drop is ignored")
        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 11 " + Data("hello, drop".utf8).base64EncodedString())
        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertTrue(source.waitFor("EVENT ended copy -"))
        XCTAssertTrue(source.waitFor("EVENT transferFinished"))

        let sessions = try world.daemon.waitForLog { log in try log.sessions().count == 2 ? log.sessions() : nil }
        XCTAssertEqual(Set(sessions.map { "\($0.sessionID) \($0.outcome)" }), ["s1 cancelled", "s2 completed"])
    }
}

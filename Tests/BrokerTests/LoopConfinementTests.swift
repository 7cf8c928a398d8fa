import BrokerProtocol
import Foundation
import XCTest

/// The client library keeps every sd-bus object on its connection's event loop thread, and
/// BusKit traps (in release builds too) when a message, slot or bus is released anywhere else.
/// These runs make that happen if anything lets a message out: many tasks calling and loading
/// at once from the cooperative pool, in both roles, and connections dropped off their loop.
final class LoopConfinementTests: XCTestCase {
    func testConcurrentCallsAndLoadsKeepMessagesOnTheLoop() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let size = 262_144
        let (token, path) = try source.begin(#"{"items":[{"name":"x","reps":[{"type":"application/x-big","size":\#(size),"chunk":65536,"announce":true}]}]}"#)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")

        // 8 tasks × 5 rounds: 5 calls and 2 loads (one watching progress) per round.
        XCTAssertEqual(destination.run("stress 8 5 0 application/x-big", timeout: 120), "OK 200 80 \(80 * size)",
                       destination.stderr.text)
        XCTAssertEqual(source.handlerCalls.count, 81, "every load ran its handler, concurrently in the source")
        XCTAssertEqual(destination.run("churn 5"), "OK 5", destination.stderr.text)

        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertTrue(source.waitFor("EVENT transferFinished"), source.stderr.text)
        XCTAssertTrue(destination.waitFor("EVENT ended copy -"))
        XCTAssertEqual(source.run("sessions"), "OK ")
        XCTAssertEqual(source.stderr.all { $0.contains("Fatal error") }, [])
        XCTAssertEqual(destination.stderr.all { $0.contains("Fatal error") }, [])
    }
}

extension LoopConfinementTests {
    /// `BrokerConnection.taskExecutor`: a task that prefers it is on the connection's loop
    /// before a call and is resumed there by the reply, with no thread in between; a plain
    /// task is resumed on another thread.
    func testATaskPreferringTheConnectionsExecutorRunsItsCallsOnTheLoop() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, path) = try source.begin(#"{"items":[{"name":"x","reps":[{"type":"text/plain","text":"hi"}]}]}"#)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("updatethreads copy loop"), "OK copy dragbroker-clie dragbroker-clie")
        let plain = destination.run("updatethreads copy task").split(separator: " ").map(String.init)
        XCTAssertEqual(plain.prefix(2), ["OK", "copy"])
        XCTAssertEqual(plain.count, 4, plain.joined(separator: " "))
        XCTAssertNotEqual(plain.last, "dragbroker-clie", "a plain task is resumed off the loop")
        XCTAssertEqual(destination.run("update copy"), "OK copy", "the session still answers from any task")
    }
}

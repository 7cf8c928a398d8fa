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
        let (world, source, destination) = try enteredDrop()
        defer { withExtendedLifetime((world, source)) {} }
        XCTAssertEqual(destination.run("updatethreads copy loop"), "OK copy dragbroker-clie dragbroker-clie")
        let plain = destination.run("updatethreads copy task").split(separator: " ").map(String.init)
        XCTAssertEqual(plain.prefix(2), ["OK", "copy"])
        XCTAssertEqual(plain.count, 4, plain.joined(separator: " "))
        XCTAssertNotEqual(plain.last, "dragbroker-clie", "a plain task is resumed off the loop")
        XCTAssertEqual(destination.run("update copy"), "OK copy", "the session still answers from any task")
    }

    /// A task on the loop's thread that does not prefer the loop (one started immediately
    /// there) has its call sent on the spot and its reply resume it on another thread: the
    /// reply was decoded on the loop, so no message follows it there, and nothing traps.
    func testACallFromATaskTheLoopWillNotResumeLeavesTheReplyOnTheLoop() throws {
        let (world, source, destination) = try enteredDrop()
        defer { withExtendedLifetime((world, source)) {} }
        for _ in 0..<20 {
            let answer = destination.run("updatethreads copy immediate").split(separator: " ").map(String.init)
            XCTAssertEqual(answer.prefix(3), ["OK", "copy", "dragbroker-clie"], answer.joined(separator: " "))
            XCTAssertEqual(answer.count, 4, answer.joined(separator: " "))
            XCTAssertNotEqual(answer.last, "dragbroker-clie", "the reply resumes it where it prefers, off the loop")
        }
        XCTAssertEqual(destination.run("update copy"), "OK copy")
        XCTAssertEqual(destination.stderr.all { $0.contains("Fatal error") || $0.contains("precondition") }, [])
    }

    /// A world, and a source's drag of a text item that the destination entered proposing a copy.
    private func enteredDrop() throws -> (World, source: Peer, destination: Peer) {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, path) = try source.begin(#"{"items":[{"name":"x","reps":[{"type":"text/plain","text":"hi"}]}]}"#)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        return (world, source, destination)
    }
}

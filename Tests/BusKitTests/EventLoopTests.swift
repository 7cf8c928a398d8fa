@testable import BusKit
import Foundation
import Synchronization
import XCTest

/// Who may touch what belongs to an event loop: the thread running it, or anyone while none does.
final class EventLoopTests: XCTestCase {
    func testOwnershipFollowsTheThreadRunningTheLoop() throws {
        let loop = try EventLoop()
        XCTAssertFalse(loop.isRunning)
        XCTAssertTrue(loop.isCurrentOrIdle, "before start, the thread setting it up owns it")
        XCTAssertFalse(loop.isCurrent)

        loop.start(name: "test-loop")
        XCTAssertTrue(loop.isRunning)
        XCTAssertFalse(loop.isCurrentOrIdle, "another thread runs it now")
        let onLoop = Mutex<[Bool]>([])
        let done = DispatchSemaphore(value: 0)
        loop.execute {
            onLoop.withLock { $0 = [loop.isCurrent, loop.isCurrentOrIdle] }
            done.signal()
        }
        done.wait()
        XCTAssertEqual(onLoop.withLock { $0 }, [true, true])

        loop.stop()
        XCTAssertFalse(loop.isRunning)
        XCTAssertTrue(loop.isCurrentOrIdle, "after stop, whoever tears it down owns it")
    }

    /// Work the loop's own thread queues (as a reply resuming a task does) runs with nothing
    /// else to wake it, from a callback and from queued work alike, in the order it was queued;
    /// from a callback, as soon as the callback returns, in the same iteration of sd-event
    /// rather than after another epoll_wait. Work from another thread still wakes the loop.
    func testWorkTheLoopQueuesItselfRunsWithoutAWakeUp() throws {
        let loop = try EventLoop()
        loop.start(name: "test-loop")
        let order = Mutex<[String]>([])
        let iterations = Mutex<[UInt64]>([])
        let done = DispatchSemaphore(value: 0)
        loop.execute {
            // From queued work: taken by the drain under way.
            loop.execute { order.withLock { $0.append("from work") } }
            // From a callback, which no drain is under way for.
            loop.soon {
                let queuedIn = loop.iteration
                loop.execute {
                    iterations.withLock { $0 = [queuedIn, loop.iteration] }
                    order.withLock { $0.append("from a callback") }
                    loop.execute {
                        order.withLock { $0.append("and from that") }
                        done.signal()
                    }
                }
            }
        }
        // Stuck work would also keep stop() waiting: the loop is left running if it fails.
        guard done.wait(timeout: .now() + 5) == .success else {
            return XCTFail("work the loop queued for itself never ran; ran: \(order.withLock { $0 })")
        }
        XCTAssertEqual(order.withLock { $0 }, ["from work", "from a callback", "and from that"])
        let (queuedIn, ranIn) = iterations.withLock { ($0[0], $0[1]) }
        XCTAssertEqual(ranIn, queuedIn, "work a callback queued runs in the callback's own iteration")
        // Another thread's work after the loop went back to sleep.
        Thread.sleep(forTimeInterval: 0.05)
        loop.execute { done.signal() }
        XCTAssertEqual(done.wait(timeout: .now() + 5), .success)
        loop.stop()
    }

    /// A task that prefers the loop runs its nonisolated code there as it is, not isolated to
    /// the loop: calling one nonisolated async function from another takes no trip through the
    /// loop's queue. (Run isolated, each such call switched off the isolation and queued again.)
    func testNonisolatedCallsInATaskThatPrefersTheLoopStayOnItWithoutQueueing() async throws {
        let loop = try EventLoop()
        loop.start(name: "test-loop")
        defer { loop.stop() }
        let (queued, onLoop) = await withTaskExecutorPreference(loop.taskExecutor) {
            let before = loop.jobsRun
            let onLoop = await Self.nonisolatedStep(loop, depth: 3)
            return (loop.jobsRun - before, onLoop)
        }
        XCTAssertEqual(onLoop, [true, true, true, true])
        XCTAssertEqual(queued, 0, "nested nonisolated calls on the loop's task executor queued \(queued) job(s)")
        // An actor whose executor is the loop still runs isolated to it.
        let actor = LoopActor(loop: loop)
        let isolated = await actor.isIsolated()
        XCTAssertTrue(isolated)
    }

    /// Who may await a reply on the loop (`Bus.call`): a task on the loop's thread that the
    /// reply will resume there. A task that prefers the loop is one, and an actor on the loop;
    /// code on the loop's thread that no such task runs is not. (An optimized build lets a
    /// nonisolated task run on there after `withTaskExecutorPreference` returns, until it next
    /// suspends: a session's call sent on the spot from there had its reply resume it on the
    /// concurrency pool, the reply message with it, which traps in `Message.deinit` off the
    /// loop. `BrokerConnection` therefore decodes each reply in its callback, on the loop, and
    /// lets only the decoded value resume the caller; `Bus.call` asserts `holdsTask`.)
    func testOnlyATaskThatAReplyResumesOnTheLoopHoldsIt() async throws {
        let loop = try EventLoop()
        loop.start(name: "test-loop")
        defer { loop.stop() }
        let preferring = await withTaskExecutorPreference(loop.taskExecutor) {
            (loop.isCurrent, loop.holdsTask(isolatedTo: #isolation))
        }
        XCTAssertTrue(preferring == (true, true), "a task preferring the loop: on its thread \(preferring.0), holds it \(preferring.1)")
        let actorHolds = await LoopActor(loop: loop).holdsLoop()
        XCTAssertTrue(actorHolds)
        let notATask = await withCheckedContinuation { continuation in
            loop.execute { continuation.resume(returning: (loop.isCurrent, loop.holdsTask(isolatedTo: nil))) }
        }
        XCTAssertTrue(notATask == (true, false), "work on the loop outside a task: on its thread \(notATask.0), holds it \(notATask.1)")
        XCTAssertFalse(loop.holdsTask(isolatedTo: nil), "off the loop's thread")
    }

    private static func nonisolatedStep(_ loop: EventLoop, depth: Int) async -> [Bool] {
        let here = loop.isCurrent
        guard depth > 0 else { return [here] }
        return await [here] + nonisolatedStep(loop, depth: depth - 1)
    }

    func testRunUntilMakesTheCallerTheLoopThread() throws {
        let loop = try EventLoop()
        var seen: [Bool] = []
        var done = false
        loop.soon {
            seen = [loop.isCurrent, loop.isRunning]
            done = true
        }
        try loop.run { done }
        XCTAssertEqual(seen, [true, true])
        XCTAssertFalse(loop.isRunning)
    }

    func testALoopBoundValueIsReadAndChangedOnItsLoop() throws {
        let loop = try EventLoop()
        var bound = LoopBound([1, 2], loop: loop)
        bound.value.append(3)
        XCTAssertEqual(bound.value, [1, 2, 3])
        loop.start(name: "test-loop")
        defer { loop.stop() }
        let shared = bound
        let seen = Mutex<[Int]>([])
        let done = DispatchSemaphore(value: 0)
        loop.execute {
            seen.withLock { $0 = shared.value }
            done.signal()
        }
        done.wait()
        XCTAssertEqual(seen.withLock { $0 }, [1, 2, 3])
    }
}

private actor LoopActor {
    let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    init(loop: EventLoop) { self.loop = loop }
    func isIsolated() -> Bool {
        loop.isCurrent
    }
    func holdsLoop() -> Bool {
        loop.holdsTask(isolatedTo: self)
    }
}

@testable import BrokerClient
import BrokerProtocol
import Synchronization
import XCTest

/// The destination's record of each load, in every order its reply, signals and caller can
/// meet. Waiters are plain strings here: what `finished` hands back is what would be resumed.
final class LoadLedgerTests: XCTestCase {
    typealias Ledger = LoadLedger<String>

    /// Every progress report a claimed load's handler heard, in order.
    final class Heard: Sendable {
        let reports = Mutex<[String]>([])
        var progress: Ledger.Progress {
            { [self] bytes, expected in reports.withLock { $0.append("\(bytes)/\(expected.map(String.init) ?? "-")") } }
        }
        var all: [String] { reports.withLock { $0 } }
    }

    func describe(_ report: Ledger.Report?) -> String? {
        report.map { "item \($0.item) load \($0.load) \($0.bytes)/\($0.expected.map(String.init) ?? "-")" }
    }

    /// Progress and `LoadFinished` before the reply was processed: the progress reaches the
    /// caller when it claims, the outcome when it collects, and nothing stays behind.
    func testSignalsBeforeTheReplyAreKeptForTheCaller() {
        var ledger = Ledger()
        let heard = Heard()
        XCTAssertNil(ledger.progressed(7, bytes: 100, expected: 300))
        XCTAssertNil(ledger.progressed(7, bytes: 250, expected: 300))
        XCTAssertNil(ledger.finished(7, LoadOutcome(bytes: 300, error: nil)))
        XCTAssertEqual(ledger.count, 1)

        let early = ledger.claim(7, item: 2, progress: heard.progress)
        XCTAssertEqual(describe(early), "item 2 load 7 250/300")
        early?.progress?(early!.bytes, early!.expected)
        XCTAssertEqual(heard.all, ["250/300"])
        XCTAssertEqual(ledger.collect(7, waiter: "caller of 7"), LoadOutcome(bytes: 300, error: nil))
        XCTAssertEqual(ledger.count, 0)
    }

    /// The usual order: reply, progress, the caller waits, then `LoadFinished` resumes it.
    func testSignalsAfterTheReplyGoToTheWaitingCaller() {
        var ledger = Ledger()
        let heard = Heard()
        XCTAssertNil(ledger.claim(3, item: 0, progress: heard.progress))
        let report = ledger.progressed(3, bytes: 4096, expected: nil)
        XCTAssertEqual(describe(report), "item 0 load 3 4096/-")
        XCTAssertNil(ledger.collect(3, waiter: "caller of 3"))
        XCTAssertEqual(ledger.count, 1)
        XCTAssertEqual(ledger.finished(3, LoadOutcome(bytes: 8192, error: nil)), "caller of 3")
        XCTAssertEqual(ledger.count, 0)
    }

    /// `LoadFinished` before the reply, with an error: the caller collects that error at once.
    func testAnOutcomeBeforeTheReplyIsCollectedAtOnce() {
        var ledger = Ledger()
        let cancelled = LoadOutcome(bytes: 12, error: BrokerError(.cancelled, "The source cancelled load 5"))
        XCTAssertNil(ledger.finished(5, cancelled))
        XCTAssertNil(ledger.claim(5, item: 1, progress: nil))
        XCTAssertEqual(ledger.collect(5, waiter: "caller of 5"), cancelled)
        XCTAssertEqual(ledger.count, 0)
    }

    /// Progress after the outcome reaches nobody; a second `LoadFinished` changes nothing.
    func testNothingFollowsTheOutcome() {
        var ledger = Ledger()
        XCTAssertNil(ledger.claim(1, item: 0, progress: nil))
        XCTAssertNil(ledger.finished(1, LoadOutcome(bytes: 10, error: nil)))
        XCTAssertNil(ledger.progressed(1, bytes: 10, expected: 10))
        XCTAssertNil(ledger.finished(1, LoadOutcome(bytes: 99, error: nil)))
        XCTAssertEqual(ledger.collect(1, waiter: "caller of 1"), LoadOutcome(bytes: 10, error: nil))
        XCTAssertEqual(ledger.count, 0)
    }

    /// A caller that gave up (its side failed) leaves no record, whichever comes first.
    func testAbandonedLoadsGoWhenTheirOutcomeIsKnown() {
        var ledger = Ledger()
        XCTAssertNil(ledger.claim(1, item: 0, progress: nil))
        ledger.abandon(1)
        XCTAssertEqual(ledger.count, 1, "kept until the broker's verdict")
        XCTAssertNil(ledger.finished(1, LoadOutcome(bytes: 0, error: nil)))
        XCTAssertEqual(ledger.count, 0)

        XCTAssertNil(ledger.claim(2, item: 0, progress: nil))
        XCTAssertNil(ledger.finished(2, LoadOutcome(bytes: 5, error: nil)))
        ledger.abandon(2)
        XCTAssertEqual(ledger.count, 0)
    }

    /// After `Ended`, what nobody claimed goes; a load still running keeps the session's
    /// signals until its `LoadFinished`.
    func testTheEndKeepsOnlyWhatACallerStillWaitsFor() {
        var ledger = Ledger()
        XCTAssertTrue(ledger.needsSignals)
        XCTAssertNil(ledger.progressed(9, bytes: 1, expected: nil))
        XCTAssertNil(ledger.claim(4, item: 0, progress: nil))
        XCTAssertNil(ledger.collect(4, waiter: "caller of 4"))
        ledger.sessionEnded()
        XCTAssertEqual(ledger.count, 1)
        XCTAssertTrue(ledger.needsSignals)
        XCTAssertNil(ledger.progressed(10, bytes: 1, expected: nil))
        XCTAssertEqual(ledger.count, 1, "no record for an unknown load after the end")
        XCTAssertEqual(ledger.finished(4, LoadOutcome(bytes: 3, error: nil)), "caller of 4")
        XCTAssertEqual(ledger.count, 0)
        XCTAssertFalse(ledger.needsSignals)
    }
}

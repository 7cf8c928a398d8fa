import BrokerProtocol
import BusKit
import Foundation
import TransferLog
import XCTest

/// Copy and paste through the broker, between separate app processes on a private bus: the
/// same lazy promises as a drag, each paste its own session and record, and the entry's end.
final class PasteTests: XCTestCase {
    static let hello = EndToEndTests.helloDrag
    static let helloBase64 = Data("hello, drop".utf8).base64EncodedString()

    func testOneCopyPastedThreeTimesIntoTwoAppsGivesThreeRecordsAndTheProviderRunsOnlyOnPaste() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let notes = try world.peer("notes-app")
        let mail = try world.peer("mail-app")
        let answer = source.run("copy " + Self.hello)
        let parts = answer.split(separator: " ").map(String.init)
        XCTAssertEqual(parts.first, "OK", answer)
        let (token, entry) = (parts[1], parts[2])
        XCTAssertEqual(entry, BrokerNames.sessionPath(id: "s1"))

        // Looking is free: the Paste menu item's question asks the source nothing.
        XCTAssertEqual(notes.run("present \(token)"), "OK \(entry)")
        XCTAssertEqual(notes.run("items"),
                       #"OK [{"preferredHeight":200,"preferredWidth":320,"suggestedName":"hello.txt","typeIdentifiers":["text\/plain","text\/html"]}]"#)
        XCTAssertEqual(notes.run("conforming text/*"), "OK 0")
        XCTAssertEqual(notes.run("load 0 text/plain"),
                       err(.wrongState, "Session s1 is a pasteboard entry: call Paste, then Load from the session it returns"))
        XCTAssertEqual(notes.run("enter copy"), err(.wrongState, "Session s1 is a pasteboard entry: Enter is for drags; paste it with Paste"))
        XCTAssertEqual(notes.run("update copy"), err(.wrongState, "Session s1 is a pasteboard entry: Update is for drags; paste it with Paste"))
        XCTAssertEqual(notes.run("exit"), err(.wrongState, "Session s1 is a pasteboard entry: Exit is for drags; paste it with Paste"))
        XCTAssertEqual(notes.run("drop"), err(.wrongState, "Session s1 is a pasteboard entry: PerformDrop is for drags; paste it with Paste"))
        XCTAssertEqual(notes.run("conclude"), err(.wrongState, "Session s1 is a pasteboard entry: Conclude the session that Paste returned"))
        XCTAssertEqual(source.handlerCalls, [], "nothing is asked of the provider before a paste loads")

        // Paste 1 and 2 into notes, 3 into mail: each its own session.
        XCTAssertEqual(notes.run("paste"), "OK \(entry)_1")
        XCTAssertTrue(source.waitFor("EVENT pasted s1_1 \(notes.executable.path)"))
        XCTAssertEqual(source.handlerCalls, [], "a paste alone asks nothing either")
        XCTAssertEqual(notes.run("load 0 text/plain"), "OK 11 \(Self.helloBase64)")
        XCTAssertEqual(notes.run("conclude"), "OK")
        XCTAssertTrue(notes.waitFor("EVENT paste ended copy -"))
        XCTAssertEqual(notes.run("unpaste"), "OK")
        XCTAssertEqual(notes.run("paste"), "OK \(entry)_2")
        XCTAssertEqual(notes.run("load 0 text/plain"), "OK 11 \(Self.helloBase64)")
        XCTAssertEqual(notes.run("conclude"), "OK")
        XCTAssertEqual(mail.run("present \(token)"), "OK \(entry)")
        XCTAssertEqual(mail.run("paste"), "OK \(entry)_3")
        XCTAssertEqual(mail.run("load 0 text/html"), "OK 18 \(Data("<p>hello, drop</p>".utf8).base64EncodedString())")
        XCTAssertEqual(mail.run("load 0 text/plain"), "OK 11 \(Self.helloBase64)")
        XCTAssertEqual(mail.run("conclude"), "OK")
        XCTAssertEqual(source.handlerCalls, ["HANDLER 0 text/plain", "HANDLER 0 text/plain", "HANDLER 0 text/html", "HANDLER 0 text/plain"])
        XCTAssertTrue(source.waitFor("EVENT loadFinished s1_3 2 11 -"))

        // A paste is no drag and no entry: it is loaded from, then concluded.
        XCTAssertEqual(mail.run("paste"), err(.notFound, "No live session at \(entry)_3: it ended or never existed"))
        XCTAssertEqual(mail.run("unpaste"), "OK")

        let (pastes, loads) = try world.daemon.waitForLog { log -> ([SessionRecord], [LoadRecord])? in
            let sessions = try log.sessions()
            let loads = try log.loads()
            return sessions.count < 3 || loads.count < 4 ? nil : (sessions, loads)
        }
        XCTAssertEqual(pastes.map(\.sessionID).sorted(), ["s1_1", "s1_2", "s1_3"])
        XCTAssertEqual(Set(pastes.map(\.kind)), ["paste"])
        XCTAssertEqual(pastes.sorted { $0.sessionID < $1.sessionID }.map(\.destinationApp),
                       [notes.executable.path, notes.executable.path, mail.executable.path])
        XCTAssertEqual(Set(pastes.map(\.operation)), ["copy"])
        XCTAssertEqual(Set(pastes.map(\.outcome)), ["completed"])
        XCTAssertEqual(loads.map { "\($0.sessionID) \($0.typeIdentifier) \($0.bytes) \($0.outcome)" }.sorted(),
                       ["s1_1 text/plain 11 completed", "s1_2 text/plain 11 completed",
                        "s1_3 text/html 18 completed", "s1_3 text/plain 11 completed"])

        // The entry itself is on record once it ends.
        XCTAssertEqual(source.run("withdraw"), "OK")
        XCTAssertTrue(source.waitFor("EVENT entryEnded \(BrokerErrorCode.cancelled.busName)"))
        XCTAssertTrue(source.waitFor("WHY The source withdrew the pasteboard entry"))
        XCTAssertTrue(source.waitFor("EVENT entryDone"), "the entry's events end with it and its pastes")
        XCTAssertEqual(mail.run("present \(token)"), err(.notFound, "No live session has this token"))
        let record = try world.daemon.waitForLog { log in try log.sessions().first { $0.sessionID == "s1" } }
        XCTAssertEqual(record.kind, "copy")
        XCTAssertEqual(record.outcome, "cancelled")
        XCTAssertNil(record.destinationApp)
        XCTAssertEqual(record.errorName, BrokerErrorCode.cancelled.busName)
    }

    /// The entry ends when it expires (the policy cuts what the app asked to its maximum), when
    /// the toolkit says the app lost the clipboard, and when the source leaves the bus; its
    /// token then gives NotFound, and pastes already made go on.
    func testExpirationLostOwnershipAndTheSourceQuittingEachEndTheEntry() throws {
        let world = try World { _ in "[Pasteboard]\nExpirationSec=3600\nMaxExpirationSec=2\n" }
        let target = try world.peer("target-app")

        let expiring = try world.peer("expiring-app")
        let (expiringToken, _) = try copy(expiring, #"{"expiration":100,"items":[{"reps":[{"type":"text/plain","text":"soon gone"}]}]}"#)
        XCTAssertEqual(target.run("present \(expiringToken)"), "OK \(BrokerNames.sessionPath(id: "s1"))")
        XCTAssertEqual(target.run("paste"), "OK \(BrokerNames.sessionPath(id: "s1_1"))")
        XCTAssertTrue(expiring.waitFor("EVENT entryEnded \(BrokerErrorCode.timeout.busName)", timeout: 10))
        XCTAssertTrue(expiring.waitFor("WHY The pasteboard entry s1 expired 2 s after Copy"))
        XCTAssertEqual(target.run("present \(expiringToken)"), err(.notFound, "No live session has this token"))
        XCTAssertEqual(target.run("load 0 text/plain"), "OK 9 \(Data("soon gone".utf8).base64EncodedString())",
                       "a paste made before the entry expired goes on")
        XCTAssertEqual(target.run("conclude"), "OK")

        let owner = try world.peer("owner-app")
        let (ownerToken, _) = try copy(owner, Self.hello)
        XCTAssertEqual(owner.run("ownershiplost"), "OK")
        XCTAssertTrue(owner.waitFor("EVENT entryEnded \(BrokerErrorCode.cancelled.busName)"))
        XCTAssertEqual(target.run("present \(ownerToken)"), err(.notFound, "No live session has this token"))

        let quitter = try world.peer("quitter-app")
        let (quitterToken, _) = try copy(quitter, Self.hello)
        XCTAssertEqual(target.run("present \(quitterToken)"), "OK \(BrokerNames.sessionPath(id: "s3"))")
        quitter.process.terminate()
        quitter.process.waitUntilExit()
        XCTAssertTrue(target.waitFor("EVENT ended copy \(BrokerErrorCode.disconnected.busName)"))
        XCTAssertEqual(target.run("present \(quitterToken)"), err(.notFound, "No live session has this token"))

        let records = try world.daemon.waitForLog { log -> [SessionRecord]? in
            let records = try log.sessions().filter { $0.kind == "copy" }
            return records.count < 3 ? nil : records.sorted { $0.sessionID < $1.sessionID }
        }
        XCTAssertEqual(records.map { "\($0.sessionID) \($0.outcome) \($0.errorName ?? "-")" },
                       ["s1 expired \(BrokerErrorCode.timeout.busName)", "s2 cancelled \(BrokerErrorCode.cancelled.busName)",
                        "s3 source-disconnected \(BrokerErrorCode.disconnected.busName)"])
    }

    /// Flow rules apply to paste as to drag, and `Channels=` scopes a rule to one: the managed
    /// app's copy is refused to the unmanaged app before its provider runs, and recorded, while
    /// the same data dragged goes through.
    func testAFlowDeniedPasteIsRefusedBeforeAnyByteMovesAndIsRecorded() throws {
        let world = try World { paths in
            """
            [App]
            Executable=\(paths.app("managed-mail"))
            AppID=com.corp.Mail
            Managed=yes

            [Flow]
            From=managed
            To=unmanaged
            Channels=paste
            Action=deny
            """
        }
        let mail = try world.peer("managed-mail")
        let other = try world.peer("other-app")
        let (token, entry) = try copy(mail, Self.hello)
        XCTAssertEqual(other.run("present \(token)"), "OK \(entry)")
        XCTAssertEqual(other.run("items"), "OK []")
        XCTAssertEqual(mail.run("clearoffers"), "OK ", "nothing a flow rule keeps from unmanaged apps goes on the clipboard in the clear")
        let rule = "\(world.paths.policyFile.path):6"
        XCTAssertEqual(other.run("paste"),
                       err(.accessDenied, "The administrator's policy forbids pasting from com.corp.Mail to \(other.executable.path) (rule at \(rule))"))
        XCTAssertEqual(mail.handlerCalls, [])

        // The rule is for the clipboard only: the same items dragged reach the same app.
        let (dragToken, _) = try mail.begin(Self.hello)
        XCTAssertEqual(other.run("present \(dragToken)"), "OK \(BrokerNames.sessionPath(id: "s2"))")
        XCTAssertEqual(other.run("enter copy"), "OK copy")
        XCTAssertEqual(other.run("drop"), "OK copy")
        XCTAssertEqual(other.run("load 0 text/plain"), "OK 11 \(Self.helloBase64)")

        let refusals = try world.daemon.waitForLog { log -> [RefusalRecord]? in
            let refusals = try log.refusals().filter { $0.sessionID == "s1" }
            return refusals.count < 2 ? nil : refusals.sorted { $0.at < $1.at }
        }
        XCTAssertEqual(refusals.map(\.action), ["PresentToken", "Paste"])
        XCTAssertEqual(refusals.map(\.rule), [rule, rule])
        XCTAssertEqual(refusals.map(\.errorName), [BrokerErrorCode.accessDenied.busName, BrokerErrorCode.accessDenied.busName])
        XCTAssertEqual(refusals[1].app, other.executable.path)
    }

    /// What a paste may not be: of a drag, of a paste, of an entry restricted to another app,
    /// of nothing the caller may see; and pasting again and again spends the paster's share of
    /// sessions, never the source's.
    func testWhatAPasteMayNotBeAndWhoseShareItSpends() throws {
        let world = try World { _ in "[Limits]\nSessionsPerConnection=3\n" }
        let source = try world.peer("source-app")
        let paster = try world.peer("paster-app")

        let (dragToken, drag) = try source.begin(Self.hello)
        XCTAssertEqual(paster.run("present \(dragToken)"), "OK \(drag)")
        XCTAssertEqual(paster.run("paste"),
                       err(.wrongState, "Session s1 is a drag: Paste is for pasteboard entries; a drag is dropped with PerformDrop"))

        let (restrictedToken, _) = try copy(source, #"{"restricted":true,"items":[{"reps":[{"type":"text/plain","text":"mine"}]}]}"#)
        XCTAssertEqual(paster.run("present \(restrictedToken)"), err(.notFound, "No live session has this token"))

        let (privateToken, privateEntry) = try copy(source, #"{"items":[{"reps":[{"type":"text/plain","visibility":"app","text":"mine"}]}]}"#)
        XCTAssertEqual(source.run("clearoffers"), "OK ", "an app-only representation never goes in the clear")
        XCTAssertEqual(paster.run("present \(privateToken)"), "OK \(privateEntry)")
        XCTAssertEqual(paster.run("paste"), err(.notFound, "Pasteboard entry s3 has nothing that \(paster.executable.path) may see"))

        // The source holds three sessions, its limit; the paster's pastes are its own to count.
        XCTAssertEqual(source.run("copy " + Self.hello), err(.limitExceeded, "This connection already has 3 live sessions (limit 3)"))
        XCTAssertEqual(source.run("cancel"), "OK")
        let (token, entry) = try copy(source, Self.hello)
        XCTAssertEqual(paster.run("present \(token)"), "OK \(entry)")
        XCTAssertEqual(paster.run("clearoffers"), err(.notFound, "no entry copied"))
        for number in 1...3 {
            XCTAssertEqual(paster.run("paste"), "OK \(entry)_\(number)")
            XCTAssertEqual(paster.run("paste"), err(.wrongState, "Session \(entry.split(separator: "/").last!)_\(number) is a paste: call Paste on its pasteboard entry"))
            XCTAssertEqual(paster.run("unpaste"), "OK")
        }
        XCTAssertEqual(paster.run("paste"), err(.limitExceeded, "This connection already has 3 live sessions (limit 3)"))
        XCTAssertEqual(source.run("withdraw"), "OK", "the source's share is untouched by the pastes")
    }

    /// An entry lives for days and its token is readable by every X11 client: lookers must not
    /// lock it. At `DestinationsPerSession=` it forgets the one that presented longest ago, which
    /// presents again and pastes; a drag at the same bound still refuses the newcomer.
    func testAFullEntryForgetsTheDestinationThatLookedLongestAgo() throws {
        let world = try World { _ in "[Limits]\nDestinationsPerSession=2\n" }
        let source = try world.peer("source-app")
        let first = try world.peer("first-app")
        let second = try world.peer("second-app")
        let third = try world.peer("third-app")
        let (token, entry) = try copy(source, Self.hello)
        XCTAssertEqual(first.run("present \(token)"), "OK \(entry)")
        XCTAssertEqual(second.run("present \(token)"), "OK \(entry)")
        XCTAssertEqual(first.run("present \(token)"), "OK \(entry)", "presenting again counts as looking now")
        XCTAssertEqual(third.run("present \(token)"), "OK \(entry)")
        XCTAssertEqual(second.run("conforming text/plain"),
                       err(.accessDenied, "Present the session token with PresentToken before using session s1"))
        XCTAssertEqual(first.run("conforming text/plain"), "OK 0", "the one that looked last is kept")
        XCTAssertEqual(second.run("present \(token)"), "OK \(entry)")
        XCTAssertEqual(second.run("paste"), "OK \(entry)_1")
        XCTAssertEqual(second.run("load 0 text/plain"), "OK 11 \(Self.helloBase64)")
        XCTAssertEqual(second.run("conclude"), "OK")

        let (dragToken, _) = try source.begin(Self.hello)
        XCTAssertEqual(first.run("present \(dragToken)"), "OK /org/dragbroker/Broker1/session/s2")
        XCTAssertEqual(second.run("present \(dragToken)"), "OK /org/dragbroker/Broker1/session/s2")
        XCTAssertEqual(third.run("present \(dragToken)"), err(.limitExceeded, "Session s2 already has 2 destinations"))
        XCTAssertEqual(first.run("enter copy"), "OK copy", "a drag keeps every destination it admitted")
    }

    /// The source may stop serving one paste: its destination hears why, and the entry lives on.
    func testTheSourceCancelsOnePasteAndTheEntryLivesOn() throws {
        let world = try World()
        let source = try BusProbe(address: world.bus.address)
        let paster = try world.peer("paster-app")
        let copied = try source.begin(member: .copy).get()
        let entry = try copied.readObjectPath()
        let token = try copied.readString()
        XCTAssertEqual(paster.run("present \(token)"), "OK \(entry)")
        XCTAssertEqual(paster.run("paste"), "OK \(entry)_1")
        let cancel = source.call(BrokerNames.busName, entry + "_1", BrokerNames.sessionInterface, SessionMember.cancel.name)
        XCTAssertEqual(cancel.errorName, "OK")
        let ended = paster.stdout.take { $0.hasPrefix("EVENT paste ended") }
        XCTAssertEqual(ended, "EVENT paste ended copy \(BrokerErrorCode.cancelled.busName)")
        XCTAssertEqual(paster.stdout.take { $0.hasPrefix("WHY") }, "WHY The source cancelled the paste")
        XCTAssertEqual(paster.run("load 0 text/plain"), err(.notFound, "No live session at \(entry)_1: it ended or never existed"))
        XCTAssertEqual(paster.run("unpaste"), "OK")
        XCTAssertEqual(paster.run("paste"), "OK \(entry)_2", "the entry is still on the pasteboard")
    }

    /// What may go on the clipboard in the clear is the broker's answer: representations any app
    /// may see that no flow rule keeps from an unknown app, of the first item only; none at all
    /// when the administrator says `ClearOffers=no`, and only the entry's source may ask.
    func testTheBrokerSaysWhatMayGoOnTheClipboardInTheClear() throws {
        let world = try World { _ in
            """
            [Flow]
            From=any
            To=unmanaged
            Types=text/html
            Channels=paste
            Action=deny
            """
        }
        let source = try world.peer("source-app")
        let other = try world.peer("other-app")
        let mixed = #"{"items":[{"reps":[{"type":"text/plain","text":"a"},{"type":"text/html","text":"<b>a</b>"},{"type":"text/x-team","visibility":"team","text":"t"},{"type":"text/rtf","text":"r"}]},{"reps":[{"type":"image/png","text":"png"}]}]}"#
        let (token, entry) = try copy(source, mixed)
        XCTAssertEqual(source.run("clearoffers"), "OK text/plain text/rtf")
        XCTAssertEqual(other.run("present \(token)"), "OK \(entry)")
        let probe = try BusProbe(address: world.bus.address)
        func askClearOffers() -> BusError? {
            if case .failure(let error) = probe.call(BrokerNames.busName, entry, BrokerNames.sessionInterface, SessionMember.clearOffers.name) {
                return error
            }
            return nil
        }
        XCTAssertEqual(askClearOffers(), BrokerError(.accessDenied, "Present the session token with PresentToken before using session s1").busError)
        _ = try probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, ManagerMember.presentToken.name) {
            m throws(BusError) in try m.append(token)
        }.get()
        XCTAssertEqual(askClearOffers(), BrokerError(.accessDenied, "Only the source of pasteboard entry s1 may ask what it may offer in the clear").busError)

        try "[Pasteboard]\nClearOffers=no\n".write(to: world.paths.policyFile, atomically: true, encoding: .utf8)
        XCTAssertEqual(source.run("reload"), "OK")
        XCTAssertEqual(source.run("clearoffers"), "OK ", "ClearOffers=no: nothing in the clear")
    }

    /// An entry whose events nobody reads keeps the newest 256 of them however many loads its
    /// pastes make, its end among them.
    func testEntryEventsNobodyReadsAreBoundedAndKeepTheEnd() throws {
        let world = try World()
        let source = try world.peer("source-app"), notes = try world.peer("notes-app")
        let (token, entry) = try copy(source, #"{"unread":true,"items":[{"reps":[{"type":"text/plain","text":"hello"}]}]}"#)
        XCTAssertEqual(notes.run("present \(token)"), "OK \(entry)")
        XCTAssertEqual(notes.run("paste"), "OK \(entry)_1")
        XCTAssertEqual(notes.run("loadmany 300 0 text/plain"), "OK 1500")
        XCTAssertEqual(notes.run("conclude"), "OK")
        XCTAssertTrue(notes.waitFor("EVENT paste ended copy -"))
        XCTAssertEqual(source.run("withdraw"), "OK")
        // pasted, 300 × (loadRequested, loadFinished), ended: the newest 256 are the end and
        // the 255 events before it, 128 of them loads finished.
        XCTAssertEqual(source.run("readsourceevents entry"), "OK 256 128 entryEnded \(BrokerErrorCode.cancelled.busName)")
    }

    func copy(_ peer: Peer, _ json: String) throws -> (token: String, path: String) {
        let answer = peer.run("copy " + json)
        let parts = answer.split(separator: " ").map(String.init)
        guard parts.count == 3, parts[0] == "OK" else { throw HarnessError("copy failed: \(answer)") }
        return (parts[1], parts[2])
    }
}

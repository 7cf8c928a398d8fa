import BrokerPolicy
import BrokerProtocol
import SystemCalls
import UniformTypes
import XCTest

@testable import dragbrokerd

/// The session's rules, tried on sessions built directly: no bus, no process, no file.
final class SessionRulesTests: XCTestCase {
    // Flatpak IDs vouch for themselves, so teams come from the reverse-DNS prefix.
    static let source = identity(":1.1", flatpak: "org.example.Editor")
    static let sameApp = identity(":1.2", flatpak: "org.example.Editor")
    static let teammate = identity(":1.3", flatpak: "org.example.Viewer")
    static let stranger = identity(":1.4", flatpak: "com.other.Reader")
    /// An administrator: the user the daemon (here, this test process) runs as, unsandboxed.
    static let unsandboxedSameUser = identity(":1.5", executable: "/usr/bin/tool", uid: getuid())

    static func identity(_ name: String, flatpak: String? = nil, executable: String = "/app/bin/app", uid: uid_t = 1000,
                         policy: Policy = Policy()) -> AppIdentity {
        AppIdentity(facts: ProcessFacts(uniqueName: name, pid: 100, uid: uid, executable: executable, flatpakApp: flatpak),
                    policy: policy)
    }

    /// One item with a representation of each visibility, and a second visible to all.
    static let items = [
        ItemDescriptor(suggestedName: "a", representations: [
            RepresentationDescriptor(typeIdentifier: "text/x-app", visibility: .app),
            RepresentationDescriptor(typeIdentifier: "text/x-team", visibility: .team),
            RepresentationDescriptor(typeIdentifier: "text/plain", visibility: .all),
        ]),
        ItemDescriptor(suggestedName: "b", representations: [
            RepresentationDescriptor(typeIdentifier: "image/png", visibility: .app, kind: .file),
        ]),
    ]

    static let types = MimeDatabase(subclasses: [:], aliases: [:])
    /// No flow rule: what each party may see is its visibility alone.
    static let noRules = FlowView(policy: Policy(), types: types)

    final class Recorder {
        var events: [String] = []
    }

    func makeSession(restricted: Bool = false, allowsMove: Bool = false, items: [ItemDescriptor] = items) -> (Session, Recorder) {
        let recorder = Recorder()
        let session = Session(id: "s7", token: try! SessionToken.random(), source: Self.source, providerPath: "/p",
                              items: items, options: SessionOptions(restrictedToApp: restricted, allowsMove: allowsMove)) { _, event in
            recorder.events.append(Self.name(event))
        }
        return (session, recorder)
    }

    static func name(_ event: SessionEvent) -> String {
        switch event {
        case .began: "began"
        case .itemsAdded: "itemsAdded"
        case .proposed(let who, let proposal, let allowed, let entering):
            "\(entering ? "enter" : "update") \(who.uniqueName) \(proposal.rawValue)->\(allowed.rawValue)"
        case .exited(let who): "exit \(who.uniqueName)"
        case .flowDenied(let who, let types, let rule): "flowDenied \(who.uniqueName) \(types) \(rule.origin)"
        case .dropped(let who, let operation): "dropped \(who.uniqueName) \(operation.rawValue)"
        case .concluded: "concluded"
        case .pastedFrom(let paste): "pasted \(paste.id)"
        case .loadStarted(let load): "loadStarted \(load.id)"
        case .loadProgressed(let load): "loadProgressed \(load.id)"
        case .loadSizeAnnounced(let load): "loadSizeAnnounced \(load.id) \(load.expected ?? 0)"
        case .loadFinished(let load, let error): "loadFinished \(load.id) \(error?.code.rawValue ?? "ok")"
        case .transferFinished: "transferFinished"
        case .ended(let outcome, let error): "ended \(outcome.rawValue) \(error?.code.rawValue ?? "ok")"
        }
    }

    func rules(policy: Policy = Policy(), limits: Limits = Limits(), auditRefuses: Bool = false) -> LoadRules {
        LoadRules(flow: FlowView(policy: policy, types: Self.types), limits: limits, auditRefuses: auditRefuses)
    }

    /// Opens a load of item 0 as plain text, which the daemon's shares admit.
    func open(_ session: Session, by caller: AppIdentity) throws -> Load {
        try session.openLoad(item: 0, type: "text/plain", by: caller, rules: rules()) { _ throws(BrokerError) in }
    }

    /// Asserts the exact refusal.
    func assertRefused<T>(_ body: @autoclosure () throws -> T, _ code: BrokerErrorCode, _ message: String,
                          file: StaticString = #filePath, line: UInt = #line) {
        do {
            _ = try body()
            XCTFail("expected \(code.rawValue): \(message)", file: file, line: line)
        } catch let error as BrokerError {
            XCTAssertEqual(error.code, code, file: file, line: line)
            XCTAssertEqual(error.message, message, file: file, line: line)
        } catch {
            XCTFail("unexpected \(error)", file: file, line: line)
        }
    }

    /// Enters and drops for `destination`.
    func drop(_ session: Session, by destination: AppIdentity, proposing: DropOperation = .copy) throws {
        try session.admit(destination, limit: 64, flow: Self.noRules)
        _ = try session.propose(proposing, by: destination, entering: true, flow: Self.noRules)
        _ = try session.performDrop(by: destination)
    }

    // MARK: Visibility × restriction

    func testEachPartySeesExactlyTheRepresentationsItsVisibilityAllows() {
        let (session, _) = makeSession()
        func types(_ who: AppIdentity) -> [[String]] { session.visibleItems(for: who, flow: Self.noRules).map(\.item.typeIdentifiers) }
        XCTAssertEqual(types(Self.source), [["text/x-app", "text/x-team", "text/plain"], ["image/png"]])
        XCTAssertEqual(types(Self.sameApp), [["text/x-app", "text/x-team", "text/plain"], ["image/png"]])
        XCTAssertEqual(types(Self.teammate), [["text/x-team", "text/plain"]], "the app-only item is absent, not empty")
        XCTAssertEqual(types(Self.stranger), [["text/plain"]])
        XCTAssertEqual(session.visibleItems(for: Self.stranger, flow: Self.noRules).map(\.index), [0])
    }

    /// A `Load` finds its item without building the list: hidden items between visible ones
    /// must number the same both ways, and the load must reach the real item.
    func testALoadFindsTheItemItsDestinationSeesAtThatPosition() throws {
        func item(_ name: String, _ visibilities: [Visibility]) -> ItemDescriptor {
            ItemDescriptor(suggestedName: name, representations: visibilities.enumerated().map { index, visibility in
                RepresentationDescriptor(typeIdentifier: "text/x-\(name)\(index)", visibility: visibility)
            })
        }
        let items = [item("a", [.app]), item("b", [.app, .all]), item("c", [.team]), item("d", [.app, .app]),
                     item("e", [.all]), item("f", [.team, .app]), item("g", [.all, .team])]
        let (session, _) = makeSession(items: items)
        for who in [Self.source, Self.teammate, Self.stranger] {
            let listed = session.visibleItems(for: who, flow: Self.noRules)
            for position in 0...items.count {
                let found = session.visibleItem(at: position, for: who, flow: Self.noRules)
                XCTAssertEqual(found?.index, position < listed.count ? listed[position].index : nil, "\(who.uniqueName) at \(position)")
                XCTAssertEqual(found?.typeIdentifiers, position < listed.count ? listed[position].item.typeIdentifiers : nil)
            }
        }
        XCTAssertEqual(session.visibleItems(for: Self.stranger, flow: Self.noRules).map(\.index), [1, 4, 6])
        try drop(session, by: Self.stranger)
        let request = try session.authorizeLoad(item: 2, type: "text/*", by: Self.stranger, rules: rules())
        XCTAssertEqual(request.item, 6)
        XCTAssertEqual(request.typeIdentifier, "text/x-g0")
        assertRefused(try session.authorizeLoad(item: 3, type: "text/*", by: Self.stranger, rules: rules()), .notFound,
                      "No item 3: session s7 has 3 item(s)")
    }

    func testARestrictedSessionExistsOnlyForItsOwnApp() {
        let (restricted, _) = makeSession(restricted: true)
        let (open, _) = makeSession()
        XCTAssertTrue(restricted.isVisible(to: Self.sameApp))
        XCTAssertFalse(restricted.isVisible(to: Self.teammate))
        XCTAssertFalse(restricted.mayBeInspected(by: Self.unsandboxedSameUser))
        XCTAssertTrue(open.mayBeInspected(by: Self.unsandboxedSameUser), "an unsandboxed tool of the daemon's user may inspect")
        XCTAssertFalse(open.mayBeInspected(by: Self.stranger), "a sandboxed app sees only its own sessions")
        XCTAssertFalse(open.mayBeInspected(by: Self.identity(":1.9", executable: "/usr/bin/tool", uid: getuid() + 1)), "another user")
        XCTAssertTrue(open.mayBeInspected(by: Self.identity(":1.9", executable: "/usr/bin/tool", uid: 0)), "root")
    }

    // MARK: Proposals, move, drop

    func testMoveIsAllowedOnlyWithinTheSourceAppAndOnlyWhenItAllowsMove() throws {
        let (moving, _) = makeSession(allowsMove: true)
        try moving.admit(Self.sameApp, limit: 64, flow: Self.noRules)
        try moving.admit(Self.teammate, limit: 64, flow: Self.noRules)
        XCTAssertEqual(try moving.propose(.move, by: Self.sameApp, entering: true, flow: Self.noRules), .move)
        XCTAssertEqual(try moving.propose(.move, by: Self.teammate, entering: true, flow: Self.noRules), .copy, "across apps a move is a copy")
        XCTAssertEqual(try moving.propose(.forbidden, by: Self.teammate, entering: false, flow: Self.noRules), .forbidden)
        let (copying, _) = makeSession(allowsMove: false)
        try copying.admit(Self.sameApp, limit: 64, flow: Self.noRules)
        XCTAssertEqual(try copying.propose(.move, by: Self.sameApp, entering: true, flow: Self.noRules), .copy)
    }

    func testProposalsNeedTheTokenAndEnterBeforeUpdate() throws {
        let (session, events) = makeSession()
        assertRefused(try session.propose(.copy, by: Self.teammate, entering: true, flow: Self.noRules), .accessDenied,
                      "Present the session token with PresentToken before proposing a drop")
        try session.admit(Self.teammate, limit: 64, flow: Self.noRules)
        assertRefused(try session.propose(.copy, by: Self.teammate, entering: false, flow: Self.noRules), .wrongState,
                      "Call Enter before Update: the drag is not over this destination")
        XCTAssertEqual(try session.propose(.copy, by: Self.teammate, entering: true, flow: Self.noRules), .copy)
        try session.exit(by: Self.teammate)
        assertRefused(try session.propose(.copy, by: Self.teammate, entering: false, flow: Self.noRules), .wrongState,
                      "Call Enter before Update: the drag is not over this destination")
        XCTAssertEqual(events.events, ["enter :1.3 copy->copy", "exit :1.3"])
    }

    func testADropNeedsACurrentCopyOrMoveAndHappensOnce() throws {
        let (session, events) = makeSession()
        try session.admit(Self.teammate, limit: 64, flow: Self.noRules)
        try session.admit(Self.stranger, limit: 64, flow: Self.noRules)
        assertRefused(try session.performDrop(by: Self.teammate), .wrongState, "Call Enter with a proposal before PerformDrop")
        _ = try session.propose(.forbidden, by: Self.teammate, entering: true, flow: Self.noRules)
        assertRefused(try session.performDrop(by: Self.teammate), .wrongState,
                      "The current proposal allows 'forbidden': a drop needs copy or move")
        _ = try session.propose(.copy, by: Self.teammate, entering: false, flow: Self.noRules)
        XCTAssertEqual(try session.performDrop(by: Self.teammate), .copy)
        XCTAssertEqual(session.state, .dropped)
        assertRefused(try session.performDrop(by: Self.teammate), .wrongState, "Session s7 is dropped: it has already been dropped")
        assertRefused(try session.propose(.copy, by: Self.stranger, entering: true, flow: Self.noRules), .wrongState, "Session s7 is dropped: proposals are over")
        XCTAssertEqual(events.events.last, "dropped :1.3 copy")
    }

    func testOnlyTheDropDestinationConcludesAndTheTransferFinishesWithoutLoads() throws {
        let (session, events) = makeSession()
        assertRefused(try session.conclude(by: Self.stranger), .accessDenied,
                      "Present the session token with PresentToken before using session s7")
        try session.admit(Self.teammate, limit: 64, flow: Self.noRules)
        try session.admit(Self.stranger, limit: 64, flow: Self.noRules)
        assertRefused(try session.conclude(by: Self.teammate), .wrongState,
                      "Session s7 has not been dropped: only the drop destination concludes it")
        try drop(session, by: Self.teammate)
        assertRefused(try session.conclude(by: Self.stranger), .accessDenied,
                      "Only the destination that performed the drop may conclude session s7")
        try session.conclude(by: Self.teammate)
        XCTAssertEqual(events.events, ["enter :1.3 copy->copy", "dropped :1.3 copy", "concluded", "transferFinished", "ended completed ok"])
        XCTAssertTrue(session.isOver)
        assertRefused(try session.conclude(by: Self.teammate), .wrongState, "Session s7 is already concluded")
    }

    // MARK: Flocking and cancel

    func testOnlyTheSourceAppAddsItemsAndOnlyWhileDragging() throws {
        let (session, events) = makeSession()
        let more = [ItemDescriptor(representations: [RepresentationDescriptor(typeIdentifier: "text/plain", visibility: .all)])]
        assertRefused(try session.addItems(more, by: Self.sameApp, limit: 256, flow: Self.noRules), .accessDenied,
                      "Present the session token with PresentToken before using session s7")
        try session.admit(Self.teammate, limit: 64, flow: Self.noRules)
        assertRefused(try session.addItems(more, by: Self.teammate, limit: 256, flow: Self.noRules), .accessDenied,
                      "Only org.example.Editor may add items to session s7: cross-app flocking is not allowed")
        try session.admit(Self.sameApp, limit: 64, flow: Self.noRules)
        try session.addItems(more, by: Self.sameApp, limit: 256, flow: Self.noRules)
        XCTAssertEqual(session.items.count, 3)
        assertRefused(try session.addItems(more, by: Self.source, limit: 3, flow: Self.noRules), .limitExceeded,
                      "A session holds at most 3 items; session s7 has 3")
        try drop(session, by: Self.teammate)
        assertRefused(try session.addItems(more, by: Self.source, limit: 256, flow: Self.noRules), .wrongState,
                      "Session s7 is dropped: items can be added only while dragging")
        XCTAssertEqual(events.events.first, "itemsAdded")
    }

    func testOnlyTheSourceCancelsAndLoadsInFlightStopWithTheReason() throws {
        let (session, events) = makeSession()
        try drop(session, by: Self.teammate)
        let load = try open(session, by: Self.teammate)
        assertRefused(try session.cancel(by: Self.sameApp), .accessDenied, "Only the source of session s7 may cancel it")
        try session.cancel(by: Self.source)
        XCTAssertEqual(Array(events.events.suffix(3)), ["loadStarted 1", "loadFinished 1 Cancelled", "ended cancelled Cancelled"])
        XCTAssertEqual(load.phase, .finished)
        XCTAssertEqual(session.operation, .copy, "a dropped session keeps the operation it was dropped with")
    }

    /// On X11 any client can read the token from the selection: a bystander that presents it
    /// and calls Enter, Update or Exit changes nothing for the destination the drag is over.
    func testABystandersCallsChangeNothingForTheRealDestination() throws {
        let (session, _) = makeSession()
        try session.admit(Self.teammate, limit: 64, flow: Self.noRules)
        try session.admit(Self.stranger, limit: 64, flow: Self.noRules)
        XCTAssertEqual(try session.propose(.copy, by: Self.teammate, entering: true, flow: Self.noRules), .copy)
        _ = try session.propose(.copy, by: Self.stranger, entering: true, flow: Self.noRules)
        XCTAssertEqual(try session.propose(.move, by: Self.teammate, entering: false, flow: Self.noRules), .copy,
                       "Update still works after another destination's Enter (a move across apps is a copy)")
        try session.exit(by: Self.stranger)
        assertRefused(try session.propose(.copy, by: Self.stranger, entering: false, flow: Self.noRules), .wrongState,
                      "Call Enter before Update: the drag is not over this destination")
        _ = try session.propose(.copy, by: Self.stranger, entering: true, flow: Self.noRules)
        XCTAssertEqual(try session.propose(.copy, by: Self.teammate, entering: false, flow: Self.noRules), .copy)
        XCTAssertEqual(try session.performDrop(by: Self.teammate), .copy, "the real drop succeeds")
        XCTAssertEqual(session.dropDestination, Self.teammate.uniqueName)
    }

    /// A destination's own Exit ends its right to drop, whoever entered since.
    func testADestinationThatExitedCannotDropEvenAfterAnotherEntered() throws {
        let (session, _) = makeSession()
        try session.admit(Self.teammate, limit: 64, flow: Self.noRules)
        try session.admit(Self.stranger, limit: 64, flow: Self.noRules)
        _ = try session.propose(.copy, by: Self.teammate, entering: true, flow: Self.noRules)
        try session.exit(by: Self.teammate)
        _ = try session.propose(.copy, by: Self.stranger, entering: true, flow: Self.noRules)
        assertRefused(try session.performDrop(by: Self.teammate), .wrongState, "Call Enter with a proposal before PerformDrop")
    }

    /// A store whose disk is full: no mark can be synced.
    final class FullDiskStore: SessionNumberStore {
        func recordIssued(_ number: UInt64) {}
        func reserve(through number: UInt64) throws(Errno) { throw .noSpace }
        func syncIssued() throws(Errno) {}
    }

    /// No number is handed out past a mark that is not on disk: BeginSession is refused.
    func testNoSessionNumberIsHandedOutWhenItsMarkCannotBeSynced() {
        let numbers = SessionNumbers(next: 1, reserved: 0, store: FullDiskStore())
        assertRefused(try numbers.next(), .failed, "The broker cannot record session IDs on disk: \(Errno.noSpace)")
    }

    func testSessionNumbersStopBelowTheCeilingEveryClientReadsExactly() throws {
        let numbers = SessionNumbers(next: SessionNumbers.ceiling - 1, reserved: 0, store: nil)
        XCTAssertEqual(try numbers.next(), 9_007_199_254_740_991)
        assertRefused(try numbers.next(), .failed, "The broker has handed out every session ID it can (up to s9007199254740991)")
    }

    func testAPartyLeavingEndsWhatDependsOnItAndNothingElse() throws {
        let (session, events) = makeSession()
        try session.admit(Self.stranger, limit: 64, flow: Self.noRules)
        _ = try session.propose(.copy, by: Self.stranger, entering: true, flow: Self.noRules)
        session.partyVanished(Self.stranger.uniqueName)
        XCTAssertNil(session.current)
        XCTAssertFalse(session.isParty(Self.stranger.uniqueName))
        XCTAssertFalse(session.isOver)
        try drop(session, by: Self.teammate)
        session.partyVanished(Self.teammate.uniqueName)
        XCTAssertEqual(events.events.last, "ended destination-disconnected Disconnected")
        let (other, otherEvents) = makeSession()
        other.partyVanished(Self.source.uniqueName)
        XCTAssertEqual(otherEvents.events, ["ended source-disconnected Disconnected"])
        XCTAssertEqual(other.operation, .cancel)
    }

    // MARK: Loads

    func testLoadsOnlyAfterTheDropByTheDropDestinationOfWhatItSees() throws {
        let (session, _) = makeSession()
        assertRefused(try session.authorizeLoad(item: 0, type: "text/plain", by: Self.stranger, rules: rules()), .accessDenied,
                      "Present the session token with PresentToken before using session s7")
        try session.admit(Self.teammate, limit: 64, flow: Self.noRules)
        assertRefused(try session.authorizeLoad(item: 0, type: "text/plain", by: Self.teammate, rules: rules()), .wrongState,
                      "Loads are allowed only after PerformDrop")
        try drop(session, by: Self.teammate)
        try session.admit(Self.sameApp, limit: 64, flow: Self.noRules)
        assertRefused(try session.authorizeLoad(item: 0, type: "text/plain", by: Self.sameApp, rules: rules()), .accessDenied,
                      "Only the destination that performed the drop may load from session s7")
        assertRefused(try session.authorizeLoad(item: 1, type: "image/png", by: Self.teammate, rules: rules()), .notFound,
                      "No item 1: session s7 has 1 item(s)")
        assertRefused(try session.authorizeLoad(item: 0, type: "text/x-app", by: Self.teammate, rules: rules()), .notFound,
                      "Item 0 has no representation that matches 'text/x-app'")
        assertRefused(try session.authorizeLoad(item: 0, type: "not a type", by: Self.teammate, rules: rules()), .invalidArgument,
                      "'not a type' is not a type pattern: expected a MIME type such as image/png, a wildcard such as image/* or */*, "
                      + "or a UTI such as public.image")
        let first = try session.authorizeLoad(item: 0, type: "public.plain-text", by: Self.teammate, rules: rules())
        XCTAssertEqual(first.id, 1)
        XCTAssertEqual(first.typeIdentifier, "text/plain", "UTIs are stored as their MIME type")
        let team = try session.authorizeLoad(item: 0, type: "text/x-team", by: Self.teammate, rules: rules())
        XCTAssertEqual(team.id, 2)
        try session.conclude(by: Self.teammate)
        assertRefused(try session.authorizeLoad(item: 0, type: "text/plain", by: Self.teammate, rules: rules()), .wrongState,
                      "Session s7 was concluded: no new loads")
    }

    func testWhatFlowPolicyDeniesIsAbsentAndADropOfNothingIsForbidden() throws {
        let origin = SourceLocation(file: "/etc/dragbroker/dragbroker.conf", line: 12)
        let deny = Policy(flows: [FlowRule(from: .team("org.example"), to: .any, typePatterns: ["text/*"], action: .deny, origin: origin)])
        let flow = FlowView(policy: deny, types: MimeDatabase.system)
        let (session, events) = makeSession()
        try session.admit(Self.stranger, limit: 64, flow: flow)
        XCTAssertEqual(events.events, ["flowDenied :1.4 [\"text/plain\"] \(origin)"], "only what it could otherwise see")
        XCTAssertTrue(session.visibleItems(for: Self.stranger, flow: flow).isEmpty)
        XCTAssertEqual(try session.propose(.copy, by: Self.stranger, entering: true, flow: flow), .forbidden)
        XCTAssertEqual(try session.propose(.cancel, by: Self.stranger, entering: false, flow: flow), .forbidden,
                       "an app that proposes cancel for an empty GetItems still learns that policy refused")
        XCTAssertEqual(try session.propose(.move, by: Self.stranger, entering: false, flow: flow), .forbidden)
        assertRefused(try session.performDrop(by: Self.stranger), .wrongState, "The current proposal allows 'forbidden': a drop needs copy or move")

        // text/* is denied to every destination, so the teammate sees nothing either, until
        // the source flocks an image.
        try session.admit(Self.teammate, limit: 64, flow: flow)
        XCTAssertEqual(session.visibleItems(for: Self.teammate, flow: flow).map(\.item.typeIdentifiers), [])
        XCTAssertEqual(try session.propose(.copy, by: Self.teammate, entering: true, flow: flow), .forbidden)
        let more = [ItemDescriptor(representations: [RepresentationDescriptor(typeIdentifier: "image/png", visibility: .all)])]
        try session.addItems(more, by: Self.source, limit: 256, flow: flow)
        XCTAssertEqual(try session.propose(.copy, by: Self.teammate, entering: false, flow: flow), .copy, "an image may go")
        XCTAssertEqual(events.events.filter { $0.hasPrefix("flowDenied") }.count, 2, "once per destination and session")
        _ = try session.performDrop(by: Self.teammate)
        assertRefused(try session.authorizeLoad(item: 0, type: "text/plain", by: Self.teammate, rules: rules(policy: deny)), .notFound,
                      "Item 0 has no representation that matches 'text/plain'")
        XCTAssertEqual(try session.authorizeLoad(item: 0, type: "image/png", by: Self.teammate, rules: rules(policy: deny)).item, 2,
                       "the teammate's item 0 is the session's item 2")
    }

    /// A pasteboard entry at its bound forgets the destination that presented longest ago; a
    /// drag refuses. Policy's refusal is recorded once for each time a connection is a
    /// destination: a forgotten one that comes back is told again, and nothing of a connection
    /// the entry forgot stays behind.
    func testAFullEntryForgetsItsOldestLookerAndEverythingItKnewOfIt() throws {
        let origin = SourceLocation(file: "/etc/dragbroker/dragbroker.conf", line: 4)
        let flow = FlowView(policy: Policy(flows: [FlowRule(from: .any, to: .any, typePatterns: ["text/plain"], action: .deny, origin: origin)]),
                            types: MimeDatabase.system)
        let events = Recorder()
        let entry = Session(id: "s7", token: try SessionToken.random(), source: Self.source, providerPath: "/p", items: Self.items,
                            options: SessionOptions(), kind: .copy(lifetime: 60_000_000)) { _, event in events.events.append(Self.name(event)) }
        XCTAssertEqual(try entry.admit(Self.stranger, limit: 1, flow: flow), .joined(evicting: nil))
        XCTAssertEqual(try entry.admit(Self.stranger, limit: 1, flow: flow), .again)
        XCTAssertEqual(try entry.admit(Self.teammate, limit: 1, flow: flow), .joined(evicting: Self.stranger.uniqueName))
        XCTAssertFalse(entry.isParty(Self.stranger.uniqueName))
        XCTAssertEqual(try entry.admit(Self.stranger, limit: 1, flow: flow), .joined(evicting: Self.teammate.uniqueName))
        XCTAssertEqual(events.events.filter { $0.hasPrefix("flowDenied") },
                       ["flowDenied :1.4 [\"text/plain\"] \(origin)", "flowDenied :1.3 [\"text/x-team\", \"text/plain\"] \(origin)",
                        "flowDenied :1.4 [\"text/plain\"] \(origin)"],
                       "presenting again is no second refusal; joining again after being forgotten is")
        XCTAssertEqual(Array(entry.destinations.keys), [Self.stranger.uniqueName], "the entry holds one destination and no more")

        let (drag, _) = makeSession()
        try drag.admit(Self.stranger, limit: 1, flow: flow)
        assertRefused(try drag.admit(Self.teammate, limit: 1, flow: flow), .limitExceeded, "Session s7 already has 1 destinations")
    }

    /// `forbidden` comes only from policy: nothing to take because visibility hides it is
    /// `cancel`, as on iOS; an app that proposes cancel (it found nothing it takes) while a
    /// flow rule refused it something it could otherwise see hears `forbidden`, whether or not
    /// something else is left; a copy of something left is answered as always.
    func testForbiddenMeansPolicyRefusedAndVisibilityMeansNothingToTake() throws {
        let hidden = [ItemDescriptor(representations: [RepresentationDescriptor(typeIdentifier: "text/x-app", visibility: .app)])]
        let (onlyHidden, _) = makeSession(items: hidden)
        try onlyHidden.admit(Self.stranger, limit: 64, flow: Self.noRules)
        XCTAssertEqual(try onlyHidden.propose(.copy, by: Self.stranger, entering: true, flow: Self.noRules), .cancel)
        XCTAssertEqual(try onlyHidden.propose(.move, by: Self.stranger, entering: false, flow: Self.noRules), .cancel)
        XCTAssertEqual(try onlyHidden.propose(.cancel, by: Self.stranger, entering: false, flow: Self.noRules), .cancel)
        XCTAssertEqual(try onlyHidden.propose(.forbidden, by: Self.stranger, entering: false, flow: Self.noRules), .forbidden,
                       "an app may still refuse on its own")
        try onlyHidden.admit(Self.sameApp, limit: 64, flow: Self.noRules)
        XCTAssertEqual(try onlyHidden.propose(.cancel, by: Self.sameApp, entering: true, flow: Self.noRules), .cancel,
                       "something to take, and the app declines: no policy in it")

        let origin = SourceLocation(file: "/etc/dragbroker/dragbroker.conf", line: 3)
        let denyText = FlowView(policy: Policy(flows: [FlowRule(from: .any, to: .any, typePatterns: ["text/plain"], action: .deny, origin: origin)]),
                                types: MimeDatabase.system)
        // One representation hidden by visibility, the only other one denied: policy refused.
        let mixed = [ItemDescriptor(representations: [RepresentationDescriptor(typeIdentifier: "application/x-app", visibility: .app),
                                                      RepresentationDescriptor(typeIdentifier: "text/plain;charset=utf-8", visibility: .all)])]
        let (refused, _) = makeSession(items: mixed)
        try refused.admit(Self.stranger, limit: 64, flow: denyText)
        for proposal in [DropOperation.cancel, .copy, .move, .forbidden] {
            XCTAssertEqual(try refused.propose(proposal, by: Self.stranger, entering: true, flow: denyText), .forbidden, proposal.rawValue)
        }
        // The source's own app also sees application/x-app, which the rule leaves alone: a
        // copy of it goes; declining it, the app hears that policy refused it the text.
        try refused.admit(Self.sameApp, limit: 64, flow: denyText)
        XCTAssertEqual(try refused.propose(.copy, by: Self.sameApp, entering: true, flow: denyText), .copy)
        XCTAssertEqual(try refused.propose(.cancel, by: Self.sameApp, entering: false, flow: denyText), .forbidden)
    }

    func testSizeRulesLimitsAndFailClosedActWhenALoadStarts() throws {
        let (session, _) = makeSession()
        try drop(session, by: Self.stranger)
        let origin = SourceLocation(file: "/etc/dragbroker/dragbroker.conf", line: 12)
        let capped = Policy(flows: [FlowRule(from: .any, to: .any, largerThan: 5, action: .deny, origin: origin)])
        XCTAssertEqual(try session.authorizeLoad(item: 0, type: "text/plain", by: Self.stranger, rules: rules(policy: capped)).sizeRule?.limit, 5,
                       "a size rule caps the stream instead of hiding the type")
        assertRefused(try session.authorizeLoad(item: 0, type: "text/plain", by: Self.stranger, rules: rules(auditRefuses: true)), .failed,
                      "The transfer log cannot record transfers right now, and the policy refuses transfers it cannot audit (FailClosed=yes)")
        var limits = Limits()
        limits.concurrentLoadsPerSession = 2
        for _ in 0..<2 { _ = try open(session, by: Self.stranger) }
        assertRefused(try session.authorizeLoad(item: 0, type: "text/plain", by: Self.stranger, rules: rules(limits: limits)), .limitExceeded,
                      "Session s7 already has 2 loads in flight")
    }

    /// A load request is worked out once and kept, but only for the caller's identity and the
    /// policy it was worked out under: a reload (new identities, a new policy) or another
    /// flow view gets its own answer, and what is kept stays bounded whatever a client asks.
    func testAKeptLoadResolutionHoldsOnlyForItsIdentityAndPolicy() throws {
        let (session, _) = makeSession()
        try drop(session, by: Self.stranger)
        let open = rules()
        XCTAssertEqual(try session.authorizeLoad(item: 0, type: "text/*", by: Self.stranger, rules: open).typeIdentifier, "text/plain")
        XCTAssertEqual(try session.authorizeLoad(item: 0, type: "text/*", by: Self.stranger, rules: open).typeIdentifier, "text/plain")
        XCTAssertEqual(session.loadResolutions.count, 1, "asked again, answered from what was kept")

        // The same connection, its identity made anew under a policy that puts it in the
        // source's app: it sees the app's own representation, the closest listed first.
        let reidentified = Self.identity(Self.stranger.uniqueName, flatpak: "org.example.Editor")
        XCTAssertEqual(try session.authorizeLoad(item: 0, type: "text/*", by: reidentified, rules: open).typeIdentifier, "text/x-app")

        // Another policy: a size rule, then a rule that hides the text from it.
        let origin = SourceLocation(file: "/etc/dragbroker/dragbroker.conf", line: 7)
        let capped = Policy(flows: [FlowRule(from: .any, to: .any, largerThan: 5, action: .deny, origin: origin)])
        XCTAssertEqual(try session.authorizeLoad(item: 0, type: "text/*", by: Self.stranger, rules: rules(policy: capped)).sizeRule?.limit, 5)
        let denied = Policy(flows: [FlowRule(from: .any, to: .any, typePatterns: ["text/plain"], action: .deny, origin: origin)])
        assertRefused(try session.authorizeLoad(item: 0, type: "text/*", by: Self.stranger, rules: rules(policy: denied)), .notFound,
                      "No item 0: session s7 has 0 item(s)")
        XCTAssertNil(try session.authorizeLoad(item: 0, type: "text/*", by: Self.stranger, rules: open).sizeRule,
                     "back under the first view, its own answer")

        // Forty representations asked for one by one: each answered right, at most the limit kept.
        let many = [ItemDescriptor(representations: (0..<40).map { RepresentationDescriptor(typeIdentifier: "text/x-t\($0)", visibility: .all) })]
        let (wide, _) = makeSession(items: many)
        try drop(wide, by: Self.stranger)
        for number in 0..<40 {
            XCTAssertEqual(try wide.authorizeLoad(item: 0, type: "text/x-t\(number)", by: Self.stranger, rules: open).typeIdentifier, "text/x-t\(number)")
            XCTAssertLessThanOrEqual(wide.loadResolutions.count, LoadResolution.limit)
        }
        XCTAssertEqual(wide.loadResolutions.count, 40 - LoadResolution.limit)
    }

    /// Each policy the daemon applies is a new generation of its flow view, and reading the
    /// view again without a reload is the same one: what sessions keep lasts until a reload.
    func testAReloadIsANewPolicyGeneration() {
        let resolver = IdentityResolver(policy: Policy())
        let first = resolver.policyGeneration
        XCTAssertEqual(resolver.policyGeneration, first)
        resolver.apply(Policy())
        XCTAssertNotEqual(resolver.policyGeneration, first, "even the same policy again")
        XCTAssertNotEqual(FlowView(policy: Policy(), types: Self.types).generation, FlowView(policy: Policy(), types: Self.types).generation,
                          "a view made without a generation is one of its own")
    }

    func testTheDaemonsSharesAreAskedOnlyAfterTheSessionsOwnRulesAndARefusedLoadIsNeverTracked() throws {
        let (session, events) = makeSession()
        try drop(session, by: Self.stranger)
        var asked: [UInt32] = []
        let full = { (request: LoadRequest) throws(BrokerError) in
            asked.append(request.id)
            throw .limitExceeded("dragbrokerd has 4 loads in flight, its limit (LoadsTotal=4)")
        }
        let before = events.events
        // A stranger to the session hears why, not whether the daemon's shares are spent.
        assertRefused(try session.openLoad(item: 0, type: "text/plain", by: Self.teammate, rules: rules(), admit: full), .accessDenied,
                      "Present the session token with PresentToken before using session s7")
        assertRefused(try session.openLoad(item: 0, type: "text/x-none", by: Self.stranger, rules: rules(), admit: full), .notFound,
                      "Item 0 has no representation that matches 'text/x-none'")
        XCTAssertEqual(asked, [])
        assertRefused(try session.openLoad(item: 0, type: "text/plain", by: Self.stranger, rules: rules(), admit: full), .limitExceeded,
                      "dragbrokerd has 4 loads in flight, its limit (LoadsTotal=4)")
        XCTAssertEqual(asked, [1])
        XCTAssertEqual(events.events, before, "a refused load is never on record")
        try session.conclude(by: Self.stranger)
        XCTAssertTrue(session.isOver, "no load of the refused one keeps the transfer open")
        XCTAssertEqual(events.events.last, "ended completed ok")
    }

    func testALoadReportsOneOutcomeAndTheLastOneFinishesAConcludedTransfer() throws {
        let (session, events) = makeSession()
        try drop(session, by: Self.teammate)
        let load = try open(session, by: Self.teammate)
        try session.conclude(by: Self.teammate)
        XCTAssertFalse(session.isOver, "a load in flight keeps the transfer open")
        assertRefused(try session.cancelLoad(1, by: Self.stranger), .accessDenied,
                      "Only the load's destination, the session's source or an administrator may cancel load 1")
        try session.setExpectedSize(42, load: 1, by: Self.source)
        assertRefused(try session.setExpectedSize(42, load: 1, by: Self.teammate), .accessDenied,
                      "Only the source of session s7 may announce a load's size")
        try session.cancelLoad(1, by: Self.teammate)
        load.stop(BrokerError(.timeout, "twice"))
        XCTAssertEqual(Array(events.events.suffix(6)),
                       ["loadStarted 1", "concluded", "loadSizeAnnounced 1 42", "loadFinished 1 Cancelled", "transferFinished", "ended completed ok"])
        assertRefused(try session.cancelLoad(1, by: Self.teammate), .notFound, "No load 1 in flight in session s7")
        XCTAssertNoThrow(try session.setExpectedSize(1, load: 1, by: Self.source), "an announcement racing the load's end is ignored")
        assertRefused(try session.setExpectedSize(1, load: 9, by: Self.source), .notFound, "No load 9 in session s7")
    }

    // MARK: The registry

    func testTheRegistryFindsSessionsByIDPathTokenAndPartyAndForgetsThemWhenTheyEnd() throws {
        var policy = Policy()
        policy.limits.sessionsPerConnection = 2
        policy.limits.sessionsTotal = 3
        let registry = Registry(policy: policy, types: MimeDatabase(subclasses: [:], aliases: [:]), sessionNumbers: SessionNumbers(next: 41, reserved: 0, store: nil))
        var ended: [String] = []
        registry.onEvent = { session, event in if case .ended = event { ended.append(session.id) } }
        let a = try registry.begin(source: Self.source, items: Self.items, options: SessionOptions(), providerPath: "/p")
        let b = try registry.begin(source: Self.source, items: Self.items, options: SessionOptions(restrictedToApp: true), providerPath: "/p")
        XCTAssertEqual([a.id, b.id], ["s41", "s42"])
        XCTAssertThrowsError(try registry.begin(source: Self.source, items: Self.items, options: SessionOptions(), providerPath: "/p")) {
            XCTAssertEqual($0 as? BrokerError, .limitExceeded("This connection already has 2 live sessions (limit 2)"))
        }
        let c = try registry.begin(source: Self.teammate, items: Self.items, options: SessionOptions(), providerPath: "/p")
        XCTAssertThrowsError(try registry.begin(source: Self.stranger, items: Self.items, options: SessionOptions(), providerPath: "/p")) {
            XCTAssertEqual($0 as? BrokerError, .limitExceeded("The broker holds 3 sessions, its limit"))
        }
        XCTAssertTrue(registry.session(atPath: "/org/dragbroker/Broker1/session/s42") === b)
        XCTAssertNil(registry.session(atPath: "/org/dragbroker/Broker1/session/s4"))
        XCTAssertTrue(try registry.present(token: a.token.hex, by: Self.stranger) === a)
        XCTAssertThrowsError(try registry.present(token: b.token.hex, by: Self.stranger)) {
            XCTAssertEqual($0 as? BrokerError, .notFound("No live session has this token"), "restricted: no such session for another app")
        }
        var forged = Array(a.token.hex)
        forged[63] = forged[63] == "0" ? "1" : "0"
        XCTAssertThrowsError(try registry.present(token: String(forged), by: Self.stranger))
        XCTAssertThrowsError(try registry.present(token: a.token.hex.uppercased(), by: Self.stranger))
        XCTAssertTrue(a.isParty(Self.stranger.uniqueName))
        registry.peerVanished(Self.source.uniqueName)
        XCTAssertEqual(Set(ended), ["s41", "s42"])
        XCTAssertEqual(ended.count, 2)
        XCTAssertEqual(registry.count, 1)
        registry.peerVanished(Self.stranger.uniqueName)
        XCTAssertEqual(ended.count, 2, "a destination of ended sessions only leaving ends nothing more")
        XCTAssertTrue(registry.session(id: "s43") === c)
        XCTAssertThrowsError(try registry.present(token: a.token.hex, by: Self.stranger), "a token dies with its session")
        _ = try registry.begin(source: Self.source, items: Self.items, options: SessionOptions(), providerPath: "/p")
    }

    func testASourceLeavingWithManySessionsLeavesTheRegistryAtOnceAndEndsThemInSlices() throws {
        var policy = Policy()
        policy.limits.sessionsPerConnection = 1000
        policy.limits.sessionsPerApp = 1000
        policy.limits.sessionsPerUser = 1000
        let registry = Registry(policy: policy, types: MimeDatabase(subclasses: [:], aliases: [:]), sessionNumbers: SessionNumbers(next: 1, reserved: 0, store: nil))
        var pending: [() -> Void] = []
        registry.later = { pending.append($0) }
        var ended: [String: String] = [:]
        registry.onEvent = { session, event in if case .ended(let outcome, _) = event { ended[session.id] = outcome.rawValue } }
        let sessions = try (0..<600).map { _ in
            try registry.begin(source: Self.source, items: Self.items, options: SessionOptions(), providerPath: "/p")
        }
        let kept = try registry.begin(source: Self.teammate, items: Self.items, options: SessionOptions(), providerPath: "/p")
        _ = try registry.present(token: sessions[7].token.hex, by: Self.stranger)
        _ = try registry.present(token: kept.token.hex, by: Self.source)

        registry.peerVanished(Self.source.uniqueName)
        XCTAssertEqual(registry.count, 1, "no session of the departed source is reachable any more")
        XCTAssertNil(registry.session(id: sessions[599].id))
        XCTAssertThrowsError(try registry.present(token: sessions[0].token.hex, by: Self.stranger))
        XCTAssertFalse(kept.isParty(Self.source.uniqueName), "a session it only joined forgets it")
        XCTAssertEqual(ended.count, Registry.teardownSlice)
        XCTAssertEqual(pending.count, 1)
        while !pending.isEmpty { pending.removeFirst()() }
        XCTAssertEqual(ended.count, 600)
        XCTAssertEqual(Set(ended.values), ["source-disconnected"])
        XCTAssertEqual(sessions[7].departed, Self.source.uniqueName, "nobody is left to tell at the source")
        registry.peerVanished(Self.stranger.uniqueName)
        XCTAssertEqual(ended.count, 600)

        // Shutting down finishes a teardown still under way: no end goes unrecorded.
        for _ in 0..<300 { _ = try registry.begin(source: Self.sameApp, items: Self.items, options: SessionOptions(), providerPath: "/p") }
        registry.peerVanished(Self.sameApp.uniqueName)
        XCTAssertEqual(ended.count, 600 + Registry.teardownSlice)
        registry.endAll(BrokerError(.cancelled, "The broker is shutting down"))
        XCTAssertEqual(ended.count, 901)
        XCTAssertEqual(ended[kept.id], "cancelled")
        XCTAssertEqual(registry.count, 0)
        while !pending.isEmpty { pending.removeFirst()() }
        XCTAssertEqual(ended.count, 901, "a continuation left over from before the shutdown finds nothing to do")
    }

    // MARK: Deadlines

    func testADeadlineCountsFromTheBeginningWhileDraggingAndFromTheLastActivityAfterTheDrop() throws {
        let limits = Limits()
        let (session, events) = makeSession()
        XCTAssertEqual(session.deadline(limits), session.deadlineStart + 300_000_000)
        try drop(session, by: Self.teammate)
        let dropped = session.deadlineStart
        XCTAssertEqual(session.deadline(limits), dropped + 60_000_000)
        let load = try open(session, by: Self.teammate)
        XCTAssertNil(session.deadline(limits), "a load in flight has deadlines of its own")
        load.stop(BrokerError(.cancelled, "stopped"))
        XCTAssertGreaterThanOrEqual(session.deadlineStart, dropped)
        XCTAssertEqual(session.deadline(limits), session.deadlineStart + 60_000_000, "the wait for Conclude starts again")
        session.timeOut(limits)
        XCTAssertEqual(events.events.last, "ended timed-out Timeout")
        XCTAssertTrue(session.isOver)
    }

    func testTheRegistryEndsEachSessionAtItsDeadlineWithOneTimerForAll() throws {
        let registry = Registry(policy: Policy(), types: Self.types, sessionNumbers: SessionNumbers(next: 1, reserved: 0, store: nil))
        var armed: [UInt64] = []
        registry.schedule = { delay, _ in
            armed.append(delay)
            return NSObject()
        }
        var ended: [String] = []
        registry.onEvent = { session, event in
            if case .ended(let outcome, let error) = event {
                ended.append("\(session.id) \(outcome.rawValue) \(error?.code.busName ?? "-") \(error?.message ?? "")")
            }
        }
        let dragged = try registry.begin(source: Self.source, items: Self.items, options: SessionOptions(), providerPath: "/p")
        XCTAssertEqual(armed.count, 1)
        XCTAssertEqual(Double(armed[0]), 300_000_000, accuracy: 1_000_000)
        let draggedLater = try registry.begin(source: Self.source, items: Self.items, options: SessionOptions(), providerPath: "/p")
        XCTAssertEqual(armed.count, 1, "a later deadline arms nothing")
        let dropped = try registry.begin(source: Self.sameApp, items: Self.items, options: SessionOptions(), providerPath: "/p")
        _ = try registry.present(token: dropped.token.hex, by: Self.teammate)
        _ = try dropped.propose(.copy, by: Self.teammate, entering: true, flow: registry.flow)
        _ = try dropped.performDrop(by: Self.teammate)
        XCTAssertEqual(armed.count, 2, "waiting for Conclude ends sooner than the drags")
        XCTAssertEqual(Double(armed[1]), 60_000_000, accuracy: 1_000_000)

        let limits = registry.limits
        let concludeBy = try XCTUnwrap(dropped.deadline(limits))
        registry.expireDeadlines(at: concludeBy - 1)
        XCTAssertEqual(ended, [])
        XCTAssertEqual(armed.last, 1, "the timer waits for the earliest deadline again")
        registry.expireDeadlines(at: concludeBy)
        XCTAssertEqual(ended, ["s3 timed-out org.dragbroker.Broker1.Error.Timeout The destination of session s3 neither loaded nor concluded within 60 s (ConcludeTimeoutSec=)"])
        registry.expireDeadlines(at: try XCTUnwrap(dragged.deadline(limits)))
        XCTAssertEqual(ended.count, 2)
        registry.expireDeadlines(at: try XCTUnwrap(draggedLater.deadline(limits)))
        XCTAssertEqual(Array(ended.dropFirst()), [
            "s1 timed-out org.dragbroker.Broker1.Error.Timeout Session s1 was not dropped within 300 s of BeginSession (DragTimeoutSec=)",
            "s2 timed-out org.dragbroker.Broker1.Error.Timeout Session s2 was not dropped within 300 s of BeginSession (DragTimeoutSec=)",
        ])
        XCTAssertEqual(registry.count, 0)
        let armedBefore = armed.count
        registry.expireDeadlines(at: .max)
        XCTAssertEqual(armed.count, armedBefore, "no session, no timer")
    }

    func testTokensRoundTripThroughTheirHexForm() throws {
        let token = try SessionToken.random()
        XCTAssertEqual(token.hex.count, 64)
        XCTAssertTrue(SessionToken(hex: token.hex)?.matches(token) == true)
        XCTAssertNil(SessionToken(hex: String(token.hex.dropLast())))
        XCTAssertNil(SessionToken(hex: token.hex + "00"))
        XCTAssertEqual(SessionToken(hex: String(repeating: "0f", count: 32))?.hex, String(repeating: "0f", count: 32))
    }
}

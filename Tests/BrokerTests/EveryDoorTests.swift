import BrokerProtocol
import Foundation
import XCTest

/// Who may know of a session and who may use it, asked at every door the daemon has: the
/// manager's methods and SessionCount, the session's methods and Properties, ObjectManager,
/// introspection and signals. Sandboxed callers run as Flatpak runs apps, in bubblewrap behind
/// xdg-dbus-proxy; unsandboxed ones are plain processes of the daemon's user (root here), which
/// makes them administrators.
final class EveryDoorTests: XCTestCase {
    static let sessions = "/org/dragbroker/Broker1/session"
    static let bystanderID = "org.sandboxed.Bystander"

    /// What a non-party gets from anything on a session that exists for it.
    func notAParty(_ id: String) -> String {
        err(.accessDenied, "Present the session token with PresentToken before using session \(id)")
    }

    /// What anyone gets from a session that does not exist for it, as from one that never existed.
    func noSuchSession(_ id: String) -> String {
        err(.notFound, "No live session at \(Self.sessions)/\(id): it ended or never existed")
    }

    /// SessionCount's broadcast: that it changed, never to what, since that differs per caller.
    static let countChanged = #"["org.freedesktop.DBus.Properties", "PropertiesChanged", "/org/dragbroker/Broker1", ["org.dragbroker.Broker1.Manager", {}, ["SessionCount"]]]"#

    /// The source app's three-visibility drag, open to other apps.
    static let openDrag = SecurityTests.threeVisibilities.replacingOccurrences(of: "RESTRICTED", with: "")
    static let restrictedDrag = SecurityTests.threeVisibilities.replacingOccurrences(of: "RESTRICTED", with: #","restricted":true"#)

    /// DescribeSession's answer for the source app's open drag, as the probe prints it.
    static func fullView(_ id: String, restricted: Bool = false) -> String {
        #"OK ["\#(id)", "active", "cancel", "com.example.Source", "com.example", "", \#(restricted), [["secret.txt", 0.0, 0.0, [["text/x-app", "app", "data"], ["text/x-team", "team", "data"], ["text/x-all", "all", "data"]]]], []]"#
    }

    func testTheDaemonSeesAnAppBehindItsBusProxyAsTheFlatpakItIs() throws {
        let world = try World()
        let probe = try world.peer("bystander", sandbox: .bubblewrap(appID: Self.bystanderID), program: .probe)
        // The connection is the proxy's: its executable and PID, the app's ID from its root.
        XCTAssertEqual(probe.run("whoami"),
                       #"OK {"AppID": "org.sandboxed.Bystander", "Executable": "/usr/bin/xdg-dbus-proxy", "Managed": false, "PID": \#(probe.reportedPID), "Sandboxed": true, "Source": "flatpak", "Team": "org.sandboxed", "UID": \#(getuid())}"#)
        XCTAssertNotEqual(probe.reportedPID, probe.process.processIdentifier)

        XCTAssertEqual(probe.run("count"), "OK 0")
    }

    func testASandboxedBystanderLearnsNothingOfAnotherAppsSessions() throws {
        let world = try World { SecurityTests.registry($0) }
        let source = try world.peer("source-app")
        let (token, _) = try source.begin(Self.openDrag)
        _ = try source.begin(Self.restrictedDrag)
        let bystander = try world.peer("bystander", sandbox: .bubblewrap(appID: Self.bystanderID), program: .probe)

        XCTAssertEqual(bystander.run("count"), "OK 0", "two sessions live, none of them the bystander's to know")
        XCTAssertEqual(bystander.run("list"), "OK []")
        XCTAssertEqual(bystander.run("describe s1"), err(.notFound, "No live session s1"))
        XCTAssertEqual(bystander.run("describe s2"), err(.notFound, "No live session s2"))
        XCTAssertEqual(bystander.run("monitor"), err(.accessDenied, "A sandboxed app may not monitor other apps' drags"))
        XCTAssertEqual(bystander.run("managed"), "OK {}")
        XCTAssertEqual(bystander.run("managed \(Self.sessions)"), "OK {}")
        XCTAssertEqual(bystander.run("children \(Self.sessions)"), "OK []")
        for id in ["s1", "s2"] {
            let path = "\(Self.sessions)/\(id)"
            XCTAssertEqual(bystander.run("get \(path) State"), noSuchSession(id))
            XCTAssertEqual(bystander.run("getall \(path)"), noSuchSession(id))
            XCTAssertEqual(bystander.run("set \(path) State dropped"), noSuchSession(id))
            XCTAssertEqual(bystander.run("call \(path) GetItems"), noSuchSession(id))
        }

        // The drag goes on to its end; all the bystander hears is that some count changed.
        let destination = try world.peer("other-app")
        _ = destination.run("present \(token)")
        _ = destination.run("enter copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("load 0 text/x-all"), "OK 7 \(Data("for all".utf8).base64EncodedString())")
        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertTrue(source.waitFor("EVENT transferFinished"))
        XCTAssertEqual(bystander.run("signals 1"), "OK [\(Self.countChanged)]")

        // Its own session is another matter: it counts, lists and describes it, in full.
        let own = bystander.run("begin open app all")
        XCTAssertTrue(own.hasPrefix(#"OK ["/org/dragbroker/Broker1/session/s3", "#), own)
        XCTAssertEqual(bystander.run("count"), "OK 1")
        XCTAssertEqual(bystander.run("list"), #"OK [["s3", "/org/dragbroker/Broker1/session/s3", "org.sandboxed.Bystander", "active", 1]]"#)
        XCTAssertEqual(bystander.run("describe s3"),
                       #"OK ["s3", "active", "cancel", "org.sandboxed.Bystander", "org.sandboxed", "", false, [["probe.txt", 0.0, 0.0, [["text/x-app", "app", "data"], ["text/x-all", "all", "data"]]]], []]"#)
        XCTAssertEqual(bystander.run("children \(Self.sessions)"), #"OK ["s3"]"#)
    }

    /// An administrator (root, or the daemon's user, outside any sandbox) inspects every session
    /// not restricted to another app, in full; a teammate in a sandbox is just another app.
    func testAdministratorsSeeEveryOpenSessionInFullAndTeammatesDoNot() throws {
        let world = try World { SecurityTests.registry($0) }
        let source = try world.peer("source-app")
        _ = try source.begin(Self.openDrag)
        _ = try source.begin(Self.restrictedDrag)
        XCTAssertEqual(source.run("sessions"), "OK s1:active,s2:active", "its own app sees both")

        let administrator = try world.peer("operator", program: .probe)
        XCTAssertEqual(administrator.run("count"), "OK 1")
        XCTAssertEqual(administrator.run("list"), #"OK [["s1", "/org/dragbroker/Broker1/session/s1", "com.example.Source", "active", 1]]"#)
        XCTAssertEqual(administrator.run("describe s1"), Self.fullView("s1"))
        XCTAssertEqual(administrator.run("describe s2"), err(.notFound, "No live session s2"))
        XCTAssertEqual(administrator.run("monitor"), "OK")
        XCTAssertEqual(administrator.run("children \(Self.sessions)"), #"OK ["s1"]"#)

        let show = try Child(executable: productsDirectory.appendingPathComponent("dragctl"), arguments: ["show-session", "s1"],
                             environment: ["DRAGBROKER_BUS_ADDRESS": world.bus.address])
        show.process.waitUntilExit()
        usleep(20_000)
        XCTAssertEqual(show.stdout.all { _ in true }, [
            "Session s1",
            "      State: active",
            "     Source: com.example.Source (team com.example)",
            "Destination: -",
            " Restricted: no",
            "      Items:",
            "             0: secret.txt",
            "                text/x-app (data, visible to app)",
            "                text/x-team (data, visible to team)",
            "                text/x-all (data, visible to all)",
        ])

        // Same team, sandboxed: it may join with the token and see team representations, but
        // inspecting is for the app itself and administrators.
        let teammate = try world.peer("teammate", sandbox: .bubblewrap(appID: "com.example.Boxed"), program: .probe)
        XCTAssertEqual(teammate.run("count"), "OK 0")
        XCTAssertEqual(teammate.run("list"), "OK []")
        XCTAssertEqual(teammate.run("describe s1"), err(.notFound, "No live session s1"))
    }

    func testPropertiesAreThePartiesAloneAtEveryDoor() throws {
        let world = try World()
        let source = try world.peer("source", program: .probe)
        let app = try XCTUnwrap(source.run("whoami").firstMatch(of: /"AppID": "([^"]*)"/)?.1)
        let begun = source.run("begin open all")
        let token = try XCTUnwrap(begun.firstMatch(of: /", "([0-9a-f]{64})"\]/)?.1)
        let path = "\(Self.sessions)/s1"
        let properties = #"{"Id": "s1", "ItemCount": 1, "Operation": "cancel", "Progress": [0, 0], "SourceApp": "\#(app)", "State": "active"}"#
        let standard = #""org.freedesktop.DBus.Introspectable": {}, "org.freedesktop.DBus.Peer": {}, "org.freedesktop.DBus.Properties": {}"#

        // The source: a party, unsandboxed.
        XCTAssertEqual(source.run("get \(path) State"), #"OK "active""#)
        XCTAssertEqual(source.run("getall \(path)"), "OK \(properties)")
        XCTAssertEqual(source.run("managed"), #"OK {"\#(path)": {"org.dragbroker.Broker1.Session": \#(properties), \#(standard)}}"#)
        XCTAssertEqual(source.run("set \(path) State dropped"),
                       "ERR org.freedesktop.DBus.Error.PropertyReadOnly Property 'State' is not writable.")

        // An administrator who is no party: the session exists for it, its properties do not.
        let administrator = try world.peer("operator", program: .probe)
        XCTAssertEqual(administrator.run("get \(path) State"), notAParty("s1"))
        XCTAssertEqual(administrator.run("get \(path) Id"), notAParty("s1"))
        XCTAssertEqual(administrator.run("getall \(path)"), notAParty("s1"))
        XCTAssertEqual(administrator.run("set \(path) State dropped"), notAParty("s1"))
        XCTAssertEqual(administrator.run("managed"), #"OK {"\#(path)": {"org.dragbroker.Broker1.Session": {}, \#(standard)}}"#)
        XCTAssertEqual(administrator.run("managed \(Self.sessions)"), #"OK {"\#(path)": {"org.dragbroker.Broker1.Session": {}, \#(standard)}}"#)
        XCTAssertEqual(administrator.run("children \(Self.sessions)"), #"OK ["s1"]"#)

        // A sandboxed destination: nothing before it presents the token, a party's view after.
        let destination = try world.peer("destination", sandbox: .bubblewrap(appID: Self.bystanderID), program: .probe)
        XCTAssertEqual(destination.run("get \(path) State"), noSuchSession("s1"))
        XCTAssertEqual(destination.run("present \(token)"), #"OK "\#(path)""#)
        XCTAssertEqual(destination.run("get \(path) State"), #"OK "active""#)
        XCTAssertEqual(destination.run("getall \(path)"), "OK \(properties)")
        XCTAssertEqual(destination.run("managed"), #"OK {"\#(path)": {"org.dragbroker.Broker1.Session": \#(properties), \#(standard)}}"#)
        XCTAssertEqual(destination.run("children \(Self.sessions)"), #"OK ["s1"]"#)
        XCTAssertEqual(destination.run("count"), "OK 0", "taking part is not inspecting: ListSessions does not show it either")
        XCTAssertEqual(destination.run("list"), "OK []")

        // Changes reach the parties, and only them.
        XCTAssertEqual(destination.run("call \(path) Enter s copy"), #"OK "copy""#)
        XCTAssertEqual(destination.run("call \(path) PerformDrop"), #"OK "copy""#)
        let dropped = #"["org.freedesktop.DBus.Properties", "PropertiesChanged", "\#(path)", ["org.dragbroker.Broker1.Session", {"Operation": "copy", "State": "dropped"}, []]]"#
        XCTAssertEqual(destination.run("signals 1"), "OK [\(dropped)]")
        XCTAssertEqual(source.run("signals 1"), """
            OK [["org.freedesktop.DBus.ObjectManager", "InterfacesAdded", "/org/dragbroker/Broker1", ["\(path)", {"org.dragbroker.Broker1.Session": \(properties), \(standard)}]], \(Self.countChanged), \(dropped), ["org.dragbroker.Broker1.Session", "WillEnd", "\(path)", ["copy"]]]
            """)
        XCTAssertEqual(administrator.run("signals 0.5"), "OK []")
        XCTAssertEqual(administrator.run("get \(path) State"), notAParty("s1"))
    }

    func testEveryMethodRefusesANonPartyBeforeRevealingAnything() throws {
        let world = try World { SecurityTests.registry($0) }
        let source = try world.peer("source-app")
        let (token, path) = try source.begin(EndToEndTests.helloDrag)
        let (_, restricted) = try source.begin(EndToEndTests.helloDrag.replacingOccurrences(of: "]}]}", with: "]}],\"restricted\":true}"))
        let administrator = try world.peer("operator", program: .probe)
        let bystander = try world.peer("bystander", sandbox: .bubblewrap(appID: Self.bystanderID), program: .probe)
        // Every method, with arguments a party would have its own errors for (a bad type, a
        // proposal that does not exist, a load that does not exist).
        let calls = [
            "GetItems", "ConformingItems s not-a-type", "AddItems a(sdda(sss))", "Enter s sideways", "Update s copy", "Exit",
            "PerformDrop", "Load us 7 text/plain", "CancelLoad u 9", "SetExpectedSize ut 9 5", "Conclude", "Cancel",
        ]
        func check(_ context: String) {
            for call in calls {
                XCTAssertEqual(administrator.run("call \(path) \(call)"), notAParty("s1"), "\(call), \(context)")
                XCTAssertEqual(bystander.run("call \(path) \(call)"), noSuchSession("s1"), "\(call), \(context)")
                XCTAssertEqual(administrator.run("call \(restricted) \(call)"), noSuchSession("s2"), "\(call), \(context)")
            }
        }
        check("while dragging")
        let destination = try world.peer("other-app")
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        check("after the drop")
        // The session is untouched by all of it.
        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 11 \(Data("hello, drop".utf8).base64EncodedString())")
        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertTrue(source.waitFor("EVENT transferFinished"))
        XCTAssertEqual(source.handlerCalls, ["HANDLER 0 text/plain"])
    }
}

import BrokerProtocol
import BusKit
import Foundation
import XCTest

/// Every refusal a client can provoke, with its exact name and message.
final class ErrorPathTests: XCTestCase {
    func failure(_ result: Result<Message, BusError>) -> BusError? {
        if case .failure(let error) = result { return error }
        return nil
    }

    func testArgumentsAndLimits() throws {
        let world = try World { _ in "[Limits]\nItemsPerSession=2\nSessionsTotal=2\n" }
        let probe = try BusProbe(address: world.bus.address)
        XCTAssertEqual(failure(probe.begin(kind: "stream")),
                       BrokerError(.invalidArgument, "Unknown kind 'stream' for type 'text/plain': expected data or file").busError)
        XCTAssertEqual(failure(probe.begin(options: [("AllowsMove", "s", { m throws(BusError) in try m.append("yes") })])),
                       BrokerError(.invalidArgument, "Option 'AllowsMove' must be a boolean (variant of type 'b')").busError)
        XCTAssertEqual(failure(probe.begin(items: 3)), BrokerError(.limitExceeded, "A session holds at most 2 items").busError)
        XCTAssertEqual(failure(probe.begin(member: .copy, options: [("AllowsMove", "b", { m throws(BusError) in try m.append(true) })])),
                       BrokerError(.invalidArgument, "Unknown pasteboard option 'AllowsMove': expected RestrictedToApp or ExpirationSec").busError)
        for (type, value) in [("u", UInt32(0)), ("t", UInt32(60))] {
            XCTAssertEqual(failure(probe.begin(member: .copy, options: [("ExpirationSec", type, { m throws(BusError) in
                if type == "u" { try m.append(value) } else { try m.append(UInt64(value)) }
            })])), BrokerError(.invalidArgument, "Option 'ExpirationSec' must be a positive number of seconds (variant of type 'u')").busError)
        }
        XCTAssertEqual(failure(probe.begin(items: 3, member: .copy)), BrokerError(.limitExceeded, "A session holds at most 2 items").busError)

        let first = try probe.begin(items: 2).get()
        let path = try first.readObjectPath()
        let token = try first.readString()
        let addItems = probe.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "AddItems") { m throws(BusError) in
            try m.openContainer("a", ItemDescriptor.signature)
            try ItemDescriptor(representations: [RepresentationDescriptor(typeIdentifier: "text/plain", visibility: .all)]).encode(to: m)
            try m.closeContainer()
        }
        XCTAssertEqual(failure(addItems), BrokerError(.limitExceeded, "A session holds at most 2 items; session s1 has 2").busError)
        // The drag's own source may not paste it, nor ask what it may offer on a clipboard.
        for (member, message) in [(SessionMember.paste, "Session s1 is a drag: Paste is for pasteboard entries; a drag is dropped with PerformDrop"),
                                  (.clearOffers, "Session s1 is no pasteboard entry: only an entry's representations are offered on the clipboard")] {
            XCTAssertEqual(failure(probe.call(BrokerNames.busName, path, BrokerNames.sessionInterface, member.name)),
                           BrokerError(.wrongState, message).busError)
        }
        XCTAssertEqual(probe.begin().errorName, "OK")
        XCTAssertEqual(failure(probe.begin()), BrokerError(.limitExceeded, "The broker holds 2 sessions, its limit").busError)

        // The probe is this session's source; a separate app presents the token.
        let setSize = probe.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "SetExpectedSize") { m throws(BusError) in
            try m.append(UInt32(99))
            try m.append(UInt64(1))
        }
        XCTAssertEqual(failure(setSize), BrokerError(.notFound, "No load 99 in session s1").busError)
        let other = try BusProbe(address: world.bus.address)
        XCTAssertEqual(other.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "PresentToken") { m throws(BusError) in
            try m.append(token)
        }.errorName, "OK")
        let enter = other.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "Enter") { m throws(BusError) in try m.append("teleport") }
        XCTAssertEqual(failure(enter),
                       BrokerError(.invalidArgument, "Unknown proposal 'teleport': expected cancel, forbidden, copy or move").busError)
        let cancel = other.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "Cancel")
        XCTAssertEqual(failure(cancel), BrokerError(.accessDenied, "Only the source of session s1 may cancel it").busError)
        let announce = other.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "SetExpectedSize") { m throws(BusError) in
            try m.append(UInt32(1))
            try m.append(UInt64(1))
        }
        XCTAssertEqual(failure(announce), BrokerError(.accessDenied, "Only the source of session s1 may announce a load's size").busError)
        let cancelLoad = other.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "CancelLoad") { m throws(BusError) in
            try m.append(UInt32(7))
        }
        XCTAssertEqual(failure(cancelLoad), BrokerError(.notFound, "No load 7 in flight in session s1").busError)
    }

    func testLoadsEndedByTheSourceOrABystanderOrAClosedPipe() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, path) = try source.begin("""
            {"items":[{"reps":[{"type":"application/x-slow","size":8388608,"chunk":65536,"pauseMs":20},\
            {"type":"application/x-gives-up","cancel":"out of paper"},\
            {"type":"application/x-pipe","kind":"file","file":"pipe"},\
            {"type":"application/x-file-gives-up","kind":"file","cancel":"-"}]}]}
            """)
        _ = destination.run("present \(token)")
        _ = destination.run("enter copy")
        _ = destination.run("drop")
        XCTAssertEqual(destination.run("load 0 application/x-gives-up"),
                       err(.cancelled, "The source cancelled the load: out of paper"))
        XCTAssertEqual(destination.run("loadfile 0 application/x-pipe"),
                       err(.providerFailed, "The source handed over a pipe, not a file: use a data representation to stream"))

        // A party that is neither the load's destination nor the source may not cancel it.
        destination.send("load 0 application/x-slow")
        XCTAssertNotNil(source.stdout.take { $0 == "HANDLER 0 application/x-slow" })
        let bystander = try BusProbe(address: world.bus.address)
        _ = bystander.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "PresentToken") { m throws(BusError) in
            try m.append(token)
        }
        let cancel = bystander.call(BrokerNames.busName, path, BrokerNames.sessionInterface, "CancelLoad") { m throws(BusError) in
            try m.append(UInt32(3))
        }
        XCTAssertEqual(failure(cancel),
                       BrokerError(.accessDenied, "Only the load's destination, the session's source or an administrator may cancel load 3").busError)
        XCTAssertEqual(source.run("cancelload 3"), "OK")
        XCTAssertEqual(destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") }, err(.cancelled, "The source cancelled load 3"))
        // A file's handler that throws Swift's CancellationError cancels, as a data handler's does.
        XCTAssertEqual(destination.run("loadfile 0 application/x-file-gives-up"),
                       err(.cancelled, "The source cancelled the load: The load was cancelled"))

        // A destination that closes its end mid-stream: the source hears Cancelled.
        let reader = try BusProbe(address: world.bus.address)
        let (secondToken, secondPath) = try source.begin(#"{"items":[{"reps":[{"type":"application/x-slow","size":8388608,"chunk":65536,"pauseMs":20}]}]}"#)
        _ = reader.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "PresentToken") { m throws(BusError) in
            try m.append(secondToken)
        }
        _ = reader.call(BrokerNames.busName, secondPath, BrokerNames.sessionInterface, "Enter") { m throws(BusError) in try m.append("copy") }
        _ = reader.call(BrokerNames.busName, secondPath, BrokerNames.sessionInterface, "PerformDrop")
        // The reply owns the descriptor it carried: only our duplicate outlives this statement.
        let pipe = try reader.call(BrokerNames.busName, secondPath, BrokerNames.sessionInterface, "Load") { m throws(BusError) in
            try m.append(UInt32(0))
            try m.append("application/x-slow")
        }.get().readFileDescriptor()
        close(pipe)
        let record = try world.daemon.waitForLog { try $0.loads().first { $0.sessionID == "s2" } }
        XCTAssertEqual(record.errorName, BrokerErrorCode.cancelled.busName)
        XCTAssertEqual(record.outcome, "cancelled")
    }

    func testSandboxedAppsAreNoAdministrators() throws {
        let world = try World()
        let sandboxed = try world.peer("sandboxed-app", sandbox: .flatpak(appID: "org.example.Sandboxed"))
        XCTAssertEqual(sandboxed.run("reload"),
                       err(.accessDenied, "Only root or the user dragbrokerd runs as may reload the policy, from outside any sandbox"))
        XCTAssertEqual(sandboxed.run("monitor"), err(.accessDenied, "A sandboxed app may not monitor other apps' drags"))
    }
}

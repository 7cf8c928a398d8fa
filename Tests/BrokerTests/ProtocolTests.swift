import BrokerProtocol
import BusKit
import Foundation
import XCTest

/// The published XML is the contract: it must equal what the running parties serve.
final class ProtocolTests: XCTestCase {
    static let interfacesDirectory = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Sources/BrokerProtocol/Interfaces")

    /// One `<interface>` element, without comments and with whitespace between tags removed.
    static func interfaceElement(_ name: String, in xml: String) throws -> String {
        let noComments = xml.replacingOccurrences(of: "<!--[\\s\\S]*?-->", with: "", options: .regularExpression)
        guard let start = noComments.range(of: "<interface name=\"\(name)\">"),
              let end = noComments.range(of: "</interface>", range: start.upperBound..<noComments.endIndex) else {
            throw HarnessError("no interface \(name) in:\n\(xml)")
        }
        return String(noComments[start.lowerBound..<end.upperBound])
            .replacingOccurrences(of: ">\\s+<", with: "><", options: .regularExpression)
    }

    static func published(_ name: String) throws -> String {
        try interfaceElement(name, in: String(contentsOf: interfacesDirectory.appendingPathComponent("\(name).xml"), encoding: .utf8))
    }

    /// busctl's JSON of one call's reply.
    static func busctl(_ address: String, _ arguments: [String]) throws -> Any {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/busctl")
        process.arguments = ["--address=\(address)", "--json=short", "call", BrokerNames.busName] + arguments
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw HarnessError("busctl \(arguments) failed") }
        return try JSONSerialization.jsonObject(with: data)
    }

    /// The daemon answers GetManagedObjects itself, in one pass over its registry: its answer
    /// must be what sd-bus's own walk gave, each session's entry what Properties.GetAll says.
    func testManagedObjectsListWhatPropertiesSayForTheSessionsTheCallerMaySee() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let (_, path) = try source.begin(EndToEndTests.helloDrag)
        _ = try source.begin(EndToEndTests.helloDrag.replacingOccurrences(of: "]}]}", with: "]}],\"restricted\":true}"))
        let managed = try Self.busctl(world.bus.address, [BrokerNames.managerPath, "org.freedesktop.DBus.ObjectManager", "GetManagedObjects"])
        let all = try Self.busctl(world.bus.address, [path, "org.freedesktop.DBus.Properties", "GetAll", "s", BrokerNames.sessionInterface])
        let objects = try XCTUnwrap(((managed as? [String: Any])?["data"] as? [Any])?.first as? [String: Any])
        XCTAssertEqual(objects.keys.sorted(), [path], "a restricted session is no object for another app")
        let interfaces = try XCTUnwrap(objects[path] as? [String: Any])
        XCTAssertEqual(interfaces.keys.sorted(), ["org.dragbroker.Broker1.Session", "org.freedesktop.DBus.Introspectable",
                                                 "org.freedesktop.DBus.Peer", "org.freedesktop.DBus.Properties"])
        for standard in ["org.freedesktop.DBus.Introspectable", "org.freedesktop.DBus.Peer", "org.freedesktop.DBus.Properties"] {
            XCTAssertEqual((interfaces[standard] as? [String: Any])?.count, 0)
        }
        let listed = try XCTUnwrap(interfaces[BrokerNames.sessionInterface] as? NSDictionary)
        let properties = try XCTUnwrap(((all as? [String: Any])?["data"] as? [Any])?.first as? NSDictionary)
        XCTAssertEqual(listed, properties)
        XCTAssertEqual(properties["Id"] as? NSDictionary, ["type": "s", "data": "s1"])
        XCTAssertEqual(properties["SourceApp"] as? NSDictionary, ["type": "s", "data": source.executable.path])
        XCTAssertEqual(properties["State"] as? NSDictionary, ["type": "s", "data": "active"])
        XCTAssertEqual(properties["ItemCount"] as? NSDictionary, ["type": "u", "data": 1])
        XCTAssertEqual(properties["Operation"] as? NSDictionary, ["type": "s", "data": "cancel"])
        XCTAssertEqual(properties["Progress"] as? NSDictionary, ["type": "(tt)", "data": [0, 0]])
        XCTAssertEqual(properties.count, 6)
    }

    func testPublishedXMLEqualsWhatTheDaemonAndTheClientServe() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let (_, path) = try source.begin(EndToEndTests.helloDrag)
        let probe = try BusProbe(address: world.bus.address)

        let manager = try probe.introspect(BrokerNames.busName, BrokerNames.managerPath)
        XCTAssertEqual(try Self.interfaceElement(BrokerNames.managerInterface, in: manager), try Self.published(BrokerNames.managerInterface))
        XCTAssertTrue(manager.contains("<interface name=\"org.freedesktop.DBus.ObjectManager\">"))
        XCTAssertTrue(manager.contains("<node name=\"session\"/>"), "live sessions are children of the manager")

        let session = try probe.introspect(BrokerNames.busName, path)
        XCTAssertEqual(try Self.interfaceElement(BrokerNames.sessionInterface, in: session), try Self.published(BrokerNames.sessionInterface))

        let provider = try probe.introspect(source.uniqueName, BrokerNames.providerPathPrefix + "p1")
        XCTAssertEqual(try Self.interfaceElement(BrokerNames.providerInterface, in: provider), try Self.published(BrokerNames.providerInterface))
    }

    func testErrorNamesMapOneToOne() {
        XCTAssertEqual(BrokerErrorCode.allCases.map(\.busName), [
            "org.dragbroker.Broker1.Error.AccessDenied", "org.dragbroker.Broker1.Error.NotFound",
            "org.dragbroker.Broker1.Error.InvalidArgument", "org.dragbroker.Broker1.Error.WrongState",
            "org.dragbroker.Broker1.Error.LimitExceeded", "org.dragbroker.Broker1.Error.Timeout",
            "org.dragbroker.Broker1.Error.Cancelled", "org.dragbroker.Broker1.Error.Disconnected",
            "org.dragbroker.Broker1.Error.ProviderFailed", "org.dragbroker.Broker1.Error.Failed",
        ])
        for code in BrokerErrorCode.allCases {
            XCTAssertEqual(BrokerErrorCode(busName: code.busName), code)
            XCTAssertEqual(BrokerError(BusError(name: code.busName, message: "m")), BrokerError(code, "m"))
        }
        XCTAssertNil(BrokerErrorCode(busName: "org.dragbroker.Broker1.Error.Bogus"))
    }

    /// Bad input over the raw wire: every refusal is a named error, and the daemon lives on.
    func testMalformedRequestsGetNamedErrors() throws {
        let world = try World()
        let probe = try BusProbe(address: world.bus.address)
        func begin(_ items: [(String, String)], options: [(String, Bool)] = [], name: String = "x") -> Result<Message, BusError> {
            probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "BeginSession") { m throws(BusError) in
                try m.openContainer("a", ItemDescriptor.signature)
                if !items.isEmpty {
                    try m.openContainer("r", "sdda(sss)")
                    try m.append(name)
                    try m.append(0.0)
                    try m.append(0.0)
                    try m.openContainer("a", "(sss)")
                    for (type, visibility) in items {
                        try m.openContainer("r", "sss")
                        try m.append(type)
                        try m.append(visibility)
                        try m.append("data")
                        try m.closeContainer()
                    }
                    try m.closeContainer()
                    try m.closeContainer()
                }
                try m.closeContainer()
                try m.openContainer("a", "{sv}")
                for (key, value) in options {
                    try m.openContainer("e", "sv")
                    try m.append(key)
                    try m.openContainer("v", "b")
                    try m.append(value)
                    try m.closeContainer()
                    try m.closeContainer()
                }
                try m.closeContainer()
                try m.append(objectPath: "/org/dragbroker/Provider1/p1")
            }
        }
        func failure(_ result: Result<Message, BusError>) -> BusError? {
            if case .failure(let error) = result { return error }
            return nil
        }
        XCTAssertEqual(failure(begin([("text/plain", "everyone")])),
                       BrokerError(.invalidArgument, "Unknown visibility 'everyone' for type 'text/plain': expected app, team or all").busError)
        XCTAssertEqual(failure(begin([])), BrokerError(.invalidArgument, "A drag needs at least one item").busError)
        XCTAssertEqual(failure(begin([("text/plain", "all"), ("text/plain", "app")])),
                       BrokerError(.invalidArgument, "Item 0 declares the type 'text/plain' twice").busError)
        XCTAssertEqual(failure(begin([("", "all")])),
                       BrokerError(.invalidArgument, "Item 0: '' is not a type identifier: it is empty; expected a MIME type such as image/png or a UTI such as public.png").busError)
        XCTAssertEqual(failure(begin([("text/" + String(repeating: "x", count: 300), "all")])),
                       BrokerError(.limitExceeded, "Item 0: a type identifier is longer than 255 bytes").busError)
        XCTAssertEqual(failure(begin([("text/plain", "all")], options: [("Restricted", true)])),
                       BrokerError(.invalidArgument, "Unknown session option 'Restricted': expected RestrictedToApp or AllowsMove").busError)
        let wrongSignature = probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "BeginSession") { m throws(BusError) in
            try m.append("not items")
        }
        XCTAssertEqual(wrongSignature.errorName, "org.freedesktop.DBus.Error.InvalidArgs")

        // A session's limits: 16 per connection.
        for _ in 0..<16 { XCTAssertEqual(begin([("text/plain", "all")]).errorName, "OK") }
        XCTAssertEqual(failure(begin([("text/plain", "all")])),
                       BrokerError(.limitExceeded, "This connection already has 16 live sessions (limit 16)").busError)

        // Not a party: no access to a session's items, even knowing its path.
        let bystander = try BusProbe(address: world.bus.address)
        let items = bystander.call(BrokerNames.busName, BrokerNames.sessionPath(id: "s1"), BrokerNames.sessionInterface, "GetItems")
        XCTAssertEqual(failure(items), BrokerError(.accessDenied, "Present the session token with PresentToken before using session s1").busError)

        // Still serving.
        let list = probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "ListSessions")
        XCTAssertEqual(list.errorName, "OK")
    }
}

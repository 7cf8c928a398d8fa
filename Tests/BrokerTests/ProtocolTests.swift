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

    /// The published interface as a running party introspects it. The files also carry
    /// annotations for binding generators (gdbus-codegen's `org.gtk.GDBus.C.*`, qdbusxml2cpp's
    /// `org.qtproject.QtDBus.*`) and the error list `org.dragbroker.Broker1.Errors`: they say how
    /// to bind the interface, not what it is, and sd-bus has no way to emit them, so exactly
    /// those are left out. Everything else must match character for character.
    static func published(_ name: String) throws -> String {
        try interfaceElement(name, in: String(contentsOf: interfacesDirectory.appendingPathComponent("\(name).xml"), encoding: .utf8))
            .replacingOccurrences(of: #"<annotation name="(org\.gtk\.GDBus\.C\.[^"]+|org\.qtproject\.QtDBus\.[^"]+|org\.dragbroker\.Broker1\.Errors)" value="[^"]*"/>"#,
                                  with: "", options: .regularExpression)
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
    /// must be what sd-bus's own walk gave, each session's entry what Properties.GetAll says to
    /// the same caller. busctl here is an administrator but no party: the open session exists
    /// for it, with no properties, and GetAll refuses it as the session's methods would.
    func testManagedObjectsListWhatPropertiesSayForTheSessionsTheCallerMaySee() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let (_, path) = try source.begin(EndToEndTests.helloDrag)
        _ = try source.begin(EndToEndTests.helloDrag.replacingOccurrences(of: "]}]}", with: "]}],\"restricted\":true}"))
        let managed = try Self.busctl(world.bus.address, [BrokerNames.managerPath, "org.freedesktop.DBus.ObjectManager", "GetManagedObjects"])
        let objects = try XCTUnwrap(((managed as? [String: Any])?["data"] as? [Any])?.first as? [String: Any])
        XCTAssertEqual(objects.keys.sorted(), [path], "a restricted session is no object for another app")
        let interfaces = try XCTUnwrap(objects[path] as? [String: Any])
        XCTAssertEqual(interfaces.keys.sorted(), ["org.dragbroker.Broker1.Session", "org.freedesktop.DBus.Introspectable",
                                                 "org.freedesktop.DBus.Peer", "org.freedesktop.DBus.Properties"])
        for interface in interfaces.keys {
            XCTAssertEqual((interfaces[interface] as? [String: Any])?.count, 0, interface)
        }
        let probe = try BusProbe(address: world.bus.address)
        let getAll = probe.call(BrokerNames.busName, path, "org.freedesktop.DBus.Properties", "GetAll") { m throws(BusError) in
            try m.append(BrokerNames.sessionInterface)
        }
        guard case .failure(let refusal) = getAll else { return XCTFail("a non-party read a session's properties") }
        XCTAssertEqual(refusal, BrokerError(.accessDenied, "Present the session token with PresentToken before using session s1").busError)

        // A party's view: the caller begins its own session, then both doors must agree.
        let begun = probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "BeginSession") { m throws(BusError) in
            try m.openContainer("a", ItemDescriptor.signature)
            try ItemDescriptor(suggestedName: "mine.txt", representations: [RepresentationDescriptor(typeIdentifier: "text/plain", visibility: .all)]).encode(to: m)
            try m.closeContainer()
            try m.openContainer("a", "{sv}")
            try m.closeContainer()
            try m.append(objectPath: "/org/dragbroker/Provider1/p1")
        }
        XCTAssertEqual(begun.errorName, "OK")
        let own = BrokerNames.sessionPath(id: "s3")
        func properties(_ reply: Message) throws -> [String: String] {
            var values: [String: String] = [:]
            _ = try reply.enterContainer("a", "{sv}")
            while try reply.enterContainer("e", "sv") {
                let name = try reply.readString()
                guard let (type, contents) = try reply.peekType(), type == "v" else { throw HarnessError("no variant for \(name)") }
                _ = try reply.enterContainer("v", contents ?? "")
                switch contents {
                case "s": values[name] = try reply.readString()
                case "u": values[name] = String(try reply.readUInt32())
                default:
                    values[name] = contents ?? ""
                    try reply.skip(contents ?? "")
                }
                try reply.exitContainer()
                try reply.exitContainer()
            }
            try reply.exitContainer()
            return values
        }
        let all = try properties(probe.call(BrokerNames.busName, own, "org.freedesktop.DBus.Properties", "GetAll") { m throws(BusError) in
            try m.append(BrokerNames.sessionInterface)
        }.get())
        let me = try probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "WhoAmI").get().readVariantDictionary()
        XCTAssertEqual(all, ["Id": "s3", "SourceApp": me["AppID"]?.string ?? "?", "State": "active", "ItemCount": "1",
                             "Operation": "cancel", "Progress": "(tt)"])
        let reply = try probe.call(BrokerNames.busName, BrokerNames.managerPath, "org.freedesktop.DBus.ObjectManager", "GetManagedObjects").get()
        var listed: [String: [String: String]] = [:]
        _ = try reply.enterContainer("a", "{oa{sa{sv}}}")
        while try reply.enterContainer("e", "oa{sa{sv}}") {
            let object = try reply.readObjectPath()
            _ = try reply.enterContainer("a", "{sa{sv}}")
            while try reply.enterContainer("e", "sa{sv}") {
                let interface = try reply.readString()
                if interface == BrokerNames.sessionInterface { listed[object] = try properties(reply) } else { try reply.skip("a{sv}") }
                try reply.exitContainer()
            }
            try reply.exitContainer()
            try reply.exitContainer()
        }
        XCTAssertEqual(listed, [path: [:], own: all])
    }

    /// The files are written from the interface tables (`make interfaces`): byte for byte,
    /// members, signatures, argument names, annotations, error names and documentation.
    func testPublishedXMLIsWhatTheInterfaceTablesSay() throws {
        XCTAssertEqual(BrokerInterfaces.publishedXML.map(\.name), [BrokerNames.managerInterface, BrokerNames.sessionInterface, BrokerNames.providerInterface])
        for (name, xml) in BrokerInterfaces.publishedXML {
            let shipped = try String(contentsOf: Self.interfacesDirectory.appendingPathComponent("\(name).xml"), encoding: .utf8)
            XCTAssertEqual(shipped, xml, "\(name).xml differs from its table: run `make interfaces` after changing the table")
        }
        let shippedFiles = try FileManager.default.contentsOfDirectory(atPath: Self.interfacesDirectory.path).sorted()
        XCTAssertEqual(shippedFiles, BrokerInterfaces.publishedXML.map { "\($0.name).xml" }.sorted(), "no file without a table")
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

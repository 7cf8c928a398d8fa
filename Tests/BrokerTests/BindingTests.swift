import BrokerProtocol
import Foundation
#if canImport(FoundationXML)
import FoundationXML
#endif
import TransferLog
import XCTest

/// Bindings come from the shipped XML as it is: gdbus-codegen's C code drives a complete drag
/// against the real daemon, qdbusxml2cpp accepts every file, and the annotations generators
/// need are there for every member that needs one.
final class BindingTests: XCTestCase {
    static let interfaceNames = [BrokerNames.managerInterface, BrokerNames.sessionInterface, BrokerNames.providerInterface]
    static let example = DocumentationTests.root.appendingPathComponent("examples/c-client")

    static func interfaceFile(_ name: String) -> URL {
        ProtocolTests.interfacesDirectory.appendingPathComponent("\(name).xml")
    }

    // MARK: Running tools

    struct Run: Sendable {
        let status: Int32
        let stdout: [String]
        let stderr: String
    }

    /// Runs a tool to its end, with both outputs read on threads of their own so neither can fill up.
    static func run(_ executable: String, _ arguments: [String], environment: [String: String] = ["PATH": "/usr/bin:/bin"]) throws -> Run {
        let child = try Child(executable: URL(fileURLWithPath: executable), arguments: arguments, environment: environment)
        child.process.waitUntilExit()
        return Run(status: child.process.terminationStatus, stdout: drained(child.stdout), stderr: drained(child.stderr).joined(separator: "\n"))
    }

    /// Every line, once the writer has closed its end (a line matching nothing waits for that).
    static func drained(_ reader: LineReader) -> [String] {
        _ = reader.take(timeout: 20) { _ in false }
        return reader.all { _ in true }
    }

    // MARK: The C example, built once

    struct Build: Sendable {
        let directory: URL
        let make: Run
    }

    /// Building is the slow part, so the suite builds the example once, the way its Makefile
    /// tells a new user to, into a directory of its own.
    static let build: Result<Build, HarnessError> = {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-c-client-\(UUID().uuidString)")
        do {
            let make = try run("/usr/bin/make", ["--no-print-directory", "-C", example.path, "BUILD=\(directory.path)", "CC=gcc"])
            return .success(Build(directory: directory, make: make))
        } catch {
            return .failure(HarnessError("make did not run: \(error)"))
        }
    }()

    override class func tearDown() {
        if case .success(let build) = build { try? FileManager.default.removeItem(at: build.directory) }
        super.tearDown()
    }

    /// The built programs, copied into the world as two apps at two executable paths.
    func programs(in world: World) throws -> (source: URL, destination: URL) {
        let build = try Self.build.get()
        guard build.make.status == 0 else { throw HarnessError("make failed: \(build.make.stderr)") }
        let apps = world.directory.appendingPathComponent("apps")
        try FileManager.default.createDirectory(at: apps, withIntermediateDirectories: true)
        let source = apps.appendingPathComponent("c-source"), destination = apps.appendingPathComponent("c-destination")
        try FileManager.default.copyItem(at: build.directory.appendingPathComponent("dragbroker-source"), to: source)
        try FileManager.default.copyItem(at: build.directory.appendingPathComponent("dragbroker-destination"), to: destination)
        return (source, destination)
    }

    func testTheCExampleBuildsFromTheShippedXMLUnmodifiedAndWithoutWarnings() throws {
        let build = try Self.build.get()
        XCTAssertEqual(build.make.status, 0, build.make.stderr)
        XCTAssertEqual(build.make.stderr, "", "gcc -Wall -Wextra -Werror and gdbus-codegen say nothing")
        let xml = ["org.dragbroker.Broker1.Manager", "org.dragbroker.Broker1.Session", "org.dragbroker.Provider1"]
            .map { "../../Sources/BrokerProtocol/Interfaces/\($0).xml" }.joined(separator: " ")
        // The shipped files themselves, and no option that would add or change annotations.
        XCTAssertEqual(Array(build.make.stdout.prefix(2)), [
            "gdbus-codegen --generate-c-code dragbroker-generated --output-directory \(build.directory.path) \\",
            "\t--c-namespace DragBroker --interface-prefix org.dragbroker. \(xml)",
        ])
        XCTAssertEqual(build.make.stdout.count, 6, build.make.stdout.joined(separator: "\n"))
        let header = try String(contentsOf: build.directory.appendingPathComponent("dragbroker-generated.h"), encoding: .utf8)
        // With the UnixFD annotation the generated calls carry descriptor lists; without it they drop them.
        XCTAssertTrue(header.contains("""
            gboolean drag_broker_broker1_session_call_load_sync (
                DragBrokerBroker1Session *proxy,
                guint arg_item,
                const gchar *arg_type,
                GUnixFDList  *fd_list,
                GVariant **out_data,
                guint *out_load,
                gchar **out_kind,
                GUnixFDList **out_fd_list,
                GCancellable *cancellable,
                GError **error);
            """), header)
        XCTAssertTrue(header.contains("""
            void drag_broker_provider1_complete_provide_file (
                DragBrokerProvider1 *object,
                GDBusMethodInvocation *invocation,
                GUnixFDList *fd_list,
                GVariant *file);
            """))
    }

    // MARK: A complete drag in C

    /// Bytes that fill the daemon's 1 MiB pipes more than once, so the source blocks until the
    /// destination reads; every byte value occurs.
    static func payload(count: Int, seed: UInt64) -> Data {
        var state = seed
        var bytes = [UInt8](repeating: 0, count: count)
        for i in bytes.indices {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            bytes[i] = UInt8(truncatingIfNeeded: state >> 33)
        }
        return Data(bytes)
    }

    struct Drag {
        let token: String
        let source: [String]
        let destination: [String]
        let received: Data
    }

    /// The C source offers `file` as one item of `type` and `kind`; the C destination, given the
    /// token on its command line, loads it into a file of its own.
    func drag(kind: String, type: String, file name: String, payload: Data, in world: World) throws -> Drag {
        let (sourceProgram, destinationProgram) = try programs(in: world)
        let offered = world.directory.appendingPathComponent(name), received = world.directory.appendingPathComponent("received")
        try payload.write(to: offered)
        let environment = ["DBUS_SESSION_BUS_ADDRESS": world.bus.address, "PATH": "/usr/bin:/bin"]
        let source = try Child(executable: sourceProgram, arguments: [kind, type, offered.path], environment: environment)
        guard let tokenLine = source.stdout.take(where: { $0.hasPrefix("source: token ") }) else {
            throw HarnessError("the source printed no token: \(source.stdout.text) \(source.stderr.text)")
        }
        let token = String(tokenLine.dropFirst("source: token ".count))
        // Any peer can call the exported provider: the source serves the broker alone.
        let probe = try BusProbe(address: world.bus.address)
        let (stranger, leaked) = try probe.provideAsStranger(try probe.uniqueName(ofProcess: source.process.processIdentifier),
                                                             path: "/org/dragbroker/Provider1/c", session: "/org/dragbroker/Broker1/session/s1",
                                                             item: 0, type: type)
        XCTAssertEqual(stranger.failure, BrokerError(.accessDenied, "Only dragbrokerd may request data from this provider").busError)
        XCTAssertEqual(leaked, Data(), "not one byte for a stranger")
        let destination = try Child(executable: destinationProgram, arguments: [token, type, received.path], environment: environment)
        destination.process.waitUntilExit()
        XCTAssertEqual(destination.process.terminationStatus, 0, destination.stderr.text)
        source.process.waitUntilExit()
        XCTAssertEqual(source.process.terminationStatus, 0, source.stderr.text)
        XCTAssertEqual(Self.drained(destination.stderr), [])
        XCTAssertEqual(Self.drained(source.stderr), [])
        return Drag(token: token, source: Self.drained(source.stdout), destination: Self.drained(destination.stdout),
                    received: (try? Data(contentsOf: received)) ?? Data())
    }

    /// What the destination prints up to its load. The refusal is GLib's error domain at work:
    /// the name came back as DRAGBROKER_ERROR_WRONG_STATE through g_error_matches.
    static func destinationLines(item: String, type: String) -> [String] {
        [
            "destination: joined /org/dragbroker/Broker1/session/s1",
            "destination: item \(item) 0x0 types \(type)",
            "destination: load before the drop: DRAGBROKER_ERROR_WRONG_STATE (org.dragbroker.Broker1.Error.WrongState): Loads are allowed only after PerformDrop",
            "destination: enter copy -> copy",
            "destination: drop -> copy",
        ]
    }

    func testACSourceAndDestinationMoveExactBytesThroughADataLoad() throws {
        let world = try World()
        let payload = Self.payload(count: 1_300_007, seed: 1)
        let drag = try drag(kind: "data", type: "application/octet-stream", file: "payload.bin", payload: payload, in: world)
        XCTAssertTrue(drag.token.range(of: "^[0-9a-f]{64}$", options: .regularExpression) != nil, drag.token)
        XCTAssertEqual(drag.source, [
            "source: began /org/dragbroker/Broker1/session/s1",
            "source: WillEnd copy",
            "source: provide item 0 as application/octet-stream (load 1)",
            "source: LoadFinished 1 1300007",
            "source: Ended copy",
            "source: TransferFinished",
        ])
        XCTAssertEqual(drag.destination, Self.destinationLines(item: "payload.bin", type: "application/octet-stream") + [
            "destination: data load 1 read 1300007 bytes",
            "destination: LoadFinished 1 1300007",
            "destination: concluded",
        ])
        XCTAssertEqual(drag.received.count, payload.count)
        XCTAssertTrue(drag.received == payload, "the destination received other bytes than the source offered")
        let load = try world.daemon.waitForLog { try $0.loads().first }
        XCTAssertEqual(load.bytes, 1_300_007)
        XCTAssertEqual(load.outcome, "completed")
        XCTAssertEqual(load.sourceApp, world.paths.app("c-source"))
        XCTAssertEqual(load.destinationApp, world.paths.app("c-destination"))
    }

    func testACSourceAndDestinationMoveExactBytesThroughAFileLoad() throws {
        let world = try World()
        let payload = Self.payload(count: 300_007, seed: 2)
        let drag = try drag(kind: "file", type: "application/pdf", file: "report.pdf", payload: payload, in: world)
        XCTAssertEqual(drag.source, [
            "source: began /org/dragbroker/Broker1/session/s1",
            "source: WillEnd copy",
            "source: provide item 0 as a file of application/pdf (load 1)",
            "source: LoadFinished 1 300007",
            "source: Ended copy",
            "source: TransferFinished",
        ])
        XCTAssertEqual(drag.destination, Self.destinationLines(item: "report.pdf", type: "application/pdf") + [
            "destination: file load 1 read 300007 bytes",
            "destination: LoadFinished 1 300007",
            "destination: concluded",
        ])
        XCTAssertEqual(drag.received.count, payload.count)
        XCTAssertTrue(drag.received == payload, "the destination received other bytes than the source offered")
        let load = try world.daemon.waitForLog { try $0.loads().first }
        XCTAssertEqual(load.bytes, 300_007)
        XCTAssertEqual(load.outcome, "completed")
    }

    // MARK: The error domain

    /// The GLib table in the example numbers the errors as the XML lists them, and the XML
    /// lists exactly what the daemon answers with.
    func testTheErrorAnnotationAndTheGLibTableListEveryBrokerErrorInOrder() throws {
        let names = BrokerErrorCode.allCases.map(\.busName)
        for name in Self.interfaceNames {
            let document = try XMLDocument(contentsOf: Self.interfaceFile(name), options: [])
            let interface = try XCTUnwrap(try document.nodes(forXPath: "/node/interface").first as? XMLElement)
            let errors = interface.elements(forName: "annotation").filter { $0.attribute(forName: "name")?.stringValue == "org.dragbroker.Broker1.Errors" }
            XCTAssertEqual(errors.count, 1, name)
            XCTAssertEqual(errors.first?.attribute(forName: "value")?.stringValue, names.joined(separator: " "), name)
        }
        let table = try String(contentsOf: Self.example.appendingPathComponent("dragbroker-errors.c"), encoding: .utf8)
        let entries = try NSRegularExpression(pattern: #"\{ (DRAGBROKER_ERROR_\w+), "([^"]+)" \}"#)
            .matches(in: table, range: NSRange(table.startIndex..., in: table))
            .map { match in (1...2).map { String(table[Range(match.range(at: $0), in: table)!]) } }
        // AccessDenied → DRAGBROKER_ERROR_ACCESS_DENIED
        let constants = BrokerErrorCode.allCases.map { code in
            "DRAGBROKER_ERROR_" + code.rawValue.replacingOccurrences(of: "([a-z])([A-Z])", with: "$1_$2", options: .regularExpression).uppercased()
        }
        XCTAssertEqual(entries.map { $0[0] }, constants)
        XCTAssertEqual(entries.map { $0[1] }, names)
        let header = try String(contentsOf: Self.example.appendingPathComponent("dragbroker-errors.h"), encoding: .utf8)
        let enumerators = header.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { $0.hasPrefix("DRAGBROKER_ERROR_") && $0.hasSuffix(",") }.map { String($0.dropLast()) }
        XCTAssertEqual(enumerators, constants, "the enum's order is the table's")
    }

    // MARK: Generator annotations

    /// Signatures a generator cannot map to a type on its own: structs and dictionaries.
    static func needsTypeName(_ signature: String) -> Bool {
        signature.contains("(") || signature.contains("{")
    }

    func testEveryDescriptorMethodIsUnixFDAndEveryStructHasAQtTypeName() throws {
        var descriptorMethods: [String] = []
        var typeNames: [String] = []
        for name in Self.interfaceNames {
            let document = try XMLDocument(contentsOf: Self.interfaceFile(name), options: [])
            let interface = try XCTUnwrap(try document.nodes(forXPath: "/node/interface").first as? XMLElement)
            XCTAssertEqual(interface.attribute(forName: "name")?.stringValue, name)
            func annotations(_ element: XMLElement) -> [String: String] {
                Dictionary(element.elements(forName: "annotation").map {
                    ($0.attribute(forName: "name")?.stringValue ?? "", $0.attribute(forName: "value")?.stringValue ?? "")
                }) { first, _ in first }
            }
            for member in interface.elements(forName: "method") + interface.elements(forName: "signal") {
                let memberName = "\(name).\(member.attribute(forName: "name")?.stringValue ?? "?")"
                let given = annotations(member)
                let args = member.elements(forName: "arg").map {
                    (type: $0.attribute(forName: "type")?.stringValue ?? "", out: $0.attribute(forName: "direction")?.stringValue == "out")
                }
                if member.name == "method" {
                    let passesDescriptors = args.contains { $0.type.contains("h") }
                    if passesDescriptors { descriptorMethods.append(memberName) }
                    XCTAssertEqual(given["org.gtk.GDBus.C.UnixFD"], passesDescriptors ? "true" : nil, memberName)
                }
                // Qt 5 numbers in and out arguments apart, and names a signal's arguments Out.
                var wanted: Set<String> = []
                for (direction, list) in [("In", args.filter { !$0.out && member.name == "method" }), ("Out", args.filter { $0.out || member.name == "signal" })] {
                    for (index, arg) in list.enumerated() where Self.needsTypeName(arg.type) {
                        wanted.insert("org.qtproject.QtDBus.QtTypeName.\(direction)\(index)")
                    }
                }
                let qt = given.filter { $0.key.hasPrefix("org.qtproject.QtDBus.QtTypeName.") }
                XCTAssertTrue(wanted.isSubset(of: Set(qt.keys)), "\(memberName) lacks \(wanted.subtracting(qt.keys).sorted())")
                // No annotation for an argument that is not there.
                for key in qt.keys {
                    let position = key.dropFirst("org.qtproject.QtDBus.QtTypeName.".count)
                    let direction = position.hasPrefix("In") ? "In" : "Out"
                    let index = Int(position.dropFirst(direction.count)) ?? -1
                    let count = member.name == "signal" ? args.count : args.filter { $0.out == (direction == "Out") }.count
                    XCTAssertTrue((0..<count).contains(index) && (member.name == "method" || direction == "Out"), "\(memberName): \(key)")
                }
                typeNames += qt.sorted { $0.key < $1.key }.map { "\(memberName) \($0.key.split(separator: ".").last!) \($0.value)" }
            }
            for property in interface.elements(forName: "property") {
                let propertyName = "\(name).\(property.attribute(forName: "name")?.stringValue ?? "?")"
                let type = property.attribute(forName: "type")?.stringValue ?? ""
                let qt = annotations(property)["org.qtproject.QtDBus.QtTypeName"]
                if Self.needsTypeName(type) { XCTAssertNotNil(qt, propertyName) }
                if let qt { typeNames.append("\(propertyName) \(qt)") }
            }
        }
        XCTAssertEqual(descriptorMethods, [
            "org.dragbroker.Broker1.Session.Load", "org.dragbroker.Provider1.Provide", "org.dragbroker.Provider1.ProvideFile",
        ])
        XCTAssertEqual(typeNames, [
            "org.dragbroker.Broker1.Manager.BeginSession In0 DragItemList",
            "org.dragbroker.Broker1.Manager.BeginSession In1 QVariantMap",
            "org.dragbroker.Broker1.Manager.ListSessions Out0 SessionSummaryList",
            "org.dragbroker.Broker1.Manager.DescribeSession Out0 SessionDetails",
            "org.dragbroker.Broker1.Manager.WhoAmI Out0 QVariantMap",
            "org.dragbroker.Broker1.Manager.GetUsage Out0 UsageTotals",
            "org.dragbroker.Broker1.Manager.GetUsage Out1 UsageBucketList",
            "org.dragbroker.Broker1.Manager.Copy In0 DragItemList",
            "org.dragbroker.Broker1.Manager.Copy In1 QVariantMap",
            "org.dragbroker.Broker1.Session.GetItems Out0 VisibleItemList",
            "org.dragbroker.Broker1.Session.ConformingItems Out0 QList<uint>",
            "org.dragbroker.Broker1.Session.AddItems In0 DragItemList",
            "org.dragbroker.Broker1.Session.Progress SessionProgress",
        ])
    }

    func testQdbusxml2cppGeneratesProxiesAndAdaptorsFromEveryShippedFile() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-qt-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var declarations: [String] = []
        for name in Self.interfaceNames {
            for mode in ["-p", "-a"] {
                let output = directory.appendingPathComponent("\(name)\(mode)")
                let run = try Self.run("/usr/bin/qdbusxml2cpp", [mode, output.path, Self.interfaceFile(name).path])
                XCTAssertEqual(run.status, 0, "\(mode) \(name): \(run.stderr)")
                XCTAssertEqual(run.stderr, "", "\(mode) \(name)")
                XCTAssertEqual(run.stdout, [], "\(mode) \(name)")
                let header = try String(contentsOf: output.appendingPathExtension("h"), encoding: .utf8)
                declarations += header.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
                    .filter { line in ["BeginSession(", "Q_PROPERTY(SessionProgress", " Load(", "ProvideFile("].contains { line.contains($0) } }
                    .map { "\(mode) \($0)" }
            }
        }
        // The annotated types, and descriptors as QDBusUnixFileDescriptor.
        XCTAssertEqual(declarations, [
            "-p inline QDBusPendingReply<QDBusObjectPath, QString> BeginSession(DragItemList items, const QVariantMap &options, const QDBusObjectPath &provider)",
            "-p inline QDBusReply<QDBusObjectPath> BeginSession(DragItemList items, const QVariantMap &options, const QDBusObjectPath &provider, QString &token)",
            "-a QDBusObjectPath BeginSession(DragItemList items, const QVariantMap &options, const QDBusObjectPath &provider, QString &token);",
            "-p Q_PROPERTY(SessionProgress Progress READ progress)",
            "-p inline QDBusPendingReply<QDBusUnixFileDescriptor, uint, QString> Load(uint item, const QString &type)",
            "-p inline QDBusReply<QDBusUnixFileDescriptor> Load(uint item, const QString &type, uint &load, QString &kind)",
            "-a Q_PROPERTY(SessionProgress Progress READ progress)",
            "-a QDBusUnixFileDescriptor Load(uint item, const QString &type, uint &load, QString &kind);",
            "-p inline QDBusPendingReply<QDBusUnixFileDescriptor> ProvideFile(const QDBusObjectPath &session, uint item, const QString &type, uint load)",
            "-a QDBusUnixFileDescriptor ProvideFile(const QDBusObjectPath &session, uint item, const QString &type, uint load);",
        ])
    }
}

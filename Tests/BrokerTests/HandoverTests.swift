import BrokerProtocol
import BusKit
import Foundation
import XCTest

/// What a source hands over as a file grants the destination no more than the source had: a
/// descriptor the source opened for reading, or a sealed memfd, judged by the descriptor itself;
/// the destination gets that very inode, read-only, from its first byte.
final class HandoverTests: XCTestCase {
    private let oPath = "The source handed over an O_PATH descriptor, which grants no reading: open the file for reading (O_RDONLY), or pass a sealed memfd"

    /// A source's drop into a destination, ready to load, with the given representations.
    private func dropped(_ world: World, _ reps: String, source: Peer, destination: Peer) throws {
        let (token, path) = try source.begin(#"{"items":[{"name":"x","reps":[\#(reps)]}]}"#)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
    }

    /// One user: what the descriptor is decides, not where it came from.
    func testTheDescriptorItselfDecides() throws {
        let world = try World()
        let secret = world.directory.appendingPathComponent("secret")
        try Data("not for you".utf8).write(to: secret)
        let source = try world.peer("source-app"), destination = try world.peer("destination-app")
        try dropped(world, """
            {"type":"application/x-opath","kind":"file","file":"opath:\(secret.path)"},\
            {"type":"application/x-writeonly","kind":"file","file":"writeonly","text":"w"},\
            {"type":"text/plain","kind":"file","file":"shm","text":"a tmpfs file"},\
            {"type":"text/html","kind":"file","file":"advanced","text":"from the start"}
            """, source: source, destination: destination)
        XCTAssertEqual(destination.run("loadfile 0 application/x-opath"), err(.providerFailed, oPath))
        XCTAssertEqual(destination.run("loadfile 0 application/x-writeonly"),
                       err(.providerFailed, "The source handed over a descriptor open for writing only: open the file read-only, or pass a sealed memfd"))
        // tmpfs answers F_GET_SEALS as a memfd does; it is a file all the same.
        XCTAssertEqual(destination.run("loadfile 0 text/plain"), "OK 12 readonly \(base64("a tmpfs file"))")
        // The source read past the first byte; the destination's reading starts at 0.
        XCTAssertEqual(destination.run("loadfile 0 text/html"), "OK 14 readonly \(base64("from the start"))")
    }

    /// A file the source registered open, once, is judged at every load as a handler's file is,
    /// and each destination's reading of it starts at its first byte, whatever the source did
    /// with its own offset.
    func testAFileRegisteredOpenIsJudgedAndReadFromItsStartAtEveryLoad() throws {
        let world = try World()
        let source = try world.peer("source-app"), destination = try world.peer("destination-app")
        try dropped(world, """
            {"type":"text/html","kind":"file","file":"advanced","text":"from the start","ready":true},\
            {"type":"application/x-writable","kind":"file","file":"writable","text":"w","ready":true}
            """, source: source, destination: destination)
        for _ in 0..<2 {
            XCTAssertEqual(destination.run("loadfile 0 text/html"), "OK 14 readonly \(base64("from the start"))")
            XCTAssertEqual(destination.run("loadfile 0 application/x-writable"),
                           err(.providerFailed, "The source handed over a file open for writing: open it read-only, or pass a sealed memfd"))
        }
        XCTAssertEqual(source.handlerCalls, [])
    }

    /// A file load's end (its record, `LoadFinished`) waits while the reply travels, but never
    /// past the destination's next call: loads back to back, each asked for as soon as the last
    /// one's reply is in, under a limit of one load in flight, are all served. The destination
    /// hears each load's `LoadFinished` before the answer to its next call, and the log has every
    /// load delivered with its size.
    func testAFileLoadHasEndedByTheDestinationsNextCall() throws {
        let world = try World(policy: { _ in "[Limits]\nConcurrentLoadsPerSession=1\n" })
        let source = try world.peer("source-app")
        let (token, path) = try source.begin(
            #"{"items":[{"name":"x","reps":[{"type":"text/plain","kind":"file","file":"shm","text":"twelve bytes","ready":true}]}]}"#)
        let probe = try BusProbe(address: world.bus.address)
        var heard: [String] = []
        let match = try probe.bus.matchSignal(sender: nil, path: path, interface: BrokerNames.sessionInterface, member: "LoadFinished") { m in
            let load = (try? m.readUInt32()).map(String.init) ?? "?"
            let bytes = (try? m.readUInt64()).map(String.init) ?? "?"
            let error = (try? m.readString()) ?? "?"
            heard.append("LoadFinished \(load) \(bytes) \(error)")
        }
        defer { withExtendedLifetime(match) {} }
        func call(_ member: String, _ build: @escaping @Sendable (Message) throws(BusError) -> Void = { _ in }) -> Result<Message, BusError> {
            probe.call(BrokerNames.busName, path, BrokerNames.sessionInterface, member, build)
        }
        XCTAssertEqual(probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "PresentToken") { m throws(BusError) in
            try m.append(token)
        }.errorName, "OK")
        XCTAssertEqual(call("Enter") { m throws(BusError) in try m.append("copy") }.errorName, "OK")
        XCTAssertEqual(call("PerformDrop").errorName, "OK")
        let loads = 20
        for load in 1...loads {
            let reply = call("Load") { m throws(BusError) in
                try m.append(UInt32(0))
                try m.append("text/plain")
            }
            guard case .success(let message) = reply else { return XCTFail("load \(load): \(reply.errorName)") }
            close(try message.readFileDescriptor())
            heard.append("Load reply \(try message.readUInt32())")
        }
        XCTAssertEqual(call("Conclude").errorName, "OK")
        let expected = (1...loads).flatMap { load in
            ["Load reply \(load)", "LoadFinished \(load) 12 "]
        }
        XCTAssertEqual(heard, expected)
        let records = try world.daemon.waitForLog { log in
            let records = try log.loads().filter { $0.sessionID == "s1" }
            return records.count == loads && records.allSatisfy({ $0.outcome != "open" }) ? records : nil
        }
        XCTAssertEqual(records.map { "\($0.loadID ?? 0) \($0.outcome) \($0.bytes)" }.sorted(),
                       (1...loads).map { "\($0) completed 12" }.sorted())
    }

    /// The daemon as root, on a bus two other users share: an unprivileged source cannot make
    /// it read what the source could not (`/etc/shadow` through O_PATH), and what the source
    /// may read reaches the other user exactly.
    func testARootDaemonReadsNothingForAnUnprivilegedSource() throws {
        let a = try TestUser.require("dragbroker-a"), b = try TestUser.require("dragbroker-b")
        try assertCrossUserHandover(in: try World(everyUser: true), from: b, to: a, refusedPath: { _ in "/etc/shadow" })
    }

    /// The daemon as user A, on a bus user B may join: B cannot read A's private file through
    /// the daemon, and B's own file reaches A exactly.
    func testADaemonReadsNothingOfItsUserForAnother() throws {
        let a = try TestUser.require("dragbroker-a"), b = try TestUser.require("dragbroker-b")
        try assertCrossUserHandover(in: try World(daemonUser: a), from: b, to: a) { world in
            try self.ownFile(of: a, in: world, "a's private bytes")
        }
    }

    /// `source`'s app hands over `refusedPath` through O_PATH (refused), then its own file
    /// (served, exactly, read-only) to `destination`'s app.
    private func assertCrossUserHandover(in world: World, from source: TestUser, to destination: TestUser,
                                         refusedPath: (World) throws -> String) throws {
        let refused = try refusedPath(world)
        let sourceApp = try world.peer("source-app", user: source), destinationApp = try world.peer("destination-app", user: destination)
        let own = try ownFile(of: source, in: world, "\(source.name)'s bytes")
        try dropped(world, """
            {"type":"application/x-refused","kind":"file","file":"opath:\(refused)"},\
            {"type":"text/plain","kind":"file","file":"path:\(own)"}
            """, source: sourceApp, destination: destinationApp)
        XCTAssertEqual(destinationApp.run("loadfile 0 application/x-refused"), err(.providerFailed, oPath))
        let bytes = "\(source.name)'s bytes"
        XCTAssertEqual(destinationApp.run("loadfile 0 text/plain"), "OK \(bytes.utf8.count) readonly \(base64(bytes))")
    }

    /// A 0600 file of `user`'s holding `text`, in a directory only that user may enter.
    private func ownFile(of user: TestUser, in world: World, _ text: String) throws -> String {
        let directory = world.directory.appendingPathComponent("home-\(user.name)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent("file")
        try Data(text.utf8).write(to: file)
        try user.own(directory)
        try user.own(file)
        chmod(directory.path, 0o755)
        chmod(file.path, 0o600)
        return file.path
    }
}

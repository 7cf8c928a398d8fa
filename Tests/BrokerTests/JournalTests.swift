import BrokerProtocol
import BusKit
import Foundation
import TransferLog
import XCTest

/// dragbrokerd under journald: the test gives the daemon a journal of its own. In a private
/// mount namespace, a tmpfs on /run holds a receiver bound at /run/systemd/journal/socket, the
/// path sd_journal_sendv writes to, which appends every entry it receives to a file.
final class JournaledDaemon {
    static let receiver = """
        import os, socket, sys
        parent = os.getppid()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(sys.argv[1])
        s.settimeout(0.2)
        out = open(sys.argv[2], "ab", buffering=0)
        while os.getppid() == parent:  # the daemon exec'd in its parent's place; leave with it
            try:
                out.write(s.recv(1 << 20) + b"\\x1e")
            except socket.timeout:
                pass
        """

    let child: Child
    private let entriesFile: URL

    /// `scratch`: a directory of the test's, for the file of entries.
    init(bus: PrivateBus, stateDirectory: URL, policyDirectory: URL, scratch: URL) throws {
        entriesFile = scratch.appendingPathComponent("entries")
        let script = """
            set -e
            mount -t tmpfs tmpfs /run
            mkdir -p /run/systemd/journal
            /usr/bin/python3 -c "$RECEIVER" /run/systemd/journal/socket "$ENTRIES" </dev/null >/dev/null 2>&1 &
            while [ ! -S /run/systemd/journal/socket ]; do sleep 0.05; done
            export JOURNAL_STREAM=$(stat -L -c '%d:%i' /proc/$$/fd/2)
            exec "$@"
            """
        child = try Child(
            executable: URL(fileURLWithPath: "/usr/bin/unshare"),
            arguments: ["--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh",
                        productsDirectory.appendingPathComponent("dragbrokerd").path, "--address", bus.address,
                        "--state-directory", stateDirectory.path, "--policy-directory", policyDirectory.path],
            environment: ["PATH": "/usr/bin:/bin", "RECEIVER": Self.receiver, "ENTRIES": entriesFile.path])
    }

    deinit { child.terminate() }

    func entries() -> [[String: String]] {
        let data = (try? Data(contentsOf: entriesFile)) ?? Data()
        return data.split(separator: 0x1e).map { entry in
            var fields: [String: String] = [:]
            for line in entry.split(separator: UInt8(ascii: "\n")) {
                let text = String(decoding: line, as: UTF8.self)
                if let equals = text.firstIndex(of: "=") { fields[String(text[..<equals])] = String(text[text.index(after: equals)...]) }
            }
            return fields
        }
    }

    func waitFor(_ match: ([String: String]) -> Bool) -> [String: String]? {
        for _ in 0..<200 {
            if let entry = entries().first(where: match) { return entry }
            usleep(50_000)
        }
        return nil
    }
}

/// Under journald, the daemon logs structured entries and writes its audit trail to the
/// journal.
final class JournalTests: XCTestCase {
    func testTransfersAndRefusalsReachTheJournalWithTheirFields() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-journal-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let bus = try PrivateBus()
        let journaled = try JournaledDaemon(bus: bus, stateDirectory: directory.appendingPathComponent("state"),
                                            policyDirectory: directory.appendingPathComponent("policy"), scratch: directory)
        defer { journaled.child.terminate() }
        let daemon = journaled.child
        let waitFor = journaled.waitFor

        let serving = waitFor { $0["MESSAGE"]?.hasPrefix("Serving org.dragbroker.Broker1") == true }
        XCTAssertEqual(serving?["PRIORITY"], "6")
        XCTAssertEqual(serving?["SYSLOG_IDENTIFIER"], "dragbrokerd")
        XCTAssertEqual(daemon.stderr.text, "", "under journald nothing goes to stderr")

        let source = try Peer(app: "source-app", in: directory, bus: bus)
        let destination = try Peer(app: "destination-app", in: directory, bus: bus)
        let (token, _) = try source.begin(EndToEndTests.helloDrag)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("load 0 text/plain"), err(.wrongState, "Loads are allowed only after PerformDrop"))
        _ = destination.run("enter copy")
        _ = destination.run("drop")
        XCTAssertTrue(destination.run("load 0 text/plain").hasPrefix("OK 11 "))

        let transfer = waitFor { $0["MESSAGE_ID"] == "9c1a7e3b5f2d4e8a8b6c0d1e2f3a4b5c" }
        XCTAssertEqual(transfer?["DRAGBROKER_SESSION"], "s1")
        XCTAssertEqual(transfer?["DRAGBROKER_CHANNEL"], "drag")
        XCTAssertEqual(transfer?["DRAGBROKER_SOURCE_APP"], source.executable.path)
        XCTAssertEqual(transfer?["DRAGBROKER_DESTINATION_APP"], destination.executable.path)
        XCTAssertEqual(transfer?["DRAGBROKER_TYPE"], "text/plain")
        XCTAssertEqual(transfer?["DRAGBROKER_BYTES"], "11")
        XCTAssertEqual(transfer?["DRAGBROKER_OUTCOME"], "completed")
        let refusal = waitFor { $0["MESSAGE_ID"] == "4e2b9d7c1a3f4b6e9d8c7b6a5f4e3d2c" }
        XCTAssertEqual(refusal?["DRAGBROKER_ACTION"], "Load")
        XCTAssertEqual(refusal?["DRAGBROKER_TYPE"], "text/plain")
        XCTAssertEqual(refusal?["DRAGBROKER_ERROR"], BrokerErrorCode.wrongState.busName)
        XCTAssertEqual(refusal?["DRAGBROKER_APP"], destination.executable.path)
        XCTAssertEqual(refusal?["DRAGBROKER_CHANNEL"], "drag")

        XCTAssertEqual(destination.run("conclude"), "OK")
        let ended = waitFor { $0["MESSAGE_ID"] == "7d3f1b9e2c4a4d6f8e0a1b2c3d4e5f60" }
        XCTAssertEqual(ended?["MESSAGE"], "Session s1 from \(source.executable.path) ended: completed, operation copy")
        XCTAssertEqual(ended?["PRIORITY"], "6")
        XCTAssertEqual(ended?["DRAGBROKER_SESSION"], "s1")
        XCTAssertEqual(ended?["DRAGBROKER_SOURCE_APP"], source.executable.path)
        XCTAssertEqual(ended?["DRAGBROKER_DESTINATION_APP"], destination.executable.path)
        XCTAssertEqual(ended?["DRAGBROKER_ITEMS"], "1")
        XCTAssertEqual(ended?["DRAGBROKER_OPERATION"], "copy")
        XCTAssertEqual(ended?["DRAGBROKER_OUTCOME"], "completed")
        XCTAssertEqual(ended?["DRAGBROKER_ERROR"], "")
        XCTAssertEqual(ended?["DRAGBROKER_KIND"], "drag")
        XCTAssertEqual(ended?["DRAGBROKER_CHANNEL"], "drag")

        // A paste's entries carry the paste channel; the entry's own end says what it was.
        let copied = source.run("copy " + EndToEndTests.helloDrag).split(separator: " ")
        XCTAssertEqual(copied.first, "OK")
        XCTAssertEqual(destination.run("present \(copied[1])"), "OK \(copied[2])")
        XCTAssertEqual(destination.run("load 0 text/plain"),
                       err(.wrongState, "Session s2 is a pasteboard entry: call Paste, then Load from the session it returns"))
        XCTAssertEqual(destination.run("paste"), "OK \(copied[2])_1")
        XCTAssertTrue(destination.run("load 0 text/plain").hasPrefix("OK 11 "))
        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertEqual(source.run("withdraw"), "OK")
        let pasted = waitFor { $0["MESSAGE_ID"] == "9c1a7e3b5f2d4e8a8b6c0d1e2f3a4b5c" && $0["DRAGBROKER_SESSION"] == "s2_1" }
        XCTAssertEqual(pasted?["DRAGBROKER_CHANNEL"], "paste")
        XCTAssertEqual(pasted?["DRAGBROKER_DESTINATION_APP"], destination.executable.path)
        let refusedOnEntry = waitFor { $0["MESSAGE_ID"] == "4e2b9d7c1a3f4b6e9d8c7b6a5f4e3d2c" && $0["DRAGBROKER_SESSION"] == "s2" }
        XCTAssertEqual(refusedOnEntry?["DRAGBROKER_CHANNEL"], "paste")
        let pasteEnded = waitFor { $0["MESSAGE_ID"] == "7d3f1b9e2c4a4d6f8e0a1b2c3d4e5f60" && $0["DRAGBROKER_SESSION"] == "s2_1" }
        XCTAssertEqual(pasteEnded?["DRAGBROKER_KIND"], "paste")
        XCTAssertEqual(pasteEnded?["DRAGBROKER_CHANNEL"], "paste")
        XCTAssertEqual(pasteEnded?["DRAGBROKER_OUTCOME"], "completed")
        let entryEnded = waitFor { $0["MESSAGE_ID"] == "7d3f1b9e2c4a4d6f8e0a1b2c3d4e5f60" && $0["DRAGBROKER_SESSION"] == "s2" }
        XCTAssertEqual(entryEnded?["MESSAGE"], "Pasteboard entry s2 from \(source.executable.path) ended: cancelled, operation copy")
        XCTAssertEqual(entryEnded?["DRAGBROKER_KIND"], "copy")
        XCTAssertEqual(entryEnded?["DRAGBROKER_CHANNEL"], "paste")
    }

    /// A gap in the transfer log is a journal entry of its own, so a forwarded audit trail says
    /// where it is incomplete. Here the gap is the sessions the ledger says were handed out and
    /// the log never got, as after a crash that lost the log's last writes.
    func testAGapInTheTransferLogReachesTheJournalWithItsMessageID() throws {
        let world = try AuditWorld()
        world.stopDaemon()
        let ledger = try FileHandle(forWritingTo: world.stateDirectory.appendingPathComponent("transfers.inflight"))
        try ledger.seek(toOffset: 32)  // the header's last session number handed out: s3, in an empty log
        try ledger.write(contentsOf: withUnsafeBytes(of: UInt64(3).littleEndian) { Data($0) })
        try ledger.close()
        let journaled = try JournaledDaemon(bus: world.bus, stateDirectory: world.stateDirectory,
                                            policyDirectory: world.policyDirectory, scratch: world.directory)
        defer { withExtendedLifetime(world) { journaled.child.terminate() } }

        let reason = "the log lost 3 session(s), s1 to s3, which were handed out but not on disk when the previous daemon "
            + "stopped (a crash or power cut before they were synced, or a damaged write-ahead log)"
        let entry = journaled.waitFor { $0["MESSAGE_ID"] == "8593af0f7c664ce8ad07ab14ac085c52" }
        XCTAssertEqual(entry?["MESSAGE"], "Recorded a gap in the transfer log: 3 record(s) lost: \(reason)")
        XCTAssertEqual(entry?["PRIORITY"], "3")
        XCTAssertEqual(entry?["SYSLOG_IDENTIFIER"], "dragbrokerd")
        XCTAssertEqual(entry?["DRAGBROKER_LOST"], "3")
        XCTAssertEqual(entry?["DRAGBROKER_REASON"], reason)
        let gap = try XCTUnwrap(try TransferLog.openReadOnly(path: TransferLog.path(inStateDirectory: world.stateDirectory.path)).gaps().first)
        XCTAssertEqual(entry?["DRAGBROKER_FIRST_LOST_USEC"], "\(MicrosecondTimestamp.microseconds(gap.firstLostAt))")
        XCTAssertEqual(entry?["DRAGBROKER_LAST_LOST_USEC"], "\(MicrosecondTimestamp.microseconds(gap.lastLostAt))")
        XCTAssertEqual(journaled.entries().filter { $0["MESSAGE"]?.hasPrefix("Recorded a gap") == true }.count, 1,
                       "the gap's entry is the one line that tells it")
    }
}

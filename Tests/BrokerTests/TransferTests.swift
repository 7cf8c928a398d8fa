import BrokerProtocol
import BusKit
import Foundation
import TransferLog
import XCTest

/// The transfer engine: exact bytes at every size, files without copies, progress,
/// cancellation from every side, deadlines, disconnects, size limits, and no leaked fds.
final class TransferTests: XCTestCase {
    /// A drop of one item with the given representation JSON, ready to load; with `unread`,
    /// nobody reads the source's events until `readsourceevents`.
    func dropped(_ world: World, _ reps: String, source: Peer? = nil, destination: Peer? = nil, unread: Bool = false) throws -> (Peer, Peer) {
        let source = try source ?? world.peer("source-app")
        let destination = try destination ?? world.peer("destination-app")
        let (token, path) = try source.begin(#"{"unread":\#(unread),"items":[{"name":"x","reps":[\#(reps)]}]}"#)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        return (source, destination)
    }

    func testExactBytesAtEverySize() throws {
        let world = try World()
        var generator = SystemRandomNumberGenerator()
        let random = (0..<3).map { _ in Int.random(in: 1...3_000_000, using: &generator) }
        let sizes = [0, 1, 65_535, 65_536, 65_537, 10 << 20] + random
        let reps = sizes.enumerated().map { #"{"type":"application/x-size\#($0.offset)","size":\#($0.element)}"# }.joined(separator: ",")
        let (source, destination) = try dropped(world, reps)
        for (index, size) in sizes.enumerated() {
            XCTAssertEqual(destination.run("loadcheck 0 application/x-size\(index)"), "OK \(size) \(size == 0 ? "pattern" : "pattern")", "size \(size)")
        }
        XCTAssertEqual(destination.run("load 0 application/x-size1"), "OK 1 \(Data([7]).base64EncodedString())")
        XCTAssertEqual(source.handlerCalls.count, sizes.count + 1, "one handler call per load, loads may repeat")
        let loads = try world.daemon.waitForLog { log -> [LoadRecord]? in
            let loads = try log.loads(limit: 100)
            return loads.count == sizes.count + 1 ? loads : nil
        }
        XCTAssertEqual(Set(loads.map(\.bytes)), Set((sizes + [1]).map(Int64.init)))
        XCTAssertEqual(Set(loads.map(\.outcome)), ["completed"])
    }

    func testStreamsReportProgressAndArriveAsChunks() throws {
        let world = try World()
        let size = 4 << 20
        let (source, destination) = try dropped(world, #"{"type":"application/x-big","size":\#(size),"chunk":262144,"pauseMs":5,"announce":true}"#)
        XCTAssertEqual(destination.run("loadprogress 0 application/x-big"), "OK \(size) pattern")
        let reports = destination.stdout.all { $0.hasPrefix("PROGRESS ") }
        XCTAssertFalse(reports.isEmpty, "progress was reported while the stream ran")
        XCTAssertTrue(reports.allSatisfy { $0.hasSuffix(" \(size)") || $0.hasSuffix(" -") }, "\(reports)")
        XCTAssertTrue(reports.contains { $0.hasSuffix(" \(size)") }, "the announced size reached the destination: \(reports)")
        let counts = reports.compactMap { UInt64($0.split(separator: " ")[1]) }
        XCTAssertEqual(counts, counts.sorted(), "progress only grows")
        XCTAssertEqual(destination.run("stream 0 application/x-big"), "OK \(size) pattern")
        XCTAssertEqual(source.handlerCalls.count, 2)
    }

    /// A stream reads only as fast as it is read: while its reader pauses after the first
    /// chunk, the broker moves no more than the pipes and that chunk hold (the source's
    /// writer waits), rather than the whole load piling up in the reader's memory.
    func testAStreamReadsOnlyAsFastAsItIsRead() throws {
        let world = try World()
        let size = 32 << 20
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, path) = try source.begin(#"{"items":[{"name":"x","reps":[{"type":"application/x-big","size":\#(size),"chunk":262144}]}]}"#)
        // Its events unread but by `streamslow`, which reads the progress among them.
        XCTAssertEqual(destination.run("presentunread \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        destination.send("streamslow 0 application/x-big 1500")
        let moved = try XCTUnwrap(destination.stdout.take(timeout: 20) { $0.hasPrefix("MOVED ") }.flatMap { UInt64($0.dropFirst(6)) },
                                  destination.stdout.text)
        XCTAssertGreaterThan(moved, 0, "the first chunk's bytes were reported")
        XCTAssertLessThanOrEqual(moved, 4 << 20, "the broker moved \(moved) of \(size) bytes while the reader paused")
        XCTAssertEqual(destination.stdout.take(timeout: 30) { $0.hasPrefix("OK") || $0.hasPrefix("ERR") }, "OK \(size) pattern")
        let load = try world.daemon.waitForLog { try $0.loads().first }
        XCTAssertEqual(load.bytes, Int64(size))
        XCTAssertEqual(load.outcome, "completed")
    }

    /// Leaving a stream's loop early cancels its load: the broker records it cancelled, and
    /// the destination may load again.
    func testLeavingAStreamEarlyCancelsItsLoad() throws {
        let world = try World()
        let (source, destination) = try dropped(world, #"{"type":"application/x-slow","size":8388608,"chunk":65536,"pauseMs":20}"#)
        let first = destination.run("streambreak 0 application/x-slow")
        XCTAssertTrue(first.hasPrefix("OK "), first)
        XCTAssertGreaterThan(Int(first.dropFirst(3)) ?? 0, 0, first)
        let record = try world.daemon.waitForLog { try $0.loads().first }
        XCTAssertEqual(record.outcome, "cancelled")
        XCTAssertEqual(record.errorName, BrokerErrorCode.cancelled.busName)
        XCTAssertLessThan(record.bytes, 8_388_608)
        let again = destination.run("streambreak 0 application/x-slow")
        XCTAssertTrue(again.hasPrefix("OK ") && (Int(again.dropFirst(3)) ?? 0) > 0, "a second load of the same item: \(again)")
        let records = try world.daemon.waitForLog { log -> [LoadRecord]? in
            let loads = try log.loads()
            return loads.count == 2 ? loads : nil
        }
        XCTAssertEqual(records.map(\.outcome), ["cancelled", "cancelled"])
        XCTAssertEqual(source.handlerCalls.count, 2, "the source's handler ran for each load")
    }

    /// Cancelling a stream's task while it waits for its first byte (the source's handler still
    /// running, nothing written) cancels the load: the stream throws the load's verdict, and the
    /// broker, the source and the log all have it as cancelled.
    func testCancellingAStreamBeforeItsFirstByteCancelsItsLoad() throws {
        let world = try World()
        let (source, destination) = try dropped(world, #"{"type":"application/x-stall","size":4096,"stall":true},{"type":"application/x-small","size":4096}"#)
        destination.send("streamcancel 0 application/x-stall 300")
        XCTAssertNotNil(source.stdout.take { $0 == "HANDLER 0 application/x-stall" })
        XCTAssertEqual(destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") }, err(.cancelled, "The destination cancelled load 1"))
        XCTAssertNotNil(source.stdout.take { $0.hasPrefix("EVENT loadFinished 1 ") && $0.hasSuffix(BrokerErrorCode.cancelled.busName) })
        let record = try world.daemon.waitForLog { try $0.loads().first }
        XCTAssertEqual(record.outcome, "cancelled")
        XCTAssertEqual(record.bytes, 0)
        // The drop is as good as before: its next load arrives whole.
        XCTAssertEqual(destination.run("stream 0 application/x-small"), "OK 4096 pattern")
    }

    /// The source's app hears of each load it is asked for (`loadRequested`) before it hears
    /// of its end, whichever way the representation is served: bytes held, written at once on
    /// the loop; a data handler's task; a file handler's task; a file held, answered at once.
    /// The library tells the app only once the bytes are on their way, so the order is the
    /// library's to keep.
    func testTheSourceHearsOfEachLoadBeforeItsEndHoweverItIsServed() throws {
        let world = try World()
        let source = try world.peer("source-app"), destination = try world.peer("destination-app")
        let (token, path) = try source.begin(#"""
            {"requests":true,"items":[{"reps":[{"type":"text/plain","text":"held","ready":true},\#
            {"type":"application/x-handler","size":4096},{"type":"application/x-file","kind":"file","text":"handed"},\#
            {"type":"application/x-held","kind":"file","text":"kept","ready":true}]}]}
            """#)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 4 \(base64("held"))")
        XCTAssertEqual(destination.run("stream 0 application/x-handler"), "OK 4096 pattern")
        XCTAssertEqual(destination.run("loadfile 0 application/x-file"), "OK 6 readonly \(base64("handed"))")
        XCTAssertEqual(destination.run("loadfile 0 application/x-held"), "OK 4 readonly \(base64("kept"))")
        XCTAssertEqual(source.lines(startingWith: "EVENT load", count: 8), [
            "EVENT loadRequested 1 0 text/plain", "EVENT loadFinished 1 4 -",
            "EVENT loadRequested 2 0 application/x-handler", "EVENT loadFinished 2 4096 -",
            "EVENT loadRequested 3 0 application/x-file", "EVENT loadFinished 3 6 -",
            "EVENT loadRequested 4 0 application/x-held", "EVENT loadFinished 4 4 -",
        ])
        XCTAssertEqual(source.handlerCalls, ["HANDLER 0 application/x-handler", "HANDLER 0 application/x-file"])
    }

    /// A stream read from a task off the connection's loop reads its first MiB on the loop,
    /// then hands the pipe's watch back to the loop's queue and reads the rest itself. Here the
    /// loop is kept busy meanwhile, so the stream reaches its end before the loop can let go of
    /// the watch: the pipe must not be closed first (the watch would sit on a closed
    /// descriptor, which BusKit stops the app for, or on the next pipe given its number).
    func testAStreamThatLeavesTheLoopClosesItsPipeOnlyAfterTheLoopLetGoOfItsWatch() throws {
        let world = try World()
        let (source, destination) = try dropped(world, #"{"type":"application/x-mib","size":1048576},{"type":"application/x-more","size":3145728}"#)
        XCTAssertEqual(destination.run("streamloopbusy 0 application/x-mib 300"), "OK 1048576 pattern")
        XCTAssertEqual(destination.run("streamloopbusy 0 application/x-more 300"), "OK 3145728 pattern")
        // The same connection goes on: its loop and its next pipes are as good as before.
        XCTAssertEqual(destination.run("stream 0 application/x-mib"), "OK 1048576 pattern")
        XCTAssertEqual(source.handlerCalls.count, 3)
    }

    /// The threads of process `pid` that the client library names for stream writers.
    private func writerThreads(of pid: pid_t) -> Int {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.filter { (try? String(contentsOfFile: "/proc/\(pid)/task/\($0)/comm", encoding: .utf8)) == "dragbroker-writ\n" }.count
    }

    /// A stream's writer runs on a thread of its own, where its writes may wait for the pipe,
    /// and the thread leaves with the writer: one while a load streams (here, stalled), none
    /// once it is cancelled or has finished.
    func testAStreamWriterHasAThreadOfItsOwnForAsLongAsItWrites() throws {
        let world = try World()
        let (source, destination) = try dropped(world, """
            {"type":"application/x-stalls","size":1048576,"chunk":65536,"stallAfter":131072},\
            {"type":"application/x-big","size":4194304,"chunk":262144}
            """)
        let pid = source.process.processIdentifier
        XCTAssertEqual(writerThreads(of: pid), 0, "no load yet")
        destination.send("loadprogress 0 application/x-stalls")
        XCTAssertNotNil(destination.stdout.take { $0.hasPrefix("PROGRESS ") }, destination.stdout.text)
        XCTAssertTrue(eventually { writerThreads(of: pid) == 1 }, "the stalled load's writer; threads: \(writerThreads(of: pid))")
        XCTAssertEqual(source.run("cancelload 1"), "OK")
        XCTAssertEqual(destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") }, err(.cancelled, "The source cancelled load 1"))
        XCTAssertTrue(eventually { writerThreads(of: pid) == 0 }, "gone with the cancelled writer; threads: \(writerThreads(of: pid))")
        XCTAssertEqual(destination.run("loadcheck 0 application/x-big"), "OK 4194304 pattern")
        XCTAssertTrue(eventually { writerThreads(of: pid) == 0 }, "gone with the finished writer; threads: \(writerThreads(of: pid))")
        XCTAssertEqual(source.handlerCalls.count, 2)
    }

    func testFileRepresentationsPassTheDescriptorItself() throws {
        let world = try World()
        let (source, destination) = try dropped(world, """
            {"type":"image/png","kind":"file","file":"memfd","text":"sealed bytes"},\
            {"type":"text/plain","kind":"file","file":"readonly","text":"read-only file"},\
            {"type":"application/x-big","kind":"file","file":"memfd","size":10485760}
            """)
        XCTAssertEqual(destination.run("loadfile 0 image/png"), "OK 12 readonly \(Data("sealed bytes".utf8).base64EncodedString())")
        XCTAssertEqual(destination.run("loadfile 0 text/plain"), "OK 14 readonly \(Data("read-only file".utf8).base64EncodedString())")
        XCTAssertEqual(destination.run("loadfile 0 application/x-big"), "OK 10485760 readonly pattern")
        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 14 \(Data("read-only file".utf8).base64EncodedString())", "loadData reads a file too")
        let load = try world.daemon.waitForLog { try $0.loads().first { $0.typeIdentifier == "application/x-big" } }
        XCTAssertEqual(load.bytes, 10_485_760)
        XCTAssertEqual(source.handlerCalls.count, 4)
    }

    /// Bytes and files the source registered as they are: no handler runs, and each load gets
    /// them exactly, as often as it asks. Small bytes are written at once on the source's
    /// connection thread; bytes whose size is announced, or that outgrow the pipe, and the
    /// empty ones take the handler's path, and arrive the same.
    func testRegisteredBytesAndFilesArriveExactlyWithNoHandlerRun() throws {
        let world = try World()
        let (source, destination) = try dropped(world, """
            {"type":"text/plain","text":"ready text","ready":true},\
            {"type":"application/x-announced","size":200000,"ready":true},\
            {"type":"application/x-past-the-pipe","size":3000000,"ready":true},\
            {"type":"application/x-empty","size":0,"ready":true},\
            {"type":"image/png","kind":"file","file":"memfd","text":"sealed bytes","ready":true}
            """)
        for _ in 0..<2 {
            XCTAssertEqual(destination.run("load 0 text/plain"), "OK 10 \(Data("ready text".utf8).base64EncodedString())")
            XCTAssertEqual(destination.run("loadcheck 0 application/x-announced"), "OK 200000 pattern")
            XCTAssertEqual(destination.run("loadcheck 0 application/x-past-the-pipe"), "OK 3000000 pattern")
            XCTAssertEqual(destination.run("loadcheck 0 application/x-empty"), "OK 0 pattern")
            XCTAssertEqual(destination.run("loadfile 0 image/png"), "OK 12 readonly \(Data("sealed bytes".utf8).base64EncodedString())")
        }
        XCTAssertEqual(source.handlerCalls, [])
        let loads = try world.daemon.waitForLog { log -> [LoadRecord]? in
            let loads = try log.loads(limit: 100)
            return loads.count == 10 ? loads : nil
        }
        XCTAssertEqual(loads.map(\.outcome), Array(repeating: "completed", count: 10))
        XCTAssertEqual(loads.map(\.bytes).sorted(), [0, 0, 10, 10, 12, 12, 200_000, 200_000, 3_000_000, 3_000_000])
    }

    /// A destination that never reads its session's events keeps only the newest of them,
    /// however many loads it makes: 300 loads, each reporting progress before it ends, leave
    /// 256 events for a reader who comes after the end, the last of them the end itself.
    func testEventsNobodyReadsAreBoundedAndKeepTheEnd() throws {
        let world = try World()
        let source = try world.peer("source-app"), destination = try world.peer("destination-app")
        // Each load reports its progress at once, when the source announces the size.
        let (token, path) = try source.begin(#"{"items":[{"name":"x","reps":[{"type":"application/x-two-chunks","size":8192,"chunk":4096,"pauseMs":5,"announce":true}]}]}"#)
        XCTAssertEqual(destination.run("presentunread \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("loadmany 300 0 application/x-two-chunks"), "OK \(300 * 8192)")
        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertEqual(destination.run("readevents"), "OK 256 255 ended copy -")
    }

    /// The source's side: a drag whose events nobody reads keeps the newest 256 of them however
    /// many loads it serves, its end among them.
    func testDragEventsNobodyReadsAreBoundedAndKeepTheEnd() throws {
        let world = try World()
        let (source, destination) = try dropped(world, #"{"type":"text/plain","text":"hello"}"#, unread: true)
        XCTAssertEqual(destination.run("loadmany 300 0 text/plain"), "OK 1500")
        XCTAssertEqual(destination.run("conclude"), "OK")
        // willEnd, 300 × (loadRequested, loadFinished), ended, transferFinished: the newest 256
        // are the last 127 loads' two events each, then the two ends.
        XCTAssertEqual(source.run("readsourceevents drag"), "OK 256 127 transferFinished")
    }

    /// Progress is told 50 ms into a load at the earliest, and bytes that moved since the last
    /// report are told when the 50 ms have passed: loads that end sooner send only their end,
    /// and a source that stalls leaves its last count told.
    func testShortLoadsReportOnlyTheirEndAndAStalledSourcesLastBytesAreTold() throws {
        let world = try World()
        let source = try world.peer("source-app"), destination = try world.peer("destination-app")
        let (token, path) = try source.begin(#"{"items":[{"name":"x","reps":[{"type":"application/x-small","size":4096}]}]}"#)
        XCTAssertEqual(destination.run("presentunread \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("loadmany 10 0 application/x-small"), "OK 40960")
        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertEqual(destination.run("readevents"), "OK 1 0 ended copy -", "ten loads, no progress report, then the end")

        // Two chunks 5 ms apart, then nothing: reporting the first chunk at once would leave
        // 4096 told for as long as the source stalls.
        let (stalling, stalled) = try dropped(world, #"{"type":"application/x-stalls","size":65536,"chunk":4096,"pauseMs":5,"stallAfter":8192}"#,
                                       source: try world.peer("stalling-app"), destination: try world.peer("waiting-app"))
        stalled.send("loadprogress 0 application/x-stalls")
        XCTAssertNotNil(stalled.stdout.take { $0 == "PROGRESS 8192 -" }, stalled.stdout.text)
        XCTAssertEqual(stalling.handlerCalls.count, 1)
    }

    /// `load(into:)` splices the broker's pipe into a file; a file opened O_APPEND takes no
    /// splice and gets the bytes through a buffer; a file representation is copied too.
    func testLoadIntoAFileWritesTheExactBytesWhetherOrNotItTakesASplice() throws {
        let world = try World()
        let size = 3 << 20 | 12_345
        let (source, destination) = try dropped(world, """
            {"type":"application/x-big","size":\(size),"chunk":65536},\
            {"type":"text/plain","kind":"file","file":"memfd","text":"sealed bytes"}
            """)
        let expected = Self.pattern(size)
        let spliced = world.directory.appendingPathComponent("spliced")
        XCTAssertEqual(destination.run("loadinto 0 application/x-big \(spliced.path) truncate"), "OK \(size)")
        XCTAssertEqual(try Data(contentsOf: spliced), expected)

        let appended = world.directory.appendingPathComponent("appended")
        try Data("head:".utf8).write(to: appended)
        XCTAssertEqual(destination.run("loadinto 0 application/x-big \(appended.path) append"), "OK \(size)")
        XCTAssertEqual(try Data(contentsOf: appended), Data("head:".utf8) + expected)

        let file = world.directory.appendingPathComponent("file")
        XCTAssertEqual(destination.run("loadinto 0 text/plain \(file.path) truncate"), "OK 12")
        XCTAssertEqual(try String(contentsOf: file, encoding: .utf8), "sealed bytes")
        XCTAssertEqual(source.handlerCalls.count, 3)
    }

    func testBadDescriptorsAreRefusedByName() throws {
        let world = try World()
        let (source, destination) = try dropped(world, """
            {"type":"application/x-writable","kind":"file","file":"writable","text":"w"},\
            {"type":"application/x-unsealed","kind":"file","file":"unsealed","text":"u"},\
            {"type":"application/x-directory","kind":"file","file":"directory"},\
            {"type":"application/x-socket","kind":"file","file":"socket"}
            """)
        XCTAssertEqual(destination.run("loadfile 0 application/x-writable"),
                       err(.providerFailed, "The source handed over a file open for writing: open it read-only, or pass a sealed memfd"))
        XCTAssertEqual(destination.run("loadfile 0 application/x-unsealed"),
                       err(.providerFailed, "The source handed over a memfd without write, grow and shrink seals"))
        XCTAssertEqual(destination.run("loadfile 0 application/x-directory"),
                       err(.providerFailed, "The source handed over a directory, not a file"))
        XCTAssertEqual(destination.run("loadfile 0 application/x-socket"),
                       err(.providerFailed, "The source handed over a socket, not a file"))
        XCTAssertTrue(source.waitFor("EVENT loadFinished 4 0 \(BrokerErrorCode.providerFailed.busName)"), "the source hears why too")
    }

    func testCancelFromTheDestinationTheSourceAndAnAdministrator() throws {
        let world = try World()
        let slow = #"{"type":"application/x-slow","size":8388608,"chunk":65536,"pauseMs":20}"#
        let (source, destination) = try dropped(world, slow)

        // The destination cancels its task once bytes flow.
        XCTAssertEqual(destination.run("loadcancel 0 application/x-slow 131072"), err(.cancelled, "The destination cancelled load 1"))
        XCTAssertNotNil(source.stdout.take { $0.hasPrefix("EVENT loadFinished 1 ") && $0.hasSuffix(BrokerErrorCode.cancelled.busName) })

        // The source cancels a load it is producing.
        destination.send("load 0 application/x-slow")
        XCTAssertNotNil(source.stdout.take { $0 == "HANDLER 0 application/x-slow" })
        XCTAssertNotNil(source.stdout.take { $0 == "HANDLER 0 application/x-slow" })
        XCTAssertEqual(source.run("cancelload 2"), "OK")
        XCTAssertEqual(destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") }, err(.cancelled, "The source cancelled load 2"))

        // An administrator cancels through the manager.
        destination.send("load 0 application/x-slow")
        XCTAssertNotNil(source.stdout.take { $0 == "HANDLER 0 application/x-slow" })
        let probe = try BusProbe(address: world.bus.address)
        let cancel = probe.call(BrokerNames.busName, BrokerNames.managerPath, BrokerNames.managerInterface, "CancelLoad") { m throws(BusError) in
            try m.append("s1")
            try m.append(UInt32(3))
        }
        XCTAssertEqual(cancel.errorName, "OK")
        XCTAssertEqual(destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") }, err(.cancelled, "An administrator cancelled load 3"))

        let outcomes = try world.daemon.waitForLog { log -> [String]? in
            let loads = try log.loads()
            return loads.count == 3 ? loads.map(\.outcome) : nil
        }
        XCTAssertEqual(outcomes, ["cancelled", "cancelled", "cancelled"])
    }

    func testDeadlinesForTheFirstByteAndForStalls() throws {
        let world = try World { _ in "[Limits]\nFirstByteTimeoutSec=1\nStallTimeoutSec=1\n" }
        let (source, destination) = try dropped(world, """
            {"type":"application/x-silent","stall":true},\
            {"type":"application/x-stalls","size":1048576,"chunk":65536,"stallAfter":131072}
            """)
        XCTAssertEqual(destination.run("load 0 application/x-silent"),
                       err(.timeout, "The source produced nothing within 1 s (first-byte deadline)"))
        XCTAssertNotNil(source.stdout.take { $0 == "EVENT loadFinished 1 0 \(BrokerErrorCode.timeout.busName)" })
        XCTAssertEqual(destination.run("load 0 application/x-stalls"),
                       err(.timeout, "The load made no progress for 1 s: the source stopped sending (stall deadline)"))
        XCTAssertNotNil(source.stdout.take { $0 == "EVENT loadFinished 2 131072 \(BrokerErrorCode.timeout.busName)" })
    }

    /// A destination that never reads stalls only its own load: another session's transfer
    /// runs to the end meanwhile, and the stuck one times out naming the destination.
    func testADestinationThatNeverReadsSlowsOnlyItself() throws {
        let world = try World { _ in "[Limits]\nFirstByteTimeoutSec=2\nStallTimeoutSec=2\n" }
        let source = try world.peer("source-app")
        let (probe, pipe) = try loadUnread(world, from: source)  // held, never read
        defer { withExtendedLifetime(probe) { _ = close(pipe) } }

        let (otherSource, reader) = try dropped(world, #"{"type":"application/x-other","size":5000000}"#, destination: try world.peer("reader-app"))
        defer { otherSource.terminate() }
        XCTAssertEqual(reader.run("loadcheck 0 application/x-other"), "OK 5000000 pattern")

        XCTAssertNotNil(source.stdout.take(timeout: 20) {
            $0.hasPrefix("EVENT loadFinished 1 ") && $0.hasSuffix(BrokerErrorCode.timeout.busName)
        })
        let stuck = try world.daemon.waitForLog { try $0.loads().first { $0.typeIdentifier == "application/x-big" } }
        XCTAssertEqual(stuck.outcome, "timed-out")
        XCTAssertEqual(stuck.errorName, BrokerErrorCode.timeout.busName)
        XCTAssertGreaterThan(stuck.bytes, 0)
        XCTAssertLessThan(stuck.bytes, Int64(Self.unreadSize))
    }

    /// A destination that stops reading until both pipes are full, then reads faster than its
    /// source writes, gets every byte: the daemon waits for the destination's pipe to drain,
    /// then for the source's bytes again.
    func testADestinationThatPausesGetsEveryByteOnceItReadsAgain() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let size = Self.unreadSize
        // 64 KiB a millisecond at most: slower than the reader below.
        let (probe, pipe) = try loadUnread(world, from: source, chunk: 65536, pauseMs: 1)
        defer { withExtendedLifetime(probe) { _ = close(pipe) } }
        // Nothing read until this pipe is full (1 MiB, as the daemon sizes it) and the daemon
        // has to wait for it to drain.
        var pending: Int32 = 0
        let deadline = Date().addingTimeInterval(20)
        while pending < 1 << 20 && Date() < deadline {
            usleep(10_000)
            XCTAssertEqual(ioctl(pipe, UInt(FIONREAD), &pending), 0)
        }
        XCTAssertEqual(pending, 1 << 20, "the destination's pipe filled while nobody read it")
        var received = Data()
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(pipe, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            XCTAssertGreaterThanOrEqual(n, 0, "read failed: errno \(errno)")
            if n <= 0 { break }
            received.append(contentsOf: buffer[0..<n])
        }
        XCTAssertEqual(received.count, size)
        XCTAssertEqual(received, Self.pattern(size))
        XCTAssertNotNil(source.stdout.take(timeout: 20) { $0 == "EVENT loadFinished 1 \(size) -" })
    }

    static let unreadSize = 16 << 20

    /// `unreadSize` bytes of `application/x-big` from a drag `source` begins, written `chunk`
    /// bytes at a time with `pauseMs` between, loaded by a bare bus connection (the probe,
    /// which must stay connected): the destination's pipe, which nobody reads until the caller does.
    func loadUnread(_ world: World, from source: Peer, chunk: Int = 1 << 20, pauseMs: Int = 0) throws -> (probe: BusProbe, pipe: Int32) {
        let spec = #"{"type":"application/x-big","size":\#(Self.unreadSize),"chunk":\#(chunk),"pauseMs":\#(pauseMs)}"#
        let (token, path) = try source.begin(#"{"items":[{"reps":[\#(spec)]}]}"#)
        let probe = try BusProbe(address: world.bus.address)
        func call(_ member: String, _ path: String, _ interface: String, _ build: @escaping @Sendable (Message) throws(BusError) -> Void) throws -> Message {
            try probe.call(BrokerNames.busName, path, interface, member, build).get()
        }
        _ = try call("PresentToken", BrokerNames.managerPath, BrokerNames.managerInterface) { m throws(BusError) in try m.append(token) }
        _ = try call("Enter", path, BrokerNames.sessionInterface) { m throws(BusError) in try m.append("copy") }
        _ = try call("PerformDrop", path, BrokerNames.sessionInterface) { _ throws(BusError) in }
        let reply = try call("Load", path, BrokerNames.sessionInterface) { m throws(BusError) in
            try m.append(UInt32(0))
            try m.append("application/x-big")
        }
        // The message owns its descriptor: the caller gets a copy of its own to close.
        return (probe, fcntl(try reply.readFileDescriptor(), F_DUPFD_CLOEXEC, 3))
    }

    /// Byte i is (i * 31 + 7) mod 256, as the test peer writes.
    static func pattern(_ size: Int) -> Data {
        Data((0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
    }

    func testDisconnectOfEitherPartyMidStream() throws {
        let world = try World()
        let slow = #"{"type":"application/x-slow","size":8388608,"chunk":65536,"pauseMs":20}"#
        do {
            let (source, destination) = try dropped(world, slow)
            destination.send("load 0 application/x-slow")
            XCTAssertNotNil(source.stdout.take { $0 == "HANDLER 0 application/x-slow" })
            usleep(100_000)
            source.kill()
            XCTAssertEqual(destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") },
                           err(.disconnected, "The source app \(source.executable.path) disconnected"))
        }
        do {
            let (source, destination) = try dropped(world, slow, source: try world.peer("second-source"), destination: try world.peer("second-destination"))
            destination.send("load 0 application/x-slow")
            XCTAssertNotNil(source.stdout.take { $0 == "HANDLER 0 application/x-slow" })
            usleep(100_000)
            destination.kill()
            // A dead destination's pipe may close before the bus reports its connection gone:
            // the load then ends as the destination closing its end, the session as a disconnect.
            let finished = source.stdout.take { $0.hasPrefix("EVENT loadFinished 1 ") }
            XCTAssertTrue(finished?.hasSuffix(BrokerErrorCode.disconnected.busName) == true
                          || finished?.hasSuffix(BrokerErrorCode.cancelled.busName) == true, finished ?? "no loadFinished")
            XCTAssertTrue(source.waitFor("EVENT ended copy \(BrokerErrorCode.disconnected.busName)"))
        }
        let outcomes = try world.daemon.waitForLog { log -> [String]? in
            let loads = try log.loads()
            return loads.count == 2 ? loads.map(\.outcome) : nil
        }
        XCTAssertEqual(outcomes.last, "disconnected", "the source's death")
        XCTAssertTrue(["disconnected", "cancelled"].contains(outcomes.first!), "\(outcomes)")
    }

    func testAPolicySizeLimitStopsTheStream() throws {
        let world = try World { _ in "[Flow]\nFrom=any\nTo=any\nLargerThan=1M\nAction=deny\n" }
        let (source, destination) = try dropped(world, #"{"type":"application/x-big","size":3145728,"chunk":262144}"#)
        XCTAssertEqual(destination.run("loadcheck 0 application/x-big"), err(.accessDenied,
            "The administrator's policy forbids more than 1048576 bytes of application/x-big from \(source.executable.path) to \(destination.executable.path) (rule at \(world.paths.policyFile.path):1)"))
        let load = try world.daemon.waitForLog { try $0.loads().first }
        XCTAssertEqual(load.bytes, 1_048_576, "exactly the limit went through, not a byte more")
        XCTAssertEqual(load.outcome, "denied")
    }

    /// A file's size is known when it is handed over: one larger than the rule reaches nobody,
    /// and one at the size goes through.
    func testAPolicySizeLimitRefusesALargerFile() throws {
        let world = try World { _ in "[Flow]\nFrom=any\nTo=any\nLargerThan=1M\nAction=deny\n" }
        let (source, destination) = try dropped(world, #"""
            {"type":"application/x-big","kind":"file","size":1048577},{"type":"application/x-fits","kind":"file","size":1048576}
            """#)
        XCTAssertEqual(destination.run("loadfile 0 application/x-big"), err(.accessDenied,
            "The administrator's policy forbids more than 1048576 bytes of application/x-big from \(source.executable.path) to \(destination.executable.path) (rule at \(world.paths.policyFile.path):1)"))
        XCTAssertEqual(destination.run("loadfile 0 application/x-fits").prefix(11), "OK 1048576 ")
        let loads = try world.daemon.waitForLog { log -> [LoadRecord]? in
            let loads = try log.loads()
            return loads.count == 2 ? loads.sorted { ($0.id ?? 0) < ($1.id ?? 0) } : nil
        }
        XCTAssertEqual(loads.map(\.typeIdentifier), ["application/x-big", "application/x-fits"])
        XCTAssertEqual(loads.map(\.outcome), ["denied", "completed"])
        XCTAssertEqual(loads.map(\.bytes), [0, 1_048_576], "nothing of the larger file was handed over")
    }

    func testManyConcurrentLoadsAllArriveExactly() throws {
        let world = try World()
        let source = try world.peer("source-app")
        var destinations: [Peer] = []
        for index in 0..<4 {
            let sizes = [1_000_003, 2_500_000]
            let reps = sizes.enumerated().map { #"{"type":"application/x-part\#($0.offset)","size":\#($0.element),"chunk":65536}"# }.joined(separator: ",")
            let (_, destination) = try dropped(world, reps, source: source, destination: try world.peer("destination-\(index)"))
            destinations.append(destination)
        }
        for destination in destinations {
            destination.send("loadcheck 0 application/x-part0")
            destination.send("loadcheck 0 application/x-part1")
        }
        for destination in destinations {
            XCTAssertEqual(destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") }, "OK 1000003 pattern")
            XCTAssertEqual(destination.stdout.take { $0.hasPrefix("OK") || $0.hasPrefix("ERR") }, "OK 2500000 pattern")
        }
    }

    func testNoDescriptorLeaks() throws {
        let world = try World { _ in "[Limits]\nFirstByteTimeoutSec=1\n" }
        let pid = world.daemon.process.processIdentifier
        func openDescriptors() throws -> [String] {
            try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").map { fd in
                (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(fd)")) ?? "?"
            }.sorted()
        }
        // One load first: sd-event creates its timer descriptor once, on first use.
        do {
            let (warmSource, warm) = try dropped(world, #"{"type":"text/plain","text":"warm"}"#)
            XCTAssertEqual(warm.run("load 0 text/plain"), "OK 4 \(Data("warm".utf8).base64EncodedString())")
            warmSource.kill()
            warm.kill()
        }
        _ = try world.daemon.waitForLog { log -> Bool? in try log.sessions().count == 1 ? true : nil }
        let before = try openDescriptors()
        do {
            let (source, destination) = try dropped(world, """
                {"type":"text/plain","text":"hello"},\
                {"type":"image/png","kind":"file","file":"memfd","text":"png"},\
                {"type":"application/x-writable","kind":"file","file":"writable","text":"w"},\
                {"type":"application/x-silent","stall":true},\
                {"type":"application/x-slow","size":8388608,"chunk":65536,"pauseMs":20}
                """)
            XCTAssertEqual(destination.run("load 0 text/plain"), "OK 5 \(Data("hello".utf8).base64EncodedString())")
            XCTAssertEqual(destination.run("loadfile 0 image/png"), "OK 3 readonly \(Data("png".utf8).base64EncodedString())")
            XCTAssertTrue(destination.run("loadfile 0 application/x-writable").hasPrefix(err(.providerFailed, "")))
            XCTAssertTrue(destination.run("load 0 application/x-silent").hasPrefix(err(.timeout, "")))
            XCTAssertTrue(destination.run("loadcancel 0 application/x-slow 65536").hasPrefix(err(.cancelled, "")))
            destination.send("load 0 application/x-slow")
            for _ in 0..<200 where source.handlerCalls.count < 6 { usleep(20_000) }
            XCTAssertEqual(source.handlerCalls.count, 6)
            source.kill()
            _ = destination.stdout.take { $0.hasPrefix("ERR") }
            destination.kill()
        }
        _ = try world.daemon.waitForLog { log -> Bool? in try log.loads().count == 7 ? true : nil }
        var after = try openDescriptors()
        for _ in 0..<50 where after != before {
            usleep(50_000)
            after = try openDescriptors()
        }
        XCTAssertEqual(after, before, "the daemon holds as many descriptors as before the loads")
    }

    /// Fail-closed auditing: while the log cannot take records (here another process holds
    /// the database's write lock), a load whose start record cannot commit is refused before
    /// the source is asked; once the log takes records again, the very next load works.
    func testFailClosedAuditingRefusesTransfersTheLogCannotRecord() throws {
        let world = try World { _ in "[Audit]\nFailClosed=yes\n" }
        let (source, destination) = try dropped(world, #"{"type":"text/plain","text":"audited"}"#)
        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 7 \(Data("audited".utf8).base64EncodedString())")
        _ = try world.daemon.waitForLog { try $0.loads().first }

        let locker = try Child(executable: URL(fileURLWithPath: "/usr/bin/sqlite3"), arguments: [world.daemon.transferLogPath],
                               environment: [:])
        locker.send("BEGIN EXCLUSIVE; SELECT 'locked';")
        XCTAssertNotNil(locker.stdout.take { $0 == "locked" })
        XCTAssertEqual(destination.run("load 0 text/plain"), err(.failed,
            "The transfer log cannot record transfers right now, and the policy refuses transfers it cannot audit (FailClosed=yes)"))
        XCTAssertNotNil(world.daemon.stderr.take { $0.contains("Failed to write the transfer log") })
        XCTAssertEqual(source.handlerCalls.count, 1, "the refused load never reached the source")

        locker.send("COMMIT;")
        locker.send(".quit")
        locker.process.waitUntilExit()
        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 7 \(Data("audited".utf8).base64EncodedString())")
        let refusal = try world.daemon.waitForLog { try $0.refusals().first }
        XCTAssertEqual(refusal.errorName, BrokerErrorCode.failed.busName)
        XCTAssertEqual(try world.daemon.waitForLog { log -> [String]? in
            let loads = try log.loads()
            return loads.count == 2 ? loads.map(\.outcome) : nil
        }, ["completed", "completed"], "the refused load is a refusal, not a load")
    }

    /// A daemon killed outright loses no record it had committed: SQLite in WAL mode.
    func testACrashLosesNoCommittedRecord() throws {
        let world = try World()
        let (source, destination) = try dropped(world, #"{"type":"text/plain","text":"kept"}"#)
        XCTAssertEqual(destination.run("load 0 text/plain"), "OK 4 \(Data("kept".utf8).base64EncodedString())")
        let before = try world.daemon.waitForLog { try $0.loads().first }
        world.daemon.kill(SIGKILL)
        let after = try TransferLog.openReadOnly(path: world.daemon.transferLogPath).loads()
        XCTAssertEqual(after, [before])
        _ = source
    }
}

// A scriptable dragbroker peer for the end-to-end tests: one process per app identity.
// It reads commands on stdin, one per line, and answers each with one line on stdout:
// `OK ...` or `ERR <D-Bus error name> <message>`. Session events arrive as `EVENT ...`
// lines, and a source prints `HANDLER <item> <type>` each time a load handler runs.
import BrokerClient
import BrokerProtocol
import Foundation
import Synchronization
import SystemCalls

let output = Mutex(FileHandle.standardOutput)

func emit(_ line: String) {
    output.withLock { $0.write(Data((line + "\n").utf8)) }
}

struct RepresentationSpec: Decodable {
    var type: String
    var visibility: Visibility?
    /// UTF-8 text, or `size` deterministic bytes (byte i = (i * 31 + 7) & 0xff).
    var text: String?
    var size: Int?
    /// Makes the load handler fail with this message.
    var fail: String?
    /// Makes the load handler give up as cancelled, with this message; a file's handler throws
    /// Swift's `CancellationError` instead, which carries none.
    var cancel: String?
    /// Makes the load handler never return.
    var stall: Bool?
    /// "file": hand over a file: `file` says which kind (memfd, readonly, writable, writeonly,
    /// unsealed, directory, socket, shm: a read-only file in /dev/shm, advanced: a read-only
    /// file whose offset is past its first byte, path:P: the existing file P opened read-only,
    /// opath:P: P opened O_PATH).
    var kind: String?
    var file: String?
    /// Stream the bytes in chunks of this size, pausing `pauseMs` between chunks, and
    /// announce the size first when `announce` is set; `stallAfter` stops sending (but keeps
    /// the pipe open) after that many bytes.
    var chunk: Int?
    var pauseMs: Int?
    var announce: Bool?
    var stallAfter: Int?
    /// Registers the bytes, or the file made once now, themselves (`registerDataRepresentation(data:)`,
    /// `registerFileRepresentation(file:)`): no handler runs, so no HANDLER line is printed.
    var ready: Bool?
}

struct ItemSpec: Decodable {
    var name: String?
    var width: Double?
    var height: Double?
    var reps: [RepresentationSpec]
}

struct BeginSpec: Decodable {
    var items: [ItemSpec]
    var restricted: Bool?
    var allowsMove: Bool?
    /// For `copy`: the entry's ExpirationSec.
    var expiration: UInt32?
    /// Nobody reads the drag's or the entry's events until `readsourceevents`.
    var unread: Bool?
    /// A drag's `loadRequested` events are printed too, as EVENT lines.
    var requests: Bool?
}

/// Byte i is (i * 31 + 7) mod 256: a 256-byte cycle, repeated.
func patternBytes(_ size: Int) -> Data {
    let cycle = Data((0..<256).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
    var data = Data(capacity: size)
    while data.count + 256 <= size { data.append(cycle) }
    data.append(cycle.prefix(size - data.count))
    return data
}

/// A load's answer line: its size, and whether every byte is the pattern's.
func patternReport(_ data: Data) -> String {
    "OK \(data.count) \(data == patternBytes(data.count) ? "pattern" : "mismatch")"
}

func describe(_ error: Error) -> String {
    if let error = error as? BrokerError { return "ERR \(error.code.busName) \(error.message)" }
    return "ERR unexpected \(error)"
}

final class Peer: Sendable {
    let connection: BrokerConnection
    let drags = Mutex<[DragSession]>([])
    let drops = Mutex<[DropSession]>([])
    let entries = Mutex<[PasteboardEntry]>([])
    let unreadMonitor = Mutex<AsyncStream<MonitorEvent>?>(nil)

    init(connection: BrokerConnection) { self.connection = connection }

    func run(_ line: String) async -> String {
        let words = line.split(separator: " ", maxSplits: 1).map(String.init)
        guard let command = words.first else { return "ERR usage empty command" }
        let rest = words.count > 1 ? words[1] : ""
        let args = rest.split(separator: " ").map(String.init)
        do {
            switch command {
            case "begin": return try await begin(rest)
            case "copy": return try await copy(rest)
            case "withdraw":
                guard let entry = entries.withLock({ $0.last }) else { throw BrokerError(.notFound, "no entry copied") }
                try await entry.withdraw()
                return "OK"
            case "clearoffers":
                guard let entry = entries.withLock({ $0.last }) else { throw BrokerError(.notFound, "no entry copied") }
                return "OK " + (try await entry.clearOffers()).joined(separator: " ")
            case "ownershiplost":
                guard let entry = entries.withLock({ $0.last }) else { throw BrokerError(.notFound, "no entry copied") }
                entry.ownershipLost()
                return "OK"
            case "paste":
                // The entry presented last stays where `paste` finds it: pasting again makes another paste.
                let entry = try lastDrop()
                let paste = try await entry.paste()
                drops.withLock { $0.append(paste) }
                Task {
                    for await event in paste.events {
                        if case .loadProgress = event { continue }
                        emit("EVENT paste \(describe(event))")
                        if case .ended(_, let error?) = event { emit("WHY \(error.message)") }
                    }
                }
                return "OK \(paste.path)"
            case "unpaste":
                drops.withLock { _ = $0.popLast() }
                return "OK"
            case "cancel":
                guard let drag = drags.withLock({ $0.last }) else { throw BrokerError(.notFound, "no presented drag") }
                try await drag.cancel()
                return "OK"
            case "dragended":
                guard let drag = drags.withLock({ $0.last }) else { throw BrokerError(.notFound, "no presented drag") }
                drag.dragEnded(dropped: args[0] == "drop")
                return "OK"
            case "present":
                let drop = try await connection.presentToken(rest)
                drops.withLock { $0.append(drop) }
                Task {
                    for await event in drop.events {
                        if case .loadProgress = event { continue }  // PROGRESS lines come from loadprogress
                        emit("EVENT \(describe(event))")
                        if case .ended(_, let error?) = event { emit("WHY \(error.message)") }
                    }
                }
                return "OK \(drop.path)"
            case "presentunread":
                // As `present`, with nobody reading the session's events until `readevents`.
                let drop = try await connection.presentToken(rest)
                drops.withLock { $0.append(drop) }
                return "OK \(drop.path)"
            case "loadmany":
                // loadmany <count> <item> <type>: that many loads, one after another.
                let drop = try lastDrop()
                var total = 0
                for _ in 0..<Int(args[0])! { total += try await drop.loadData(item: Int(args[1])!, typeIdentifier: args[2]).count }
                return "OK \(total)"
            case "readevents":
                // The events kept for a reader who comes only now, once the session ended:
                // their count, how many are progress, and the last.
                var count = 0, progress = 0, last = "none"
                for await event in try lastDrop().events {
                    count += 1
                    if case .loadProgress = event { progress += 1 }
                    last = describe(event)
                }
                return "OK \(count) \(progress) \(last)"
            case "readsourceevents":
                // readsourceevents <drag|entry>: as `readevents`, for the source's last drag or
                // entry begun `unread`: their count, how many are loads finished, and the last.
                func tally<Event>(_ events: AsyncStream<Event>, _ isLoadFinished: (Event) -> Bool,
                                  _ describe: (Event) -> String) async -> String {
                    var count = 0, finished = 0, last = "none"
                    for await event in events {
                        count += 1
                        if isLoadFinished(event) { finished += 1 }
                        last = describe(event)
                    }
                    return "OK \(count) \(finished) \(last)"
                }
                if args[0] == "drag" {
                    guard let drag = drags.withLock({ $0.last }) else { throw BrokerError(.notFound, "no drag begun") }
                    return await tally(drag.events, { if case .loadFinished = $0 { true } else { false } }, describe)
                }
                guard let entry = entries.withLock({ $0.last }) else { throw BrokerError(.notFound, "no entry copied") }
                return await tally(entry.events, { if case .loadFinished = $0 { true } else { false } }, describe)
            case "items":
                let items = try await lastDrop().items()
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                let encoded = try encoder.encode(items)
                return "OK " + String(decoding: encoded, as: UTF8.self)
            case "enter": return "OK " + (try await lastDrop().enter(proposing: operation(args[0]))).rawValue
            case "update": return "OK " + (try await lastDrop().update(proposing: operation(args[0]))).rawValue
            case "exit": try await lastDrop().exit(); return "OK"
            case "updatethreads":
                // updatethreads <op> <loop|task|immediate>: Update from a task that prefers the
                // connection's executor, from a plain task, or from a task started immediately on
                // the loop's thread that does not prefer it (the reply resumes it elsewhere);
                // answers the threads it ran on before and after.
                let drop = try lastDrop(), proposal = try operation(args[0])
                let answer: String
                switch args[1] {
                case "loop":
                    answer = try await withTaskExecutorPreference(connection.taskExecutor) { try await threadsAround(drop, proposal) }
                case "immediate":
                    let task = await withTaskExecutorPreference(connection.taskExecutor) {
                        Task.immediate { try await threadsAround(drop, proposal) }
                    }
                    answer = try await task.value
                default:
                    answer = try await Task.detached { try await threadsAround(drop, proposal) }.value
                }
                return "OK " + answer
            case "drop": return "OK " + (try await lastDrop().performDrop()).rawValue
            case "load":
                let data = try await lastDrop().loadData(item: Int(args[0])!, typeIdentifier: args[1])
                return "OK \(data.count) \(data.base64EncodedString())"
            case "usage":
                let usage = try await connection.usage()
                return "OK \(usage.sessions) \(usage.loads) \(usage.threadsBusy)"
            case "spawnloads":
                // Starts `count` data loads at once and answers at once; each prints
                // `LOADED <answer>` when it ends, so a test can hold many loads in flight.
                let drop = try lastDrop()
                let (count, item, type) = (Int(args[0])!, Int(args[1])!, args[2])
                for _ in 0..<count {
                    Task {
                        do {
                            let data = try await drop.loadData(item: item, typeIdentifier: type)
                            emit("LOADED OK \(data.count)")
                        } catch {
                            emit("LOADED \(describe(error))")
                        }
                    }
                }
                return "OK \(count)"
            case "loadinto":
                // loadinto <item> <type> <path> <truncate|append>: load(into:) a file opened so.
                let output = try FileDescriptor.open(args[2], .writeOnly, options: [.create, .closeOnExec, args[3] == "append" ? .append : .truncate],
                                                     permissions: [.ownerReadWrite])
                defer { try? output.close() }
                return "OK \(try await lastDrop().load(item: Int(args[0])!, typeIdentifier: args[1], into: output))"
            case "loadfile":
                // The descriptor itself: its size, contents, and whether it is writable.
                let fd = try await lastDrop().loadFile(item: Int(args[0])!, typeIdentifier: args[1])
                defer { fd.closeQuietly() }
                let size = try fd.status().size
                let data = try readAll(fd)
                let mode = try fd.isReadOnly() ? "readonly" : "writable"
                return "OK \(size) \(mode) \(data.count <= 64 ? data.base64EncodedString() : (data == patternBytes(data.count) ? "pattern" : "mismatch"))"
            case "loadprogress":
                // Loads with progress, printing each report, then the totals.
                let data = try await lastDrop().loadData(item: Int(args[0])!, typeIdentifier: args[1]) { bytes, expected in
                    emit("PROGRESS \(bytes) \(expected.map(String.init) ?? "-")")
                }
                return patternReport(data)
            case "loadcancel":
                // Cancels the loading task once `args[2]` bytes have arrived.
                let threshold = UInt64(args[2])!
                let drop = try lastDrop()
                let task = Task { () throws(BrokerError) -> Data in
                    try await drop.loadData(item: Int(args[0])!, typeIdentifier: args[1])
                }
                let canceller = Task {
                    for await event in drop.events {
                        if case .loadProgress(_, _, let bytes, _) = event, bytes >= threshold {
                            task.cancel()
                            return
                        }
                    }
                }
                defer { canceller.cancel() }
                let data = try await task.value
                return "OK \(data.count) not cancelled"
            case "cancelload":
                guard let drag = drags.withLock({ $0.last }) else { throw BrokerError(.notFound, "no drag begun") }
                try await drag.cancelLoad(UInt32(args[0])!)
                return "OK"
            case "stream":
                // Loads as a stream of chunks; counts them and checks the bytes.
                var data = Data()
                var chunks = 0
                for try await chunk in try lastDrop().loadStream(item: Int(args[0])!, typeIdentifier: args[1]) {
                    data += chunk
                    chunks += 1
                }
                return patternReport(data)
            case "streamslow":
                // Reads the first chunk, pauses `args[2]` ms, then the rest. MOVED: the most
                // bytes the broker had moved, by its progress reports, when the pause ended.
                let drop = try lastDrop()
                let moved = Mutex<UInt64>(0)
                let watcher = Task {
                    for await event in drop.events {
                        if case .loadProgress(_, _, let bytes, _) = event { moved.withLock { $0 = max($0, bytes) } }
                    }
                }
                defer { watcher.cancel() }
                var data = Data()
                var paused = false
                for try await chunk in drop.loadStream(item: Int(args[0])!, typeIdentifier: args[1]) {
                    data += chunk
                    if !paused {
                        paused = true
                        try? await Task.sleep(for: .milliseconds(Int(args[2])!))
                        emit("MOVED \(moved.withLock { $0 })")
                    }
                }
                return patternReport(data)
            case "streamloopbusy":
                // Loads as a stream from this task, off the connection's loop; once the first
                // MiB (the head, read on the loop) is in, keeps the loop busy for `args[2]` ms
                // while the rest, and the stream's end, are read here.
                var data = Data()
                var busied = false
                for try await chunk in try lastDrop().loadStream(item: Int(args[0])!, typeIdentifier: args[1]) {
                    data += chunk
                    guard !busied, data.count >= 1 << 20 else { continue }
                    busied = true
                    let milliseconds = UInt32(args[2])!
                    await withCheckedContinuation { (running: CheckedContinuation<Void, Never>) in
                        Task {
                            await withTaskExecutorPreference(connection.taskExecutor) {
                                running.resume()
                                usleep(milliseconds * 1000)
                            }
                        }
                    }
                }
                return patternReport(data)
            case "streambreak":
                // Reads the first chunk, then leaves the loop.
                var first = 0
                for try await chunk in try lastDrop().loadStream(item: Int(args[0])!, typeIdentifier: args[1]) {
                    first = chunk.count
                    break
                }
                return "OK \(first)"
            case "streamcancel":
                // Iterates a stream in a task of its own and cancels that task `args[2]` ms
                // later: before its first byte, where the source's handler stalls.
                let drop = try lastDrop()
                let task = Task { () throws(BrokerError) -> Int in
                    var count = 0
                    for try await chunk in drop.loadStream(item: Int(args[0])!, typeIdentifier: args[1]) { count += chunk.count }
                    return count
                }
                try? await Task.sleep(for: .milliseconds(Int(args[2])!))
                task.cancel()
                return "OK \(try await task.value) not cancelled"
            case "loadcheck":
                // For large loads: the count and whether every byte matches the pattern.
                let data = try await lastDrop().loadData(item: Int(args[0])!, typeIdentifier: args[1])
                return patternReport(data)
            case "conclude": try await lastDrop().conclude(); return "OK"
            case "whoami":
                let identity = try await connection.whoAmI()
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                return "OK " + String(decoding: try encoder.encode(identity), as: UTF8.self)
            case "additems":
                guard let drag = drags.withLock({ $0.last }) else { throw BrokerError(.notFound, "no drag begun") }
                let specs = try JSONDecoder().decode([ItemSpec].self, from: Data(rest.utf8))
                try await drag.addItems(try dragItems(specs, startingAt: drag.items.count))
                return "OK"
            case "conforming":
                return "OK " + (try await lastDrop().items(conformingTo: rest)).map(String.init).joined(separator: ",")
            case "monitor":
                _ = try await connection.monitor()
                return "OK"
            case "monitorunread":
                // Monitors with nobody reading until `readmonitor`.
                let stream = try await connection.monitor()
                unreadMonitor.withLock { $0 = stream }
                return "OK"
            case "readmonitor":
                // Monitoring again ends the stream of `monitorunread`: what it kept, and the last.
                guard let stream = unreadMonitor.withLock({ $0 }) else { throw BrokerError(.notFound, "no unread monitor") }
                // A round trip first: events the broker sent before it are in the stream by its reply.
                _ = try await connection.whoAmI()
                _ = try await connection.monitor()
                var count = 0, last = "none"
                for await event in stream {
                    count += 1
                    last = "\(event.session) \(event.event)"
                }
                return "OK \(count) \(last)"
            case "churndrags":
                // churndrags <count>: begins and cancels that many drags, one after another.
                let provider = ItemProvider()
                provider.registerDataRepresentation(forTypeIdentifier: "text/plain", data: Data("x".utf8))
                for _ in 0..<Int(args[0])! {
                    try await connection.beginDrag(items: [DragItem(itemProvider: provider)]).cancel()
                }
                return "OK"
            case "reload":
                try await connection.reloadPolicy()
                return "OK"
            case "sessions":
                let sessions = try await connection.listSessions()
                return "OK " + sessions.map { "\($0.id):\($0.state)" }.joined(separator: ",")
            case "stress":
                return try await stress(tasks: Int(args[0])!, rounds: Int(args[1])!, item: Int(args[2])!, type: args[3])
            case "churn":
                return try await churn(Int(args[0])!)
            // Typed objects. `beginobjects` takes [{"string": …} | {"data": base64} | {"file": name,
            // "text": …} (a file written for the drag) | {"url": …}], each with an optional
            // "visibility"; `canload` and `loadobjects` take String, Data or URL. Loaded URLs print
            // as their file's name and contents, and whether it is a temporary file, then go.
            case "beginobjects", "canload", "loadobjects":
                struct ObjectSpec: Decodable {
                    var string: String?
                    var data: String?
                    var file: String?
                    var text: String?
                    var url: String?
                    var visibility: Visibility?
                }
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
                switch (command, rest) {
                case ("beginobjects", _):
                    var items: [DragItem] = []
                    for spec in try JSONDecoder().decode([ObjectSpec].self, from: Data(rest.utf8)) {
                        let visibility = spec.visibility ?? .all
                        if let string = spec.string {
                            items.append(DragItem(itemProvider: ItemProvider(object: string, visibility: visibility)))
                        } else if let base64 = spec.data, let data = Data(base64Encoded: base64) {
                            items.append(DragItem(itemProvider: ItemProvider(object: data, visibility: visibility)))
                        } else if let name = spec.file {
                            let directory = FileManager.default.temporaryDirectory
                                .appendingPathComponent("testpeer-\(getpid())/\(UUID().uuidString)")
                            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
                            let file = directory.appendingPathComponent(name)
                            try Data((spec.text ?? "").utf8).write(to: file)
                            items.append(DragItem(itemProvider: ItemProvider(object: file, visibility: visibility)))
                        } else if let link = spec.url, let url = URL(string: link) {
                            items.append(DragItem(itemProvider: ItemProvider(object: url, visibility: visibility)))
                        } else {
                            throw BrokerError(.invalidArgument, "peer: an object needs string, data, file or url")
                        }
                    }
                    let session = try await connection.beginDrag(items: items)
                    drags.withLock { $0.append(session) }
                    Task {
                        // loadRequested lines say which representation each object load chose.
                        for await event in session.events {
                            if case .loadProgress = event { continue }
                            emit("EVENT \(describe(event))")
                        }
                    }
                    return "OK \(session.token) \(session.path)"
                case ("canload", "String"): return "OK \(try await lastDrop().canLoadObjects(ofType: String.self))"
                case ("canload", "Data"): return "OK \(try await lastDrop().canLoadObjects(ofType: Data.self))"
                case ("canload", "URL"): return "OK \(try await lastDrop().canLoadObjects(ofType: URL.self))"
                case ("loadobjects", "String"):
                    let strings = try await lastDrop().loadObjects(ofType: String.self)
                    return "OK " + String(decoding: try encoder.encode(strings), as: UTF8.self)
                case ("loadobjects", "Data"):
                    let data = try await lastDrop().loadObjects(ofType: Data.self)
                    return "OK " + String(decoding: try encoder.encode(data.map { $0.base64EncodedString() }), as: UTF8.self)
                case ("loadobjects", "URL"):
                    var files: [[String: String]] = []
                    for url in try await lastDrop().loadObjects(ofType: URL.self) {
                        let directory = url.deletingLastPathComponent()
                        let temporary = directory.deletingLastPathComponent().standardizedFileURL.path
                            == FileManager.default.temporaryDirectory.standardizedFileURL.path
                        files.append(["name": url.lastPathComponent, "contents": try Data(contentsOf: url).base64EncodedString(),
                                      "temporary": String(temporary)])
                        try FileManager.default.removeItem(at: directory)
                    }
                    return "OK " + String(decoding: try encoder.encode(files), as: UTF8.self)
                default: return "ERR usage \(command) takes String, Data or URL"
                }
            default: return "ERR usage unknown command \(command)"
            }
        } catch {
            return describe(error)
        }
    }

    /// `tasks` tasks at once, each `rounds` times: five connection and session calls, then
    /// the load twice, once with progress. Each answer is checked; the counts are returned.
    /// Replies and signals arrive on the connection's loop thread while every caller waits on
    /// the cooperative pool: a message released off its loop would end the process here.
    func stress(tasks: Int, rounds: Int, item: Int, type: String) async throws -> String {
        let drop = try lastDrop()
        let expected = try await drop.loadData(item: item, typeIdentifier: type)
        let identity = try await connection.whoAmI()
        let progressReports = Tally()
        let (calls, loads, bytes) = try await withThrowingTaskGroup(of: (Int, Int, Int).self) { group in
            for _ in 0..<tasks {
                group.addTask {
                    var calls = 0, loads = 0, bytes = 0
                    for _ in 0..<rounds {
                        guard try await self.connection.whoAmI() == identity else { throw BrokerError(.failed, "stress: whoAmI changed") }
                        guard let session = try await self.connection.listSessions().first else { throw BrokerError(.failed, "stress: no session") }
                        guard try await self.connection.describeSession(session.id).id == session.id else { throw BrokerError(.failed, "stress: other session") }
                        guard try await drop.items().count > item else { throw BrokerError(.failed, "stress: items vanished") }
                        guard try await drop.items(conformingTo: type).contains(item) else { throw BrokerError(.failed, "stress: no conforming item") }
                        calls += 5
                        let data = try await drop.loadData(item: item, typeIdentifier: type)
                        let watched = try await drop.loadData(item: item, typeIdentifier: type) { _, _ in
                            progressReports.add(1)
                        }
                        guard data == expected, watched == expected else { throw BrokerError(.failed, "stress: bytes differ") }
                        loads += 2
                        bytes += data.count + watched.count
                    }
                    return (calls, loads, bytes)
                }
            }
            return try await group.reduce((0, 0, 0)) { ($0.0 + $1.0, $0.1 + $1.1, $0.2 + $1.2) }
        }
        // Each watched load reports at least its 100 %.
        guard progressReports.total >= loads / 2 else { throw BrokerError(.failed, "stress: progress missing") }
        return "OK \(calls) \(loads) \(bytes)"
    }

    /// Connects `count` more times, one call each, and lets each connection go from a task on
    /// the cooperative pool: its bus and slots must still be released on its own loop.
    func churn(_ count: Int) async throws -> String {
        var names = Set<String>()
        for _ in 0..<count {
            let other = try await BrokerConnection.connect()
            _ = try await other.whoAmI()
            names.insert(await other.uniqueName)
        }
        return "OK \(names.count)"
    }

    func lastDrop() throws -> DropSession {
        guard let drop = drops.withLock({ $0.last }) else { throw BrokerError(.notFound, "no presented session") }
        return drop
    }

    func operation(_ name: String) throws -> DropOperation {
        guard let op = DropOperation(rawValue: name) else { throw BrokerError(.invalidArgument, "peer: bad operation \(name)") }
        return op
    }

    func begin(_ json: String) async throws -> String {
        let spec = try JSONDecoder().decode(BeginSpec.self, from: Data(json.utf8))
        let items = try dragItems(spec.items, startingAt: 0)
        let session = try await connection.beginDrag(
            items: items, options: SessionOptions(restrictedToApp: spec.restricted ?? false, allowsMove: spec.allowsMove ?? false))
        drags.withLock { $0.append(session) }
        if spec.unread == true { return "OK \(session.token) \(session.path)" }
        let requests = spec.requests ?? false
        Task {
            for await event in session.events {
                switch event {
                case .loadRequested where requests: emit("EVENT \(describe(event))")
                case .loadRequested, .loadProgress: break  // HANDLER lines say when handlers run
                case .ended(_, let error?):
                    emit("EVENT \(describe(event))")
                    emit("WHY \(error.message)")
                default: emit("EVENT \(describe(event))")
                }
            }
        }
        return "OK \(session.token) \(session.path)"
    }

    func copy(_ json: String) async throws -> String {
        let spec = try JSONDecoder().decode(BeginSpec.self, from: Data(json.utf8))
        let items = try dragItems(spec.items, startingAt: 0)
        let entry = try await connection.copy(
            items: items, options: PasteOptions(restrictedToApp: spec.restricted ?? false, expirationSec: spec.expiration))
        entries.withLock { $0.append(entry) }
        if spec.unread == true { return "OK \(entry.token) \(entry.path)" }
        Task {
            for await event in entry.events {
                switch event {
                case .loadRequested: break  // HANDLER lines say when handlers run
                case .ended(let error?):
                    emit("EVENT \(describe(event))")
                    emit("WHY \(error.message)")
                default: emit("EVENT \(describe(event))")
                }
            }
            emit("EVENT entryDone")
        }
        return "OK \(entry.token) \(entry.path)"
    }

    /// Items whose load handlers print `HANDLER <item> <type>` when they run. Item numbers
    /// continue across `additems`, as the broker numbers them.
    func dragItems(_ specs: [ItemSpec], startingAt first: Int) throws -> [DragItem] {
        var items: [DragItem] = []
        for (offset, itemSpec) in specs.enumerated() {
            let index = first + offset
            let provider = ItemProvider(suggestedName: itemSpec.name ?? "",
                                        preferredPresentationSize: (itemSpec.width ?? 0, itemSpec.height ?? 0))
            for rep in itemSpec.reps {
                let bytes = rep.text.map { Data($0.utf8) } ?? patternBytes(rep.size ?? 0)
                let failure = rep.fail
                let cancelled = rep.cancel
                let stall = rep.stall ?? false
                let type = rep.type
                let visibility = rep.visibility ?? .all
                if rep.ready == true {
                    if rep.kind == "file" {
                        provider.registerFileRepresentation(forTypeIdentifier: type, visibility: visibility, file: try makeFile(rep.file ?? "memfd", bytes))
                    } else {
                        provider.registerDataRepresentation(forTypeIdentifier: type, visibility: visibility, data: bytes)
                    }
                } else if rep.kind == "file" {
                    let fileKind = rep.file ?? "memfd"
                    provider.registerFileRepresentation(forTypeIdentifier: type, visibility: visibility) {
                        emit("HANDLER \(index) \(type)")
                        if cancelled != nil { throw CancellationError() }
                        return try makeFile(fileKind, bytes)
                    }
                } else if let chunk = rep.chunk {
                    let pause = rep.pauseMs ?? 0
                    let announce = rep.announce ?? false
                    let stallAfter = rep.stallAfter
                    provider.registerStreamRepresentation(forTypeIdentifier: type, visibility: visibility) { writer in
                        emit("HANDLER \(index) \(type)")
                        if announce { await writer.setExpectedSize(UInt64(bytes.count)) }
                        var offset = 0
                        while offset < bytes.count {
                            if let stallAfter, offset >= stallAfter {
                                while true { try await Task.sleep(for: .seconds(3600)) }
                            }
                            let end = min(offset + chunk, bytes.count)
                            try await writer.write(bytes[offset..<end])
                            offset = end
                            if pause > 0 { try await Task.sleep(for: .milliseconds(pause)) }
                        }
                    }
                } else {
                    provider.registerDataRepresentation(forTypeIdentifier: type, visibility: visibility) {
                        emit("HANDLER \(index) \(type)")
                        if let failure { throw BrokerError(.providerFailed, failure) }
                        if let cancelled { throw BrokerError(.cancelled, cancelled) }
                        while stall { try await Task.sleep(for: .seconds(3600)) }
                        return bytes
                    }
                }
            }
            items.append(DragItem(itemProvider: provider))
        }
        return items
    }
}

/// A count that tasks add to at once.
final class Tally: Sendable {
    private let value = Mutex(0)
    func add(_ amount: Int) { value.withLock { $0 += amount } }
    var total: Int { value.withLock { $0 } }
}

func describe(_ event: DragSessionEvent) -> String {
    switch event {
    case .loadRequested(let load, let item, let type): "loadRequested \(load) \(item) \(type)"
    case .loadProgress(let load, let bytes, let expected): "loadProgress \(load) \(bytes) \(expected.map(String.init) ?? "-")"
    case .loadFinished(let load, let bytes, let error): "loadFinished \(load) \(bytes) \(error?.code.busName ?? "-")"
    case .willEnd(let op): "willEnd \(op.rawValue)"
    case .ended(let op, let error): "ended \(op.rawValue) \(error?.code.busName ?? "-")"
    case .transferFinished: "transferFinished"
    }
}

func describe(_ event: PasteboardEntryEvent) -> String {
    func id(_ path: String) -> String { String(path.split(separator: "/").last ?? "") }
    return switch event {
    case .pasted(let paste, let app): "pasted \(id(paste)) \(app)"
    case .loadRequested(let paste, let load, let item, let type): "loadRequested \(id(paste)) \(load) \(item) \(type)"
    case .loadFinished(let paste, let load, let bytes, let error): "loadFinished \(id(paste)) \(load) \(bytes) \(error?.code.busName ?? "-")"
    case .ended(let error): "entryEnded \(error?.code.busName ?? "-")"
    }
}

func describe(_ event: DropSessionEvent) -> String {
    switch event {
    case .loadProgress(let item, let load, let bytes, let expected): "loadProgress \(item) \(load) \(bytes) \(expected.map(String.init) ?? "-")"
    case .ended(let op, let error): "ended \(op.rawValue) \(error?.code.busName ?? "-")"
    }
}

/// stdin lines, read on a thread of their own so no task blocks on the terminal.
func standardInputLines() -> AsyncStream<String> {
    let (stream, continuation) = AsyncStream.makeStream(of: String.self)
    let thread = Thread {
        while let line = readLine() { continuation.yield(line) }
        continuation.finish()
    }
    thread.start()
    return stream
}

do {
    let connection = try await BrokerConnection.connect()
    let peer = Peer(connection: connection)
    emit("READY \(await connection.uniqueName)")
    for await line in standardInputLines() {
        emit(await peer.run(line))
    }
} catch {
    emit(describe(error))
    exit(1)
}

func readAll(_ fd: FileDescriptor) throws -> Data {
    var data = Data()
    var buffer = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let n = try buffer.withUnsafeMutableBytes { try fd.readSome(into: $0) }
        if n == 0 { return data }
        data.append(contentsOf: buffer[0..<n])
    }
}

/// The descriptors a source might hand over, good and bad.
func makeFile(_ kind: String, _ bytes: Data) throws -> FileDescriptor {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("testpeer-\(getpid())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    let path = directory.appendingPathComponent("file-\(UUID().uuidString)").path
    if kind.hasPrefix("path:") {
        return try FileDescriptor.open(String(kind.dropFirst("path:".count)), .readOnly)
    }
    if kind.hasPrefix("opath:") {
        return try FileDescriptor.openLocation(String(kind.dropFirst("opath:".count)))
    }
    switch kind {
    case "memfd":
        return try SealedMemoryFile.make(name: "testpeer", data: bytes)
    case "shm":
        let shared = "/dev/shm/testpeer-\(getpid())-\(UUID().uuidString)"
        try bytes.write(to: URL(fileURLWithPath: shared))
        defer { unlink(shared) }
        return try FileDescriptor.open(shared, .readOnly)
    case "advanced":
        try bytes.write(to: URL(fileURLWithPath: path))
        let fd = try FileDescriptor.open(path, .readOnly)
        _ = try fd.seek(offset: 1, from: .start)
        return fd
    case "writeonly":
        try bytes.write(to: URL(fileURLWithPath: path))
        return try FileDescriptor.open(path, .writeOnly)
    case "readonly", "writable":
        try bytes.write(to: URL(fileURLWithPath: path))
        return try FileDescriptor.open(path, kind == "readonly" ? .readOnly : .readWrite)
    case "unsealed":
        let fd = try Kernel.makeMemoryFile(name: "unsealed")
        try bytes.withUnsafeBytes { try fd.writeFully($0) }
        return fd
    case "directory":
        return try FileDescriptor.open(directory.path, .readOnly)
    case "pipe":
        let (readEnd, writeEnd) = try FileDescriptor.makePipe(nonBlocking: false)
        writeEnd.closeQuietly()
        return readEnd
    case "socket":
        let (kept, other) = try FileDescriptor.makeSocketPair()
        other.closeQuietly()
        return kept
    default:
        throw BrokerError(.invalidArgument, "peer: unknown file kind \(kind)")
    }
}

/// An Update, with the threads it ran on before and after, as a nonisolated async function
/// runs: on the task's preferred executor, if it has one.
func threadsAround(_ drop: DropSession, _ proposal: DropOperation) async throws -> String {
    let before = currentThreadName()
    let allowed = try await drop.update(proposing: proposal)
    return "\(allowed.rawValue) \(before) \(currentThreadName())"
}

/// The name of the thread running the caller, as the kernel knows it (at most 15 bytes).
func currentThreadName() -> String {
    let comm = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "?"
    return comm.trimmingCharacters(in: .newlines)
}

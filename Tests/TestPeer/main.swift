// A scriptable dragbroker peer for the end-to-end tests: one process per app identity.
// It reads commands on stdin, one per line, and answers each with one line on stdout:
// `OK ...` or `ERR <D-Bus error name> <message>`. Session events arrive as `EVENT ...`
// lines, and a source prints `HANDLER <item> <type>` each time a load handler runs.
import BrokerClient
import BrokerProtocol
import Foundation
import Synchronization

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
    /// Makes the load handler never return.
    var stall: Bool?
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
}

func patternBytes(_ size: Int) -> Data {
    Data((0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
}

func describe(_ error: Error) -> String {
    if let error = error as? BrokerError { return "ERR \(error.code.busName) \(error.message)" }
    return "ERR unexpected \(error)"
}

final class Peer: Sendable {
    let connection: BrokerConnection
    let drags = Mutex<[DragSession]>([])
    let drops = Mutex<[DropSession]>([])

    init(connection: BrokerConnection) { self.connection = connection }

    func run(_ line: String) async -> String {
        let words = line.split(separator: " ", maxSplits: 1).map(String.init)
        guard let command = words.first else { return "ERR usage empty command" }
        let rest = words.count > 1 ? words[1] : ""
        let args = rest.split(separator: " ").map(String.init)
        do {
            switch command {
            case "begin": return try await begin(rest)
            case "cancel":
                guard let drag = drags.withLock({ $0.last }) else { throw BrokerError(.notFound, "no presented drag") }
                try await drag.cancel()
                return "OK"
            case "present":
                let drop = try await connection.presentToken(rest)
                drops.withLock { $0.append(drop) }
                Task { for await event in drop.events { emit("EVENT \(describe(event))") } }
                return "OK \(drop.path)"
            case "items":
                let items = try await lastDrop().items()
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                let encoded = try encoder.encode(items)
                return "OK " + String(decoding: encoded, as: UTF8.self)
            case "enter": return "OK " + (try await lastDrop().enter(proposing: operation(args[0]))).rawValue
            case "update": return "OK " + (try await lastDrop().update(proposing: operation(args[0]))).rawValue
            case "exit": try await lastDrop().exit(); return "OK"
            case "drop": return "OK " + (try await lastDrop().performDrop()).rawValue
            case "load":
                let data = try await lastDrop().loadData(item: Int(args[0])!, typeIdentifier: args[1])
                return "OK \(data.count) \(data.base64EncodedString())"
            case "loadcheck":
                // For large loads: the count and whether every byte matches the pattern.
                let data = try await lastDrop().loadData(item: Int(args[0])!, typeIdentifier: args[1])
                return "OK \(data.count) \(data == patternBytes(data.count) ? "pattern" : "mismatch")"
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
            case "reload":
                try await connection.reloadPolicy()
                return "OK"
            case "sessions":
                let sessions = try await connection.listSessions()
                return "OK " + sessions.map { "\($0.id):\($0.state)" }.joined(separator: ",")
            default: return "ERR usage unknown command \(command)"
            }
        } catch {
            return describe(error)
        }
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
        Task {
            for await event in session.events {
                switch event {
                case .loadRequested: break  // HANDLER lines say when handlers run
                default: emit("EVENT \(describe(event))")
                }
            }
        }
        return "OK \(session.token) \(session.path)"
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
                let stall = rep.stall ?? false
                let type = rep.type
                provider.registerDataRepresentation(forTypeIdentifier: type, visibility: rep.visibility ?? .all) {
                    emit("HANDLER \(index) \(type)")
                    if let failure { throw BrokerError(.providerFailed, failure) }
                    while stall { try await Task.sleep(for: .seconds(3600)) }
                    return bytes
                }
            }
            items.append(DragItem(itemProvider: provider))
        }
        return items
    }
}

func describe(_ event: DragSessionEvent) -> String {
    switch event {
    case .loadRequested(let item, let type): "loadRequested \(item) \(type)"
    case .willEnd(let op): "willEnd \(op.rawValue)"
    case .ended(let op, let error): "ended \(op.rawValue) \(error?.code.busName ?? "-")"
    case .transferFinished: "transferFinished"
    }
}

func describe(_ event: DropSessionEvent) -> String {
    switch event {
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

import BrokerClient
import BrokerProtocol
import Foundation
import Glibc
import Synchronization
import SystemCalls
import SystemPackage

/// The `source` role: a separate process that begins the drag through the client library
/// and, for the baseline, writes into a plain pipe the orchestrator created. It talks to the
/// orchestrator over stdin/stdout lines:
///
///     → READY <unique bus name> <session token>
///     ← plain <bytes>        write that many bytes into the plain pipe, 1 MiB per write(2)
///     → OK plain <bytes>
///     ← plainmany <n> <bytes> write that many bytes into each of the first n concurrent pipes at once
///     → OK plainmany <n> <bytes>
///     ← begin                another drag of the same item; begin64 a drag of section (i)'s 64 MiB item
///     → OK begin <token>
///     ← copy                 put the same item on the broker's pasteboard
///     → OK copy <entry token>
///     ← quit (or end of input) exit
///
/// For the experiments (`DRAGBROKER_BENCH_EXPERIMENTS`) only: `plainhop <bytes>` writes the
/// plain pipe hopping to a dispatch thread per chunk as `DataWriter.write` does, `begin`
/// begins a second drag of the same item, `rawbegin` one from a library-free `RawSource`.
enum SourceRole {
    static let output = Mutex(FileHandle.standardOutput)
    /// Library-free sources begun for the experiments, kept alive.
    static let rawSources = Mutex<[RawSource]>([])
    /// Pasteboard entries, kept alive for the paste measurement.
    static let entries = Mutex<[PasteboardEntry]>([])

    static func emit(_ line: String) {
        output.withLock { try? $0.write(contentsOf: Data((line + "\n").utf8)) }
    }

    /// Runs `work` in a task while the input thread waits, and answers `OK <command> <its
    /// result>` or `ERR <command> <why>`.
    static func answer(_ command: String, _ work: @escaping @Sendable () async throws -> String) {
        let answer = Mutex("")
        let done = DispatchSemaphore(value: 0)
        Task {
            do {
                let result = try await work()
                answer.withLock { $0 = "OK \(command) \(result)" }
            } catch {
                answer.withLock { $0 = "ERR \(command) \(error)" }
            }
            done.signal()
        }
        done.wait()
        emit(answer.withLock { $0 })
    }

    static func run(plainPipePath: String, concurrentPipePaths: [String]) async -> Never {
        Kernel.ignoreSIGPIPE()
        do {
            // Everything is allocated before any timing starts: the 1 MiB chunk every write
            // sends, the small representation, and the 1 GiB sealed memfd.
            let chunk = patternChunk(BenchSizes.chunk)
            let small = patternChunk(BenchSizes.small)
            let memfd = try SealedMemoryFile.make(name: "dragbroker-bench-1g", data: Data(count: BenchSizes.file))

            let plain = open(plainPipePath, O_WRONLY | O_CLOEXEC)
            guard plain >= 0 else { throw BenchError("cannot open the plain pipe \(plainPipePath): \(String(cString: strerror(errno)))") }

            let concurrent = try concurrentPipePaths.map { path in
                let fd = open(path, O_WRONLY | O_CLOEXEC)
                guard fd >= 0 else { throw BenchError("cannot open the plain pipe \(path): \(String(cString: strerror(errno)))") }
                return fd
            }

            let provider = ItemProvider(suggestedName: "bench.bin")
            // Section (i)'s item is one of its own, so every other section's drag is as it was.
            let concurrentProvider = ItemProvider(suggestedName: "bench-64m.bin")
            for (provider, type, size) in [(provider, BenchTypes.data256M, BenchSizes.mib256), (provider, BenchTypes.data1G, BenchSizes.gib1),
                                           (concurrentProvider, BenchTypes.data64M, BenchSizes.mib64)] {
                let chunks = size / BenchSizes.chunk
                provider.registerStreamRepresentation(forTypeIdentifier: type) { writer in
                    for _ in 0..<chunks { try await writer.write(chunk) }
                }
            }
            provider.registerDataRepresentation(forTypeIdentifier: BenchTypes.small) { small }
            provider.registerDataRepresentation(forTypeIdentifier: BenchTypes.smallHeld, data: small)
            provider.registerFileRepresentation(forTypeIdentifier: BenchTypes.fileHeld, file: try memfd.duplicateCloseOnExec())
            let memfdNumber = memfd.rawValue
            provider.registerFileRepresentation(forTypeIdentifier: BenchTypes.file) {
                // A fresh descriptor each load: the library closes what the handler returns.
                try FileDescriptor(rawValue: memfdNumber).duplicateCloseOnExec()
            }

            let connection = try await BrokerConnection.connect()
            let session = try await connection.beginDrag(items: [DragItem(itemProvider: provider)])
            let name = await connection.uniqueName
            let input = Thread {
                while let line = readLine() {
                    let words = line.split(separator: " ")
                    switch words.first {
                    case "plain":
                        guard words.count == 2, let size = Int(words[1]) else { emit("ERR usage \(line)"); continue }
                        do {
                            try writePlain(plain, size: size, chunk: chunk)
                            emit("OK plain \(size)")
                        } catch {
                            emit("ERR plain \(error)")
                        }
                    case "plainmany":
                        guard words.count == 3, let count = Int(words[1]), count <= concurrent.count, let size = Int(words[2]) else {
                            emit("ERR usage \(line)")
                            continue
                        }
                        do {
                            try Concurrent.writeAll(Array(concurrent.prefix(count)), size: size, chunk: chunk)
                            emit("OK plainmany \(count) \(size)")
                        } catch {
                            emit("ERR plainmany \(error)")
                        }
                    case "plainhop":
                        // Experiment: each 1 MiB write hops to a dispatch thread from a task,
                        // as DataWriter.write does.
                        guard words.count == 2, let size = Int(words[1]) else { emit("ERR usage \(line)"); continue }
                        let done = DispatchSemaphore(value: 0)
                        let failure = Mutex<String?>(nil)
                        Task {
                            do {
                                var remaining = size
                                while remaining > 0 {
                                    try Task.checkCancellation()
                                    let length = min(remaining, chunk.count)
                                    try await offThread { try writePlain(plain, size: length, chunk: chunk) }
                                    remaining -= length
                                }
                            } catch {
                                failure.withLock { $0 = "\(error)" }
                            }
                            done.signal()
                        }
                        done.wait()
                        if let failure = failure.withLock({ $0 }) { emit("ERR plain \(failure)") } else { emit("OK plain \(size)") }
                    case "begin":
                        // Experiment: a second drag of the same item, for a raw destination.
                        answer("begin") { try await connection.beginDrag(items: [DragItem(itemProvider: provider)]).token }
                    case "begin64":
                        // Section (i): a drag of the 64 MiB item.
                        answer("begin64") { try await connection.beginDrag(items: [DragItem(itemProvider: concurrentProvider)]).token }
                    case "copy":
                        // The same item on the broker's pasteboard, for the paste measurement.
                        answer("copy") {
                            let entry = try await connection.copy(items: [DragItem(itemProvider: provider)])
                            entries.withLock { $0.append(entry) }
                            return entry.token
                        }
                    case "rawbegin":
                        // Experiment: a drag begun by a library-free source in this process.
                        answer("rawbegin") {
                            let raw = try RawSource(address: ProcessInfo.processInfo.environment["DRAGBROKER_BUS_ADDRESS"] ?? "")
                            let token = try await raw.begin(memfd: memfdNumber, small: small)
                            rawSources.withLock { $0.append(raw) }
                            return token
                        }
                    case "quit":
                        exit(0)
                    default:
                        emit("ERR usage \(line)")
                    }
                }
                exit(0)
            }
            input.start()
            emit("READY \(name) \(session.token)")
            // The drag lives as long as the process; the input thread ends it.
            while true { try await Task.sleep(for: .seconds(3600)) }
        } catch {
            emit("ERR \(error)")
            exit(1)
        }
    }

    /// The baseline writer: `size` bytes into the plain pipe, 1 MiB per write(2), from the
    /// same preallocated chunk the stream representation sends.
    static func writePlain(_ fd: Int32, size: Int, chunk: Data) throws {
        try chunk.withUnsafeBytes { raw in
            var remaining = size
            while remaining > 0 {
                let length = min(remaining, raw.count)
                var offset = 0
                while offset < length {
                    let n = Glibc.write(fd, raw.baseAddress! + offset, length - offset)
                    if n > 0 { offset += n; continue }
                    if n < 0 && errno == EINTR { continue }
                    throw BenchError("write to the plain pipe failed: \(String(cString: strerror(errno)))")
                }
                remaining -= length
            }
        }
    }
}

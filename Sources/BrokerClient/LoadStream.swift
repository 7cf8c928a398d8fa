import BrokerProtocol
import BusKit
import Foundation
import SystemCalls

/// A representation's bytes as they arrive, a chunk at a time (`DropSession.loadStream`):
///
/// ```swift
/// for try await chunk in drop.loadStream(item: 1, typeIdentifier: "video/mp4") { … }
/// ```
///
/// The load starts at the first `next()` and is read by the task that iterates, with no task
/// or buffer of the stream's own in between: a reader slower than the source holds the source
/// back (its pipe fills) instead of piling the load up in memory. The first 1 MiB of a data
/// load is waited for on the connection's loop and read there as it turns readable, a read
/// that does not wait; later chunks and a file's are read on a dispatch thread. A chunk is at
/// most 1 MiB. After the last chunk the stream checks the broker's verdict, so a load that
/// failed or was cut short ends by throwing, never as a short stream. Cancelling the iterating
/// task cancels the load, and so does leaving the loop early (`break`): either way the source
/// hears of it. Iterate it once: each iterator is a load of its own.
public struct LoadStream: AsyncSequence, Sendable {
    public typealias Element = Data
    public typealias Failure = BrokerError

    let session: DropSession
    let item: Int
    let typeIdentifier: String

    public func makeAsyncIterator() -> Iterator {
        Iterator(reader: LoadReader(session: session, item: item, typeIdentifier: typeIdentifier))
    }

    public struct Iterator: AsyncIteratorProtocol {
        fileprivate let reader: LoadReader

        public mutating func next() async throws(BrokerError) -> Data? {
            try await reader.next()
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async throws(BrokerError) -> Data? {
            try await reader.next()
        }
    }

    /// How much a chunk holds at most, and how much of a data load is read on the loop.
    static let chunkSize = 1 << 20
}

/// One load of a `LoadStream`. Only the iterating task uses it, one `next()` at a time (the
/// iterator is not `Sendable`), hence unchecked.
private final class LoadReader: @unchecked Sendable {
    private enum State {
        case idle
        case reading(Reading)
        case finished
    }

    private struct Reading {
        let fd: FileDescriptor
        let id: UInt32
        let kind: RepresentationKind
        var received: UInt64 = 0
    }

    private let session: DropSession
    private let item: Int
    private let typeIdentifier: String
    private var state = State.idle
    /// Watches a data load's pipe on the loop while its head is read there; released on the
    /// loop (BusKit checks), and held nowhere else.
    private var watch: ReadinessWatch?
    /// The watch's release was handed to the loop's queue from another thread: the pipe may
    /// then be closed only through that queue too, behind the release.
    private var releaseQueued = false

    init(session: DropSession, item: Int, typeIdentifier: String) {
        self.session = session
        self.item = item
        self.typeIdentifier = typeIdentifier
    }

    /// An iterator let go of before the end: the load is cancelled, its pipe closed.
    deinit {
        guard case .reading(let reading) = state else { return }
        end(reading)
        session.abandonLoad(reading.id)
        session.cancelLoadSoon(reading.id)
    }

    func next() async throws(BrokerError) -> Data? {
        // The Load call and a data load's head belong on the loop: from elsewhere the whole
        // step goes there, one hop there and back rather than one for each of its parts. A
        // task on the loop's thread that the loop will not resume (`holdsTask`) goes there too:
        // the watch's wait would resume it elsewhere, away from the watch.
        let loop = session.loop
        guard onLoop, !loop.holdsTask(isolatedTo: #isolation) else { return try await step() }
        return try await withTaskExecutorPreference(loop.taskExecutor) { () async throws(BrokerError) -> Data? in try await step() }
    }

    /// Whether the next step is made on the loop: the Load call, and a data load's head.
    private var onLoop: Bool {
        switch state {
        case .idle: true
        case .reading(let reading): reading.kind == .data && reading.received < UInt64(LoadStream.chunkSize)
        case .finished: false
        }
    }

    private func step() async throws(BrokerError) -> Data? {
        var reading: Reading
        switch state {
        case .finished:
            return nil
        case .reading(let current):
            reading = current
        case .idle:
            let (fd, id, kind) = try await session.beginLoad(item: item, typeIdentifier: typeIdentifier)
            reading = Reading(fd: fd, id: id, kind: kind)
            state = .reading(reading)
        }
        let chunk: Data
        do {
            chunk = try await withTaskCancellationHandler {
                try await read(&reading)
            } onCancel: { [session, id = reading.id] in
                session.cancelLoadSoon(id)
            }
        } catch let error as BrokerError {
            end(reading)
            session.abandonLoad(reading.id)
            throw error
        } catch {
            end(reading)
            throw await session.failedRead(reading.id, error)
        }
        if !chunk.isEmpty {
            reading.received += UInt64(chunk.count)
            state = .reading(reading)
            return chunk
        }
        end(reading)
        try await session.finishLoad(reading.id, kind: reading.kind, received: reading.received)
        return nil
    }

    /// The next chunk; empty at end of file. A data load's first `chunkSize` bytes are read
    /// on the loop, each read as large as what the pipe holds then.
    private func read(_ reading: inout Reading) async throws -> Data {
        guard reading.kind == .data, reading.received < UInt64(LoadStream.chunkSize) else {
            releaseWatch()
            return try await DescriptorIO.readSome(from: reading.fd, upToWaiting: LoadStream.chunkSize)
        }
        // On the loop (`next` saw to it), where the watch lives.
        let watch = try self.watch ?? ReadinessWatch(reading.fd, on: session.loop)
        self.watch = watch
        await watch.readable()
        return try DescriptorIO.readAvailable(from: reading.fd, upTo: LoadStream.chunkSize - Int(reading.received))
    }

    /// The descriptor is done with: its watch released, then the descriptor closed, both on
    /// the loop's thread when a watch is still held. In that order: closing first would leave
    /// the watch's epoll registration behind whenever another copy of the pipe's read end is
    /// still open somewhere (epoll forgets a descriptor only with its last copy), and sd-event,
    /// having freed the watch, then met its stale registration in `process_epoll` and aborted.
    private func end(_ reading: Reading) {
        state = .finished
        releaseWatch(thenClosing: reading.fd)
    }

    /// Lets go of the pipe's watch on the loop's thread, where BusKit lets it go (here, or
    /// through the loop's queue), then closes `fd` if given. Once a release went through the
    /// queue, so does the close, even from the loop's thread: the queue runs in order, and a
    /// close that overtook the release would leave the watch on a closed descriptor (BusKit
    /// traps) or on whatever pipe next takes its number.
    private func releaseWatch(thenClosing fd: FileDescriptor? = nil) {
        guard watch != nil || (releaseQueued && fd != nil) else {
            fd?.closeQuietly()
            return
        }
        if session.loop.isCurrent && !releaseQueued {
            watch = nil
            fd?.closeQuietly()
            return
        }
        // A reference of its own, the last, for the loop to let go of: no reference this
        // thread holds may be the last, even if the loop is quicker than this function.
        let last = watch.map { Unmanaged.passRetained($0) }
        watch = nil
        releaseQueued = true
        nonisolated(unsafe) let released = last
        session.loop.execute {
            released?.release()
            fd?.closeQuietly()
        }
    }
}

import BrokerProtocol
import BusKit
import SystemCalls

/// Every descriptor a client hands the daemon passes through here, so the loop never makes a
/// call on one that can block: a client's file may live on a file system its own app serves
/// (FUSE), where `fstat`, `open` and even `close` wait for that app's answer, possibly for ever.
///
/// One kind is told apart without asking any file system, and cannot block: a file in memory
/// (a memfd, or a file on tmpfs or hugetlbfs), which alone answers `F_GET_SEALS`; `fcntl` never
/// reaches a file system. Such a file is handled on the loop, sparing the most common handover
/// (a sealed memfd) two thread hops. Every other file goes to the workers.
///
/// The loop touches such a descriptor only as a number inside a bus message: sd-bus owns it
/// and would close it, on the loop, when the message goes. So the message is kept on the loop
/// while a worker takes the descriptor out of it (`dup`) and points the message's number at
/// /dev/null, paying for the close itself; only then does the loop let the message go. A
/// message the daemon sends with such a descriptor (the destination's `Load` reply) is kept
/// the same way until sd-bus has written it out.
final class ClientDescriptors {
    let workers: BlockingWorkers
    private let loop: EventLoop
    private let bus: Bus
    /// Messages whose descriptor numbers a worker is still pointing elsewhere.
    private var held: [UInt64: Message] = [:]
    /// Sent messages waiting for sd-bus to write them out before their numbers are retired.
    private var unwritten: [(message: Message, number: Int32, owners: [Bucket])] = []
    private var writeCheck: LoopTimer?
    private var nextKey: UInt64 = 0

    init(workers: BlockingWorkers, bus: Bus) {
        self.workers = workers
        self.bus = bus
        loop = bus.loop
    }

    /// Takes the descriptor at `number` out of `message` on a worker of its owners', runs
    /// `examine` on it there, and hands its result to `then` on the loop. Refused with
    /// `LimitExceeded` when the owners' threads are spent; the descriptor is then closed as soon
    /// as a thread is free.
    func take<Result: Sendable>(_ number: Int32, from message: Message, owners: [Bucket], for what: String,
                                examine: @escaping @Sendable (FileDescriptor?) -> Result,
                                then: @escaping (Result) -> Void) throws(BrokerError) {
        if Self.isInMemory(number) {
            return then(examine(try? FileDescriptor(rawValue: number).duplicateCloseOnExec()))
        }
        let key = hold(message)
        let done = LoopBound(then, loop: loop)
        let loop = loop
        let bound = LoopBound(self, loop: loop)
        do {
            try workers.start(owners: owners, what) {
                let result = examine(Self.takeOut(number))
                loop.execute {
                    bound.value.release(key)
                    done.value(result)
                }
            }
        } catch {
            retire(key, number: number, owners: owners)
            throw error
        }
    }

    /// Closes a descriptor the daemon is done with, on a worker unless it is in memory.
    func close(_ descriptor: FileDescriptor, owners: [Bucket]) {
        if Self.isInMemory(descriptor.rawValue) { return descriptor.closeQuietly() }
        workers.eventually(owners: owners) { descriptor.closeQuietly() }
    }

    /// `message` was just sent carrying a client's descriptor at `number`: once sd-bus has
    /// written it out (the receiver's copy is then in the socket), a worker retires the number.
    func retire(sent message: Message, number: Int32, owners: [Bucket]) {
        guard !Self.isInMemory(number) else { return }
        unwritten.append((message, number, owners))
        retireWritten()
    }

    private func retireWritten() {
        guard !unwritten.isEmpty else { return }
        guard bus.queuedWrites == 0 else {
            // sd-bus writes the rest when the socket takes it; look again shortly.
            if writeCheck == nil {
                writeCheck = try? LoopTimer(loop: loop, afterMicroseconds: 1_000, accuracy: 1_000) { [unowned self] in
                    writeCheck = nil
                    retireWritten()
                }
            }
            return
        }
        for (message, number, owners) in unwritten { retire(hold(message), number: number, owners: owners) }
        unwritten = []
    }

    private func hold(_ message: Message) -> UInt64 {
        nextKey += 1
        held[nextKey] = message
        return nextKey
    }

    private func release(_ key: UInt64) {
        held.removeValue(forKey: key)
    }

    /// Points the held message's number at /dev/null on a worker, closing the client's file
    /// there, then lets the message go on the loop.
    private func retire(_ key: UInt64, number: Int32, owners: [Bucket]) {
        let loop = loop
        let bound = LoopBound(self, loop: loop)
        workers.eventually(owners: owners) {
            Self.takeOut(number)?.closeQuietly()
            loop.execute { bound.value.release(key) }
        }
    }

    /// On a worker: a descriptor of the file at `number` that the caller owns, with `number`
    /// itself now /dev/null (closing the file there, which may block). Nil if the number held
    /// nothing, or no /dev/null could be opened (the number is then left as it is).
    private static func takeOut(_ number: Int32) -> FileDescriptor? {
        guard let null = Kernel.nullDevice else { return nil }
        let kept = try? FileDescriptor(rawValue: number).duplicateCloseOnExec()
        try? null.duplicate(over: number)
        return kept
    }

    /// Whether the file at `number` is in memory, where no call on it can block.
    private static func isInMemory(_ number: Int32) -> Bool {
        (try? FileDescriptor(rawValue: number).seals()) != nil
    }
}

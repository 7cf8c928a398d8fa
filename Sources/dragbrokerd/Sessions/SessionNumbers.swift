import BrokerProtocol
import Dispatch
import Synchronization
import SystemCalls
import TransferLog

/// Where session numbers are kept across runs: the in-flight ledger's header.
protocol SessionNumberStore: Sendable {
    /// A store without a system call: the number just handed out.
    func recordIssued(_ number: UInt64)
    /// Numbers up to `number` may be handed out once this returns, because it is on disk.
    func reserve(through number: UInt64) throws(Errno)
    /// Puts the last number recorded on disk.
    func syncIssued() throws(Errno)
}

extension InFlightLedger: SessionNumberStore {}

/// Hands out session numbers, each once, ever. A number is handed out only below a mark that
/// is already on disk (the reservation), so after any crash or power cut the next run starts
/// past every number the last one could have used. The mark moves ahead in blocks, on a queue
/// of its own before the block runs out, so a drag waits for the disk only when a burst spends
/// a whole block faster than one sync.
final class SessionNumbers: Sendable {
    /// Numbers stay below 2^53, where every JSON and JavaScript client still reads them exactly.
    static let ceiling = UInt64(TransferLog.sessionNumberCeiling) + 1
    static let block: UInt64 = 1024

    private struct State {
        var next: UInt64
        var reserved: UInt64
        var extending = false
        var syncScheduled = false
    }
    /// How soon after a number is handed out it is on disk too: after the transfer log's own
    /// group commit (250 ms), so after a power cut the number on disk is at least the log's
    /// highest, and what lies between them is what the log lost.
    static let syncDelay: Double = 0.5
    private let state: Mutex<State>
    private let store: (any SessionNumberStore)?
    private let extender = DispatchQueue(label: "dragbroker.session-numbers")

    /// `next` is the first number to hand out; `reserved` the highest already on disk.
    /// Without a store (tests), every number is reserved.
    init(next: UInt64, reserved: UInt64, store: (any SessionNumberStore)?) {
        state = Mutex(State(next: max(next, 1), reserved: store == nil ? Self.ceiling : reserved))
        self.store = store
    }

    /// Puts the first block's mark on disk, so the first drag does not wait for it.
    func prepare() throws(Errno) {
        try state.withLock { state throws(Errno) in try reserveBlockIfSpent(&state) }
    }

    /// When the next number lies past the mark, puts the mark a block further on disk first.
    private func reserveBlockIfSpent(_ state: inout State) throws(Errno) {
        guard state.next > state.reserved else { return }
        let through = min(state.next + Self.block - 1, Self.ceiling - 1)
        try store?.reserve(through: through)
        state.reserved = through
    }

    /// The next number; fails only when no mark can be put on disk, or the numbers ran out.
    func next() throws(BrokerError) -> UInt64 {
        let (number, extend): (UInt64, UInt64?) = try state.withLock { state throws(BrokerError) in
            guard state.next < Self.ceiling else {
                throw BrokerError(.failed, "The broker has handed out every session ID it can (up to s\(Self.ceiling - 1))")
            }
            // A block that ran out before the next one was on disk is waited for here.
            do {
                try reserveBlockIfSpent(&state)
            } catch {
                throw BrokerError(.failed, "The broker cannot record session IDs on disk: \(error)")
            }
            let number = state.next
            state.next += 1
            var extend: UInt64?
            if !state.extending, state.reserved - number < Self.block / 2, state.reserved < Self.ceiling - 1 {
                state.extending = true
                extend = min(state.reserved + Self.block, Self.ceiling - 1)
            }
            if store != nil, !state.syncScheduled {
                state.syncScheduled = true
                extender.asyncAfter(deadline: .now() + Self.syncDelay) {
                    self.state.withLock { $0.syncScheduled = false }
                    try? self.store?.syncIssued()
                }
            }
            return (number, extend)
        }
        store?.recordIssued(number)
        if let extend, let store {
            extender.async {
                let done = (try? store.reserve(through: extend)) != nil
                self.state.withLock {
                    if done { $0.reserved = max($0.reserved, extend) }
                    $0.extending = false
                }
            }
        }
        return number
    }

    /// At a clean stop: the mark comes back to the last number handed out, so the next run
    /// continues right after it.
    func close() throws(Errno) {
        extender.sync {}
        let last = state.withLock { $0.next - 1 }
        try store?.reserve(through: last)
        state.withLock { $0.reserved = last }
    }
}

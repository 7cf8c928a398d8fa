import BrokerProtocol
import BusKit
import Glibc
import Synchronization
import SystemCalls

/// Moves one load's bytes from the source's pipe to the destination's pipe with splice(2),
/// driven by the event loop: the bytes never enter user space and the bus is never blocked.
///
/// The proxy creates both pipes and owns the two ends in between. The source's write end and
/// the destination's read end go to `handOver` once, to be passed on, and are closed when it
/// returns. The proxy counts nothing: it reports what each wakeup moved, and its owner (the
/// `Load`) keeps the one byte count and says how many more bytes may pass.
final class PipeProxy {
    enum Outcome {
        /// The source closed its end: every byte it wrote has been handed on.
        case endOfData
        /// The destination closed its end before the data ended.
        case destinationClosed
        /// The source had more bytes than it was allowed; the destination got the allowance.
        case limitExceeded
        case failed(String)
    }

    /// Whether the destination's pipe is full: it is not reading.
    var destinationIsFull: Bool { outputIsFull() }
    /// How many more bytes may pass (a policy size rule), nil for no limit.
    var allowance: () -> UInt64? = { nil }
    /// Called after each wakeup that moved bytes, with how many.
    var onMoved: ((UInt64) -> Void)?
    private let input: FileDescriptor
    private let output: FileDescriptor
    private let loop: EventLoop
    private var inputWatch: IOWatch?
    /// Made the first time the destination's pipe fills, which a short load never does.
    private var outputWatch: IOWatch?
    private var onFinish: ((Outcome, UInt64) -> Void)?
    /// The source said it wrote everything: what is in the pipe is the whole of the data,
    /// whether or not every copy of the write end has been closed.
    private var sourceIsDone = false

    /// Proxies alive in this process: loads whose bytes may be moving at once.
    private static let pumping = Atomic<Int>(0)
    /// Larger pipes halve the number of wakeups per byte; see `make bench`.
    private static let pipeSize: Int32 = 1 << 20
    /// Bytes moved in one wakeup (a lone load's, or a drain once the source answered) before
    /// yielding to the rest of the loop, for fairness.
    private static let sliceBudget: UInt64 = 8 << 20

    /// Creates the pipes and lends the peers' ends to `handOver` (source's write end, then the
    /// destination's read end), closing them after it returns: whoever receives them holds
    /// duplicates (sd-bus duplicates what it sends).
    init(loop: EventLoop, handOver: (FileDescriptor, FileDescriptor) throws(InternalError) -> Void,
         onFinish: @escaping (Outcome, _ moved: UInt64) -> Void) throws(InternalError) {
        let fromSource: (readEnd: FileDescriptor, writeEnd: FileDescriptor)
        let toDestination: (readEnd: FileDescriptor, writeEnd: FileDescriptor)
        // Blocking, for ordinary read()/write() loops on the peers' side; the pump's own
        // splice(2) never blocks on a pipe (SPLICE_F_NONBLOCK), so its ends need no flag of
        // their own, and a load costs four fcntl(2) fewer before the source is asked.
        do {
            fromSource = try FileDescriptor.makePipe(nonBlocking: false)
        } catch {
            throw InternalError("Failed to create a pipe: \(error)")
        }
        do {
            toDestination = try FileDescriptor.makePipe(nonBlocking: false)
        } catch {
            fromSource.readEnd.closeQuietly()
            fromSource.writeEnd.closeQuietly()
            throw InternalError("Failed to create a pipe: \(error)")
        }
        input = fromSource.readEnd
        output = toDestination.writeEnd
        Self.pumping.add(1, ordering: .relaxed)
        self.loop = loop
        self.onFinish = onFinish
        defer {
            fromSource.writeEnd.closeQuietly()
            toDestination.readEnd.closeQuietly()
        }
        // Best effort: an unprivileged user may be capped by /proc/sys/fs/pipe-max-size.
        try? input.setPipeCapacity(Self.pipeSize)
        try? output.setPipeCapacity(Self.pipeSize)
        do {
            inputWatch = try IOWatch(loop: loop, fd: input.rawValue, when: .readable) { [unowned self] in pump() }
        } catch {
            throw InternalError("Failed to watch the load's pipes: \(error.message)")
        }
        try handOver(fromSource.writeEnd, toDestination.readEnd)
    }

    deinit {
        Self.pumping.subtract(1, ordering: .relaxed)
        inputWatch = nil
        outputWatch = nil
        input.closeQuietly()
        output.closeQuietly()
    }

    /// The source's reply came: the data ends with what the pipe holds now. A bus library may
    /// keep a duplicate of the write end alive with the call (GDBus's fd list, Qt's delayed
    /// replies), so end of file might never come.
    func sourceFinished() {
        sourceIsDone = true
        pump()
    }

    /// Stops moving bytes; the daemon's ends close with the proxy, so both peers see the pipe end.
    func stop() {
        onFinish = nil
        onMoved = nil
        inputWatch?.setEnabled(false)
        outputWatch?.setEnabled(false)
    }

    private func pump() {
        var moved: UInt64 = 0
        let outcome = pumpSlice(&moved)
        if let outcome {
            finish(outcome, moved: moved)
        } else if moved > 0 {
            onMoved?(moved)
        }
    }

    /// Moves up to the slice budget; returns an outcome once the load's data is settled.
    private func pumpSlice(_ moved: inout UInt64) -> Outcome? {
        while moved < Self.sliceBudget {
            var chunk = UInt64(Self.pipeSize)
            if let allowed = allowance().map({ $0 >= moved ? $0 - moved : 0 }) {
                if allowed == 0 {
                    // At the limit: one more byte waiting means the source has too much.
                    do {
                        if try input.bytesPending() > 0 { return .limitExceeded }
                        // Nothing waiting: the source is done (within the limit) or not yet.
                        if try sourceIsDone || input.readiness(Int16(POLLIN)) & Int16(POLLHUP) != 0 {
                            return .endOfData
                        }
                    } catch {
                        return .failed("FIONREAD failed: \(error)")
                    }
                    return nil
                }
                chunk = min(chunk, allowed)
            }
            do {
                let n = try input.splice(to: output, count: Int(chunk))
                if n == 0 { return .endOfData }
                moved += UInt64(n)
                // While the source writes and other loads are pumped too, one splice per
                // wakeup: asking again at once finds the source copying its next chunk into
                // the pipe under the pipe's lock, and the daemon would spin on that lock for
                // the whole copy, a core the other loads' peers need. A lone load keeps the
                // spin, which hands its pipe on sooner than a wakeup would. The watch is
                // level-triggered, so bytes left behind (or the end) wake the loop again.
                if !sourceIsDone && Self.pumping.load(ordering: .relaxed) > 1 { return nil }
            } catch .resourceTemporarilyUnavailable {
                if sourceIsDone, (try? input.bytesPending()) == 0 {
                    return .endOfData
                }
                if outputIsFull() {
                    // Wait for the destination to drain before reading more from the source.
                    do {
                        try waitForDestination()
                    } catch {
                        return .failed("Failed to watch the destination's pipe: \(error.message)")
                    }
                }
                return nil
            } catch .brokenPipe {
                return .destinationClosed
            } catch {
                return .failed("splice failed: \(error)")
            }
        }
        return nil
    }

    private func waitForDestination() throws(BusError) {
        if outputWatch == nil {
            outputWatch = try IOWatch(loop: loop, fd: output.rawValue, when: .writable) { [unowned self] in
                outputWatch?.setEnabled(false)
                inputWatch?.setEnabled(true)
                pump()
            }
        } else {
            outputWatch?.setEnabled(true)
        }
        inputWatch?.setEnabled(false)
    }

    private func outputIsFull() -> Bool {
        (try? output.readiness(Int16(POLLOUT))) == 0
    }

    /// `moved`: bytes this last wakeup moved, counted with the outcome rather than reported
    /// as progress of their own.
    private func finish(_ outcome: Outcome, moved: UInt64) {
        inputWatch?.setEnabled(false)
        outputWatch?.setEnabled(false)
        let callback = onFinish
        onFinish = nil
        onMoved = nil
        callback?(outcome, moved)
    }
}

import BrokerProtocol
import BusKit
import CSystemd
import Glibc

/// Moves one load's bytes from the source's pipe to the destination's pipe with splice(2),
/// driven by the event loop: the bytes never enter user space and the bus is never blocked.
///
/// The daemon creates both pipes. The source gets the write end of the first, the destination
/// the read end of the second; the proxy holds the ends in between and counts every byte.
final class PipeProxy {
    enum Outcome {
        /// The source closed its end: every byte it wrote has been handed on.
        case endOfData
        /// The destination closed its end before the data ended.
        case destinationClosed
        /// The source had more than `byteLimit` bytes; the destination got exactly `byteLimit`.
        case limitExceeded
        case failed(String)
    }

    /// The ends handed to the peers; the caller passes them on and closes them.
    let sourceEnd: Int32
    let destinationEnd: Int32
    private(set) var bytes: UInt64 = 0
    /// Stop once the source sends more than this (a policy size rule).
    var byteLimit: UInt64?
    /// Called after each wakeup that moved bytes.
    var onProgress: (() -> Void)?

    /// Whether the destination's pipe is full: it is not reading.
    var destinationIsFull: Bool { outputIsFull() }
    private let input: Int32
    private let output: Int32
    private var inputWatch: IOWatch?
    private var outputWatch: IOWatch?
    private var onFinish: ((Outcome) -> Void)?

    /// Larger pipes halve the number of wakeups per byte; see `make bench`.
    private static let pipeSize: Int32 = 1 << 20
    /// Bytes moved per wakeup before yielding to the rest of the loop, for fairness.
    private static let sliceBudget: UInt64 = 8 << 20

    init(loop: EventLoop, onFinish: @escaping (Outcome) -> Void) throws(BrokerError) {
        var a: [Int32] = [-1, -1]
        var b: [Int32] = [-1, -1]
        guard shim_pipe(&a) == 0 else { throw BrokerError(.failed, "Failed to create a pipe: \(String(cString: strerror(shim_errno())))") }
        guard shim_pipe(&b) == 0 else {
            close(a[0]); close(a[1])
            throw BrokerError(.failed, "Failed to create a pipe: \(String(cString: strerror(shim_errno())))")
        }
        // The peers' ends must be blocking for ordinary read()/write() loops on their side.
        _ = fcntl(a[1], F_SETFL, 0)
        _ = fcntl(b[0], F_SETFL, 0)
        // Best effort: an unprivileged user may be capped by /proc/sys/fs/pipe-max-size.
        _ = shim_set_pipe_size(a[0], Self.pipeSize)
        _ = shim_set_pipe_size(b[1], Self.pipeSize)
        input = a[0]
        sourceEnd = a[1]
        destinationEnd = b[0]
        output = b[1]
        self.onFinish = onFinish
        do {
            inputWatch = try IOWatch(loop: loop, fd: input, events: shim_epollin()) { [unowned self] _ in pump() }
            outputWatch = try IOWatch(loop: loop, fd: output, events: shim_epollout()) { [unowned self] _ in
                outputWatch?.setEnabled(false)
                inputWatch?.setEnabled(true)
                pump()
            }
            outputWatch?.setEnabled(false)
        } catch {
            inputWatch = nil
            outputWatch = nil
            [a[0], a[1], b[0], b[1]].forEach { close($0) }
            throw BrokerError(.failed, "Failed to watch the load's pipes: \(error.message)")
        }
    }

    deinit {
        inputWatch = nil
        outputWatch = nil
        close(input)
        close(output)
    }

    /// Stops moving bytes and closes the daemon's ends, so both peers see the pipe end.
    func stop() {
        onFinish = nil
        onProgress = nil
        inputWatch?.setEnabled(false)
        outputWatch?.setEnabled(false)
    }

    private func pump() {
        var moved: UInt64 = 0
        defer { if moved > 0 { onProgress?() } }
        while moved < Self.sliceBudget {
            var chunk = UInt64(Self.pipeSize)
            if let limit = byteLimit {
                if bytes >= limit {
                    // At the limit: one more byte waiting means the source has too much.
                    let pending = shim_pending_bytes(input)
                    if pending > 0 { return finish(.limitExceeded) }
                    if pending < 0 { return finish(.failed("FIONREAD failed: \(String(cString: strerror(shim_errno())))")) }
                    // Nothing waiting: the source has closed (done, within the limit) or not yet.
                    var p = pollfd(fd: input, events: Int16(POLLIN), revents: 0)
                    if poll(&p, 1, 0) == 1 && p.revents & Int16(POLLHUP) != 0 && shim_pending_bytes(input) == 0 {
                        return finish(.endOfData)
                    }
                    return
                }
                chunk = min(chunk, limit - bytes)
            }
            let n = shim_splice(input, output, Int(chunk))
            if n > 0 {
                bytes += UInt64(n)
                moved += UInt64(n)
                continue
            }
            if n == 0 { return finish(.endOfData) }
            let error = shim_errno()
            if error == EINTR { continue }
            if error == EAGAIN {
                if outputIsFull() {
                    // Wait for the destination to drain before reading more from the source.
                    inputWatch?.setEnabled(false)
                    outputWatch?.setEnabled(true)
                }
                return
            }
            if error == EPIPE { return finish(.destinationClosed) }
            return finish(.failed("splice failed: \(String(cString: strerror(error)))"))
        }
    }

    private func outputIsFull() -> Bool {
        var p = pollfd(fd: output, events: Int16(POLLOUT), revents: 0)
        return poll(&p, 1, 0) == 0
    }

    private func finish(_ outcome: Outcome) {
        inputWatch?.setEnabled(false)
        outputWatch?.setEnabled(false)
        let callback = onFinish
        onFinish = nil
        onProgress = nil
        callback?(outcome)
    }
}

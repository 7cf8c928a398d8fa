// BusFace/ — the daemon's D-Bus surface, one file per interface: each handler parses its
// arguments, authorises, calls the model and replies; signals come from the model's events.
// A new method: its rule in Sessions/, its entry in BrokerProtocol's Interfaces.swift and
// XML, and its handler here. Errors become D-Bus names in one place: `Dispatcher.fail`.
import BrokerProtocol
import BusKit
import Logging
import SystemCalls

/// Runs method handlers and answers their failures, the only place a failure becomes a
/// D-Bus error name:
/// - a `BrokerError` is a refusal the caller must handle: answered with its own name and
///   recorded in the audit trail;
/// - anything else (an `InternalError`, an sd-bus failure, a bug) is the daemon's own: logged,
///   answered as `Failed`, and never recorded as the caller's refusal.
struct Dispatcher {
    let audit: AuditSink
    let identities: IdentityResolver
    let logger: Logger
    /// Refusals past their app's burst, answered late.
    let delayed: DelayedRefusals
    /// Work held back behind replies, run before any call is served.
    let afterReplies: AfterReplies

    /// A method handler for `action`. `context` names the session and subject a refusal is
    /// recorded against.
    func serve(_ action: String, context: @escaping (MethodCall) -> (session: Session?, subject: String?) = { _ in (nil, nil) },
               _ body: @escaping (MethodCall) throws -> Void) -> InterfaceImplementation.MethodHandler {
        return { [afterReplies] (call: MethodCall) throws(BusError) in
            afterReplies.runAll()
            do {
                try body(call)
            } catch {
                try? call.message.rewind()
                let (session, subject) = context(call)
                let (answer, recorded) = busError(for: error, call: call, action: action, session: session, subject: subject)
                // An app past its burst of refusals hears later: one that asks again as soon as
                // it hears slows down to what the daemon absorbs, and other apps keep their pace.
                if !recorded, delayed.hold(call, answer, for: audit.refusalRule.delay) { return }
                throw answer
            }
        }
    }

    /// Answers a call kept open (a file load's) with `error`, as `serve` would have.
    func fail(_ call: MethodCall, _ error: any Error, action: String, session: Session?, subject: String?) {
        guard !call.answered else { return }
        call.fail(busError(for: error, call: call, action: action, session: session, subject: subject).error)
    }

    /// The error to answer, and whether a refusal was recorded one by one (false: counted).
    private func busError(for error: any Error, call: MethodCall, action: String, session: Session?,
                          subject: String?) -> (error: BusError, recorded: Bool) {
        let sender = call.sender
        if let refusal = error as? BrokerError {
            // Identified even when the refused call is the connection's first: the record, and
            // the rate its refusals are recorded at, are its app's, not an anonymous name's.
            let identity = identities.known(sender) ?? (try? identities.identity(ofName: sender, on: call.bus))
            let recorded = audit.refused(refusal, sender: sender, identity: identity, action: action, session: session, subject: subject)
            return (refusal.busError, recorded)
        }
        logger.error("Failed to serve \(action) for \(sender): \(error)")
        return (BrokerError(.failed, "dragbrokerd failed to serve \(action): \(error)").busError, true)
    }
}

/// Refused calls answered after a delay, in the order they were refused, by one timer. At most
/// `capacity` wait; past that a refusal is answered at once, so a client that sends without
/// waiting for answers cannot make the daemon hold its calls without bound. At most `pace`
/// are answered each millisecond: a flood's connections, answered together, would ask again
/// together, and every other app's call would wait behind the whole wave.
final class DelayedRefusals {
    static let capacity = 1024
    static let pace = 4
    private let loop: EventLoop
    private var waiting: [(call: MethodCall, error: BusError, due: UInt64)] = []
    private var next = 0
    private var timer: LoopTimer?

    init(loop: EventLoop) { self.loop = loop }

    /// Answers `call` with `error` after `delay` µs; false when it is full (answer now).
    func hold(_ call: MethodCall, _ error: BusError, for delay: UInt64) -> Bool {
        guard waiting.count - next < Self.capacity else { return false }
        waiting.append((call, error, Kernel.monotonicMicroseconds() + delay))
        if timer == nil { arm() }
        return true
    }

    /// Waits for the next call's due time, and at least until `earliest`.
    private func arm(earliest: UInt64 = 0) {
        guard next < waiting.count else {
            waiting.removeAll(keepingCapacity: true)
            next = 0
            timer = nil
            return
        }
        let now = Kernel.monotonicMicroseconds(), due = max(waiting[next].due, earliest)
        timer = try? LoopTimer(loop: loop, afterMicroseconds: due > now ? due - now : 0, accuracy: 100) { [unowned self] in answerDue() }
        if timer == nil { answerAll() }
    }

    private func answerDue() {
        let now = Kernel.monotonicMicroseconds()
        var answered = 0
        while next < waiting.count, waiting[next].due <= now, answered < Self.pace {
            answer(waiting[next])
            next += 1
            answered += 1
        }
        if next > 4096 {
            waiting.removeFirst(next)
            next = 0
        }
        // Having answered its `pace`, the next waits a millisecond, however long overdue.
        arm(earliest: answered == Self.pace ? now + 1_000 : 0)
    }

    /// Answers every waiting call now, e.g. before the daemon exits.
    func answerAll() {
        for entry in waiting[next...] { answer(entry) }
        waiting = []
        next = 0
        timer = nil
    }

    private func answer(_ entry: (call: MethodCall, error: BusError, due: UInt64)) {
        if !entry.call.answered { entry.call.fail(entry.error) }
    }
}

/// Reads one argument, turning sd-bus's decoding errors into `InvalidArgument`: a malformed
/// argument is the caller's.
func argument<T>(_ what: String, _ read: () throws(BusError) -> T) throws(BrokerError) -> T {
    do {
        return try read()
    } catch {
        throw .invalidArgument("Bad argument '\(what)': \(error.message)")
    }
}

/// Sends a reply built from broker values; a failure to build or send it is the daemon's own.
@discardableResult
func reply(_ call: MethodCall, _ build: (Message) throws(BusError) -> Void = { _ in }) throws(InternalError) -> Message {
    do {
        return try call.reply(build)
    } catch {
        throw InternalError("Failed to send the reply: \(error.message)")
    }
}

/// Reads the `a(sdda(sss))` items argument, stopping as soon as the limit is passed.
func readItems(_ m: Message, limit: Int) throws(BrokerError) -> [ItemDescriptor] {
    var items: [ItemDescriptor] = []
    _ = try argument("items") { () throws(BusError) in try m.enterContainer("a", ItemDescriptor.signature) }
    while let item = try ItemDescriptor.decode(from: m) {
        guard items.count < limit else {
            throw .limitExceeded("A session holds at most \(limit) items")
        }
        items.append(item)
    }
    try argument("items") { () throws(BusError) in try m.exitContainer() }
    return items
}

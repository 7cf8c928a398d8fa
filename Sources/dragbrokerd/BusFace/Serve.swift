// BusFace/ — the daemon's D-Bus surface, one file per interface: each handler parses its
// arguments, authorises, calls the model and replies; signals come from the model's events.
// A new method: its rule in Sessions/, its entry in BrokerProtocol's Interfaces.swift and
// XML, and its handler here. Errors become D-Bus names in one place: `Dispatcher.fail`.
import BrokerProtocol
import BusKit
import Logging

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

    /// A method handler for `action`. `context` names the session and subject a refusal is
    /// recorded against.
    func serve(_ action: String, context: @escaping (MethodCall) -> (session: Session?, subject: String?) = { _ in (nil, nil) },
               _ body: @escaping (MethodCall) throws -> Void) -> InterfaceImplementation.MethodHandler {
        return { (call: MethodCall) throws(BusError) in
            do {
                try body(call)
            } catch {
                try? call.message.rewind()
                let (session, subject) = context(call)
                throw busError(for: error, call: call, action: action, session: session, subject: subject)
            }
        }
    }

    /// Answers a call kept open (a file load's) with `error`, as `serve` would have.
    func fail(_ call: MethodCall, _ error: any Error, action: String, session: Session?, subject: String?) {
        guard !call.answered else { return }
        call.fail(busError(for: error, call: call, action: action, session: session, subject: subject))
    }

    private func busError(for error: any Error, call: MethodCall, action: String, session: Session?, subject: String?) -> BusError {
        let sender = call.sender
        if let refusal = error as? BrokerError {
            // Identified even when the refused call is the connection's first: the record, and
            // the rate its refusals are recorded at, are its app's, not an anonymous name's.
            let identity = identities.known(sender) ?? (try? identities.identity(ofName: sender, on: call.bus))
            audit.refused(refusal, sender: sender, identity: identity, action: action, session: session, subject: subject)
            return refusal.busError
        }
        logger.error("Failed to serve \(action) for \(sender): \(error)")
        return BrokerError(.failed, "dragbrokerd failed to serve \(action): \(error)").busError
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

import BrokerProtocol
import BusKit

/// The one place internal failures become D-Bus error names, and every refusal is audited:
/// broker errors keep their name; malformed arguments found by sd-bus become `InvalidArgument`.
func serve(_ broker: Broker, _ action: String, session: Session? = nil, subject: ((Message) -> String?)? = nil,
           _ body: @escaping (MethodCall) throws -> Void) -> InterfaceImplementation.MethodHandler {
    return { [unowned broker, weak session] (call: MethodCall) throws(BusError) in
        let refusal: BrokerError
        do {
            try body(call)
            return
        } catch let error as BrokerError {
            refusal = error
        } catch let error as BusError {
            refusal = BrokerError.invalidArgument(error.message)
        } catch {
            refusal = BrokerError(.failed, "\(error)")
        }
        try? call.message.rewind()
        broker.recordRefusal(refusal, sender: call.sender, action: action, session: session,
                             subject: subject.flatMap { $0(call.message) })
        throw refusal.busError
    }
}

/// Reads one argument, turning sd-bus's decoding errors into `InvalidArgument`.
func argument<T>(_ what: String, _ read: () throws(BusError) -> T) throws(BrokerError) -> T {
    do {
        return try read()
    } catch {
        throw .invalidArgument("Bad argument '\(what)': \(error.message)")
    }
}

/// Sends a reply built from broker values; a failure to build it is the broker's own.
func reply(_ call: MethodCall, _ build: (Message) throws(BusError) -> Void = { _ in }) throws(BrokerError) {
    do {
        try call.reply(build)
    } catch {
        throw BrokerError(.failed, "Failed to send the reply: \(error.message)")
    }
}

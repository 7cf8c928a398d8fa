import BrokerProtocol
import BusKit

/// The one place internal failures become D-Bus error names: broker errors keep their
/// name; malformed arguments found by sd-bus become `InvalidArgument`.
func serve(_ body: @escaping (MethodCall) throws -> Void) -> InterfaceImplementation.MethodHandler {
    return { (call: MethodCall) throws(BusError) in
        do {
            try body(call)
        } catch let error as BrokerError {
            throw error.busError
        } catch let error as BusError {
            throw BrokerError.invalidArgument(error.message).busError
        } catch {
            throw BrokerError(.failed, "\(error)").busError
        }
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

import BusKit

/// Every refusal the broker can answer with. Each code is exactly one D-Bus error name,
/// `org.dragbroker.Broker1.Error.<Code>`; the client library decodes into the same type.
public enum BrokerErrorCode: String, CaseIterable, Sendable {
    /// The caller may not do this to this session or data.
    case accessDenied = "AccessDenied"
    /// No such session, token, item, representation or load (or not one visible to the caller).
    case notFound = "NotFound"
    /// An argument is malformed: the message says which and why.
    case invalidArgument = "InvalidArgument"
    /// The session is not in a state that allows this call (e.g. a load before the drop).
    case wrongState = "WrongState"
    /// A limit on sessions, items, strings or loads was reached.
    case limitExceeded = "LimitExceeded"
    /// A party did not answer in time.
    case timeout = "Timeout"
    /// The session or load was cancelled by one of its parties.
    case cancelled = "Cancelled"
    /// A party's bus connection went away.
    case disconnected = "Disconnected"
    /// The source's provider failed to produce the data.
    case providerFailed = "ProviderFailed"
    /// The broker itself failed; the message says how.
    case failed = "Failed"

    public var busName: String { BrokerNames.errorPrefix + rawValue }

    public init?(busName: String) {
        guard busName.hasPrefix(BrokerNames.errorPrefix) else { return nil }
        self.init(rawValue: String(busName.dropFirst(BrokerNames.errorPrefix.count)))
    }
}

public struct BrokerError: Error, Equatable, Sendable, CustomStringConvertible {
    public var code: BrokerErrorCode
    public var message: String
    /// The policy rule (`file:line`) that decided, kept for the daemon's audit; not sent on the wire.
    public var rule: String?

    public init(_ code: BrokerErrorCode, _ message: String) {
        self.code = code
        self.message = message
    }

    public var busError: BusError { BusError(name: code.busName, message: message) }
    public var description: String { "\(code.busName): \(message)" }

    /// Decodes a bus error: broker names map to their code, anything else (bus driver errors,
    /// disconnection) keeps its name in the message under `.failed` or `.disconnected`.
    public init(_ error: BusError) {
        if let code = BrokerErrorCode(busName: error.name) {
            self.init(code, error.message)
        } else if error.name == "org.freedesktop.DBus.Error.NoReply" || error.name == "org.freedesktop.DBus.Error.ServiceUnknown"
                    || error.name == "org.freedesktop.DBus.Error.Disconnected" || error.name.hasSuffix("ECONNRESET")
                    || error.name.hasSuffix("ENOTCONN") {
            self.init(.disconnected, "\(error.name): \(error.message)")
        } else if error.name == "org.freedesktop.DBus.Error.InvalidArgs" {
            self.init(.invalidArgument, error.message)
        } else {
            self.init(.failed, "\(error.name): \(error.message)")
        }
    }
}

extension BrokerError {
    public static func accessDenied(_ m: String) -> BrokerError { .init(.accessDenied, m) }
    public static func notFound(_ m: String) -> BrokerError { .init(.notFound, m) }
    public static func invalidArgument(_ m: String) -> BrokerError { .init(.invalidArgument, m) }
    public static func wrongState(_ m: String) -> BrokerError { .init(.wrongState, m) }
    public static func limitExceeded(_ m: String) -> BrokerError { .init(.limitExceeded, m) }
}

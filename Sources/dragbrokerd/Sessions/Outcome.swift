import BrokerProtocol

/// How a session ended, as the log, the journal and `dragctl` name it: typed until written.
enum SessionOutcome: String, Sendable {
    case completed
    case cancelled
    case timedOut = "timed-out"
    /// A pasteboard entry outlived its expiration.
    case expired
    case sourceDisconnected = "source-disconnected"
    case destinationDisconnected = "destination-disconnected"
    /// The daemon lost the bus: nobody could be told.
    case interrupted
}

/// How a load ended, as the log, the journal and monitors name it: typed until written.
enum LoadOutcome: String, Sendable {
    case completed
    case cancelled
    case timedOut = "timed-out"
    case disconnected
    case denied
    case failed
    case interrupted

    /// The outcome a load's error means, when nothing more precise was recorded.
    init(_ error: BrokerError?) {
        self = switch error?.code {
        case nil: .completed
        case .cancelled: .cancelled
        case .timeout: .timedOut
        case .disconnected: .disconnected
        case .accessDenied: .denied
        default: .failed
        }
    }
}

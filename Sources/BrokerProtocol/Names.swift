/// The names that make up the wire contract. The interface XML beside this file is the
/// published form; `Interfaces.swift` is the same contract as the member table the daemon
/// exports, and a test keeps the two equal.
public enum BrokerNames {
    /// The well-known bus name; the version suffix changes only with incompatible changes.
    public static let busName = "org.dragbroker.Broker1"
    public static let managerPath = "/org/dragbroker/Broker1"
    public static let managerInterface = "org.dragbroker.Broker1.Manager"
    public static let sessionInterface = "org.dragbroker.Broker1.Session"
    public static let providerInterface = "org.dragbroker.Provider1"
    public static let errorPrefix = "org.dragbroker.Broker1.Error."
    /// Where a source exports its provider on its own connection.
    public static let providerPathPrefix = "/org/dragbroker/Provider1/"

    /// What the window system's drag carries: the session's token, and nothing else.
    public static let dragTokenType = "application/vnd.dragbroker.token.v1"
    /// What the window system's clipboard carries for a pasteboard entry: its token. A type of
    /// its own, so that a target knows from the offer which act it performs (Enter and
    /// PerformDrop, or Paste) before it asks the broker anything.
    public static let pasteboardTokenType = "application/vnd.dragbroker.pasteboard.v1"

    /// The one function that turns a session ID into its object path.
    public static func sessionPath(id: String) -> String {
        "\(managerPath)/session/\(id)"
    }
}

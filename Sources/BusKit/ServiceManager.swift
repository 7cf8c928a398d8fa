import CSystemd

/// The service manager's notification socket (sd_notify(3)): readiness, status, stopping.
/// Without `$NOTIFY_SOCKET`, as outside systemd, a notification does nothing.
public enum ServiceManager {
    /// Sends newline-separated assignments such as `READY=1` or `STATUS=…`.
    public static func notify(_ state: String) {
        _ = shim_notify(state)
    }
}

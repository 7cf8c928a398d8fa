import BrokerProtocol
import BusKit
import Glibc

/// How the daemon sees a bus peer. Built only from kernel-verified credentials and /proc,
/// never from anything the peer sends.
struct AppIdentity: Equatable, Sendable {
    var uniqueName: String
    var pid: pid_t
    var uid: uid_t
    var executable: String
    var appID: String
    var team: String?
}

/// Resolves and caches identities per unique bus name; entries die with the connection.
final class IdentityResolver {
    private var cache: [String: AppIdentity] = [:]

    func identity(of call: MethodCall) throws(BrokerError) -> AppIdentity {
        if let known = cache[call.sender] { return known }
        let credentials: Credentials
        do {
            credentials = try call.bus.senderCredentials(of: call.message)
        } catch {
            throw BrokerError(.failed, "Failed to read the caller's credentials: \(error.message)")
        }
        let executable = Self.executable(of: credentials.pid) ?? "unknown"
        let identity = AppIdentity(uniqueName: credentials.uniqueName, pid: credentials.pid, uid: credentials.euid,
                                   executable: executable, appID: Self.fallbackAppID(executable: executable), team: nil)
        cache[call.sender] = identity
        return identity
    }

    func forget(_ uniqueName: String) {
        cache.removeValue(forKey: uniqueName)
    }

    /// The executable's path, without the " (deleted)" suffix the kernel adds for replaced files.
    static func executable(of pid: pid_t) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/\(pid)/exe", &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        var path = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        if path.hasSuffix(" (deleted)") { path.removeLast(" (deleted)".count) }
        return path
    }

    /// An app ID for an unregistered, unsandboxed executable: its path, which is what the
    /// kernel vouches for.
    static func fallbackAppID(executable: String) -> String {
        executable
    }
}

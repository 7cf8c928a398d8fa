import BusKit

/// How dragbrokerd identifies an app: from kernel-verified credentials and the
/// administrator's registry, never from what the app says about itself.
public struct BrokerIdentity: Sendable, Equatable, Codable {
    public var appID: String
    public var team: String?
    public var managed: Bool
    /// flatpak, snap, systemd-unit, registry or executable.
    public var source: String
    public var sandboxed: Bool
    public var executable: String
    public var pid: UInt32
    public var uid: UInt32

    init(_ fields: [String: VariantValue]) {
        appID = fields["AppID"]?.string ?? ""
        let team = fields["Team"]?.string ?? ""
        self.team = team.isEmpty ? nil : team
        managed = fields["Managed"]?.bool ?? false
        source = fields["Source"]?.string ?? ""
        sandboxed = fields["Sandboxed"]?.bool ?? false
        executable = fields["Executable"]?.string ?? ""
        pid = fields["PID"]?.uint32 ?? 0
        uid = fields["UID"]?.uint32 ?? 0
    }
}

/// dragbroker's version: `dragbrokerd --version`, `dragctl --version` and the manager's
/// `Version` property all say this. `debian/changelog`'s newest entry must agree, which
/// `make test` checks, so a release changes this line and adds that entry.
public enum BrokerVersion {
    public static let current = "0.1.0"
}

import BrokerProtocol
import BusKit
import Logging

/// Operators watching live events (`dragctl monitor`). Events are unicast to each monitor
/// that may inspect the session, never broadcast: a restricted session stays invisible.
final class Monitors {
    static let limit = 16
    private let bus: Bus
    private let logger: Logger
    private var watchers: [String: AppIdentity] = [:]

    init(bus: Bus, logger: Logger) {
        self.bus = bus
        self.logger = logger
    }

    func add(_ caller: AppIdentity) throws(BrokerError) {
        guard watchers[caller.uniqueName] != nil || watchers.count < Self.limit else {
            throw .limitExceeded("\(Self.limit) monitors are already watching")
        }
        guard !caller.isSandboxed else { throw .accessDenied("A sandboxed app may not monitor other apps' drags") }
        watchers[caller.uniqueName] = caller
    }

    func remove(_ uniqueName: String) {
        watchers.removeValue(forKey: uniqueName)
    }

    /// `MonitorEvent(session, event, detail, bytes, expected)`.
    func emit(_ session: Session, _ event: MonitorEventKind, _ detail: @autoclosure () -> String = "", bytes: UInt64 = 0, expected: UInt64 = 0) {
        guard !watchers.isEmpty, bus.isOpen else { return }
        let detail = detail()
        for (name, watcher) in watchers where session.mayBeInspected(by: watcher) {
            do {
                try bus.emitSignal(path: BrokerNames.managerPath, interface: BrokerNames.managerInterface,
                                   member: ManagerMember.monitorEvent.name, destination: name) { m throws(BusError) in
                    try m.append(session.id)
                    try m.append(event.rawValue)
                    try m.append(detail)
                    try m.append(bytes)
                    try m.append(expected)
                }
            } catch {
                logger.warning("Failed to send a monitor event to \(name): \(error), ignoring")
            }
        }
    }
}

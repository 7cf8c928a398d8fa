import BrokerPolicy
import BrokerProtocol
import BusKit
import Foundation
import Logging
import Synchronization
import SystemCalls
import TransferLog
import UniformTypes

/// dragbrokerd: holds live drag sessions on the bus and proxies dropped data.
struct Options {
    var address: String?
    var stateDirectory: String?
    var policyDirectory = "/etc/dragbroker"
    var exitIdleTime: UInt64?
    var auditQueueLimit = TransferLog.defaultQueueCapacity
    var retentionInterval = Daemon.defaultRetentionInterval

    static let usage = """
        Usage: dragbrokerd [--address ADDRESS] [--state-directory DIR] [--policy-directory DIR] [--exit-idle-time SEC]

        Brokers drag and drop between apps on the D-Bus session bus.

          --address ADDRESS        connect to this bus instead of the session bus
          --state-directory DIR    keep the transfer log in DIR
                                   (default: $STATE_DIRECTORY, else $XDG_STATE_HOME/dragbroker)
          --policy-directory DIR   read dragbroker.conf and dragbroker.conf.d/*.conf from DIR
                                   (default: /etc/dragbroker); reloaded on SIGHUP
          --exit-idle-time SEC     exit after SEC seconds (at most a year) without any session
                                   (for bus activation)
          --audit-queue-limit N    for tests: keep at most N records in memory while the transfer
                                   log cannot be written, counting any more as a gap (default 10000)
          --retention-interval SEC for tests: apply RetentionDays= again once SEC seconds have passed
                                   since it last ran, when sessions come or go (default 86400)
          --version                print the version and exit
          -h, --help               print this help and exit
        """

    /// The longest span a flag takes, a year: bounded, so its count in microseconds cannot overflow.
    static let maxSeconds: UInt64 = 365 * 24 * 3600

    static func parse(_ arguments: [String]) -> Options {
        var options = Options()
        var rest = arguments[...]
        func value(_ flag: String) -> String {
            guard let v = rest.popFirst() else { fail("\(flag) needs a value") }
            return v
        }
        func microseconds(_ flag: String) -> UInt64 {
            let text = value(flag)
            guard let seconds = UInt64(text), seconds > 0, seconds <= maxSeconds else {
                fail("\(flag) needs a positive number of seconds up to \(maxSeconds) (a year), not '\(text)'")
            }
            return seconds * 1_000_000
        }
        while let argument = rest.popFirst() {
            switch argument {
            case "--address": options.address = value(argument)
            case "--state-directory": options.stateDirectory = value(argument)
            case "--policy-directory": options.policyDirectory = value(argument)
            case "--exit-idle-time": options.exitIdleTime = microseconds(argument)
            case "--audit-queue-limit":
                let text = value(argument)
                guard let limit = Int(text), limit > 0 else { fail("--audit-queue-limit needs a positive number, not '\(text)'") }
                options.auditQueueLimit = limit
            case "--retention-interval": options.retentionInterval = microseconds(argument)
            case "--version": print("dragbrokerd \(BrokerVersion.current)"); exit(0)
            case "-h", "--help": print(usage); exit(0)
            default: fail("unknown argument '\(argument)'")
            }
        }
        return options
    }

    static func fail(_ message: String) -> Never {
        FileHandle.standardError.write(Data("dragbrokerd: \(message)\n\(usage)\n".utf8))
        exit(ExitStatus.usage)
    }
}

func stateDirectoryPath(_ options: Options) -> String {
    let environment = ProcessInfo.processInfo.environment
    if let directory = options.stateDirectory ?? environment["STATE_DIRECTORY"].flatMap({ $0.split(separator: ":").first.map(String.init) }) {
        return directory
    }
    return (TransferLog.defaultPath(environment: environment) as NSString).deletingLastPathComponent
}

/// How dragbrokerd exits, so a service manager can tell what to do next.
enum ExitStatus {
    static let failure: Int32 = 1
    static let usage: Int32 = 2
    /// The state on disk cannot be used as it is (unsafe, damaged, or from a newer version):
    /// starting again cannot help until an administrator acts, so the unit does not restart
    /// on it (`RestartPreventExitStatus=`). EX_DATAERR in sysexits.h.
    static let stateUnusable: Int32 = 65
}

/// Whether a failure to open the state means the files themselves cannot be used, as opposed
/// to a moment's trouble (a full disk, an I/O error) that a restart may outlast.
func stateIsUnusable(_ error: any Error) -> Bool {
    switch error {
    case let error as StateDirectoryError:
        if case .unsafe = error { return true }
        return false
    case let error as TransferLogError:
        switch error {
        case .newerSchema, .unsupportedSchema: return true
        default: return false
        }
    case let error as InFlightLedger.OpenError:
        return error.stateUnusable
    default:
        return TransferLog.meansDamagedFile(error)
    }
}

func runDaemon() -> Int32 {
    let options = Options.parse(Array(CommandLine.arguments.dropFirst()))
    // Under journald, structured entries; elsewhere, plain lines on stderr.
    if Journal.isConnected {
        LoggingSystem.bootstrap { JournalLogHandler(label: $0) }
    } else {
        LoggingSystem.bootstrap { StreamLogHandler.standardError(label: $0) }
    }
    var logger = Logger(label: "dragbrokerd")
    logger.logLevel = ProcessInfo.processInfo.environment["DRAGBROKER_DEBUG"] == nil ? .info : .debug

    // A peer that closes its pipe must cost an EPIPE, never the daemon.
    Kernel.ignoreSIGPIPE()
    // Opened once, now, rather than at the first handed-over file: how memfds are told from
    // tmpfs files, and where a client's descriptor number is pointed once taken.
    guard Kernel.memoryFileDevice != nil, Kernel.nullDevice != nil else {
        logger.critical("Failed to start: no memfd could be made, or /dev/null could not be opened")
        return 1
    }
    // Signals arrive through the loop; block them before any other thread exists.
    SignalWatch.block([SIGTERM, SIGINT, SIGHUP])
    // Every load holds descriptors: take all the kernel allows, and bound the loads by it.
    var descriptorLimit: Int?
    do {
        let (soft, hard) = try Kernel.raiseDescriptorLimit()
        descriptorLimit = Int(clamping: soft)
        logger.debug("Descriptor limit \(soft) (hard limit \(hard))")
    } catch {
        logger.warning("Failed to read or raise the descriptor limit: \(error), ignoring")
    }
    do {
        let policy: Policy
        do {
            policy = try Daemon.loadPolicy(directory: options.policyDirectory)
        } catch {
            logger.critical("Failed to load the policy: \(error)")
            return 1
        }
        let loop = try EventLoop()
        let statePath = stateDirectoryPath(options)
        let path = TransferLog.path(inStateDirectory: statePath)
        func refuseToStart(_ what: String, _ error: any Error) -> Int32 {
            guard stateIsUnusable(error) else {
                logger.critical("Failed to open \(what): \(error)")
                return ExitStatus.failure
            }
            logger.critical("""
                Failed to open \(what): \(error). The state on disk cannot be used, so dragbrokerd will not start until it is \
                fixed (exit status \(ExitStatus.stateUnusable), which its unit does not restart on): fix the ownership and \
                modes of the state directory \(statePath) and its files, or move the file named aside, then start it again
                """)
            return ExitStatus.stateUnusable
        }
        let stateDirectory: StateDirectory
        do {
            stateDirectory = try StateDirectory(path: statePath)
        } catch {
            return refuseToStart("the state directory", error)
        }
        // The ledger's lock makes this daemon the only one on the state directory before
        // anything there is read as left behind by a daemon that died.
        let ledger: InFlightLedger
        do {
            ledger = try InFlightLedger(directory: stateDirectory)
        } catch {
            return refuseToStart("the in-flight ledger", error)
        }
        let transferLog: TransferLog
        do {
            transferLog = try TransferLog(directory: stateDirectory, queueCapacity: options.auditQueueLimit) { event in
                AuditSink.log(event, to: Logger(label: "dragbrokerd"))
            }
        } catch {
            return refuseToStart("the transfer log", error)
        }
        logOpening(of: ledger, logger: logger)
        // What a daemon that died mid-transfer left open is closed first, as interrupted: every
        // party heard that the broker went away. Nothing of this run is on record yet.
        let leftBehind = ledger.leftBehind()
        transferLog.closeOpenRecords(errorName: BrokerErrorCode.disconnected.busName, inFlight: leftBehind.loads) { [logger] result in
            switch result {
            case .success(let recovery):
                ledger.forget(leftBehind.slots)
                guard recovery.sessions + recovery.loads > 0 else { break }
                logger.warning("""
                    Recorded \(recovery.sessions) session(s) and \(recovery.loads) load(s) left open by an unclean exit as \
                    interrupted, each ending at its last checkpoint (\(recovery.endedAtCheckpoint)) or, with none, at its start \
                    (\(recovery.endedAtStart))
                    """)
            case .failure(let error):
                logger.error("Failed to close the records an unclean exit left open: \(error); they stay open until the next start")
            }
        }
        // Session IDs continue after every number ever handed out: the log's highest, and the
        // ledger's marks, read on the log's own queue while the bus connects; nothing is
        // served before they are known.
        let numbering = Mutex<Result<TransferLog.SessionNumbering, any Error>>(.success(.init(highest: 0, outOfRange: 0)))
        let numberingRead = DispatchSemaphore(value: 0)
        transferLog.sessionNumbering(prefix: Registry.sessionIDPrefix, ceiling: TransferLog.sessionNumberCeiling) { result in
            numbering.withLock { $0 = result }
            numberingRead.signal()
        }
        let address = options.address ?? ProcessInfo.processInfo.environment["DRAGBROKER_BUS_ADDRESS"]
        let bus = try Bus.connect(address: address, loop: loop, description: "dragbrokerd")
        numberingRead.wait()
        let sessionNumbers: SessionNumbers
        do {
            sessionNumbers = try startNumbering(after: numbering.withLock { try $0.get() }, ledger: ledger, log: transferLog, logger: logger)
        } catch {
            logger.critical("Failed to read the last session ID from the transfer log: \(error)")
            return ExitStatus.failure
        }
        do {
            try sessionNumbers.prepare()
        } catch {
            logger.critical("Failed to record session IDs in \(ledger.path): \(error)")
            return ExitStatus.failure
        }
        let daemon = Daemon(bus: bus, transferLog: transferLog, ledger: ledger, policy: policy, policyDirectory: options.policyDirectory,
                            types: MimeDatabase.system, sessionNumbers: sessionNumbers, logger: logger)
        daemon.registry.descriptorLimit = descriptorLimit
        try daemon.start()
        daemon.applyRetention()
        // sd-bus closes the connection when the loop exits: end sessions while it still works.
        let terminate = { [logger] in
            logger.info("Received a termination signal, ending sessions")
            daemon.shutdown()
            loop.exit()
        }
        daemon.idleExit = options.exitIdleTime
        daemon.retentionInterval = options.retentionInterval
        daemon.onIdle = {
            // Give the name back first, so the next caller activates a new daemon.
            try? bus.releaseName(BrokerNames.busName)
            daemon.shutdown()
            loop.exit()
        }
        var status: Int32 = 0
        let busWatch = try bus.onDisconnect {
            daemon.busLost()
            status = 1
            loop.exit(code: 1)
        }
        var watches = try [SIGTERM, SIGINT].map { signal throws(BusError) in try SignalWatch(loop: loop, signal: signal, callback: terminate) }
        watches.append(try SignalWatch(loop: loop, signal: SIGHUP) {
            logger.info("Received SIGHUP, reloading the policy")
            try? daemon.reloadPolicy()
        })
        try bus.requestName(BrokerNames.busName)
        logger.info("Serving \(BrokerNames.busName) as \(bus.uniqueName); transfer log at \(path)")
        // Ready only now that the name is ours: activation waits for exactly this.
        ServiceManager.notify("READY=1\nSTATUS=Serving \(BrokerNames.busName), no live session")
        loop.enableWatchdog()
        daemon.armIdleTimer()
        try loop.run()
        withExtendedLifetime((watches, busWatch)) {}
        return status
    } catch {
        logger.critical("Failed to start: \(error)")
        return ExitStatus.failure
    }
}

/// What the ledger was found as, when it was anything but a ledger of this version.
func logOpening(of ledger: InFlightLedger, logger: Logger) {
    let opening = ledger.opening
    if opening.migrated {
        logger.notice("Moved the in-flight ledger \(ledger.path) to this version's format, keeping its slots")
    }
    if let why = opening.damaged {
        logger.warning("""
            The in-flight ledger \(ledger.path) could not be trusted (\(why)): kept it as \(InFlightLedger.damagedName) and \
            started a new one; \(opening.recovered) load(s) left running could still be read from it and will be recorded \
            as interrupted
            """)
    }
    if opening.unreadableSlots > 0 {
        logger.warning("""
            Cleared \(opening.unreadableSlots) slot(s) of the in-flight ledger \(ledger.path) whose contents were out of range: \
            the loads they stood for, if any, cannot be recorded
            """)
    }
}

/// The first session number of this run, past the log's highest and the ledger's marks; says
/// what the log lost, and records it as a gap.
func startNumbering(after log: TransferLog.SessionNumbering, ledger: InFlightLedger, log transferLog: TransferLog,
                    logger: Logger) -> SessionNumbers {
    if log.outOfRange > 0 {
        logger.warning("Ignoring \(log.outOfRange) session ID(s) in the transfer log past s\(SessionNumbers.ceiling - 1), which dragbrokerd never hands out: the log was changed by something else")
    }
    func inRange(_ mark: UInt64, _ name: String) -> UInt64 {
        guard mark >= SessionNumbers.ceiling else { return mark }
        logger.warning("Ignoring the \(name) session number in \(ledger.path), \(mark), which is past any dragbrokerd hands out")
        return 0
    }
    let issued = inRange(ledger.issuedSessionNumber, "last handed out")
    let reserved = inRange(ledger.reservedSessionNumber, "reserved")
    let highest = UInt64(log.highest)
    if issued > highest {
        let lost = issued - highest
        let reason = "the log lost \(lost) session(s), s\(highest + 1) to s\(issued), which were handed out but not on disk when the previous daemon stopped (a crash or power cut before they were synced, or a damaged write-ahead log)"
        logger.warning("The transfer log has no record of \(lost) session(s) after s\(highest), up to s\(issued): \(reason)")
        transferLog.recordGap(lost: Int64(lost), reason: reason) { [logger] result in
            switch result {
            case .success(let gap): AuditSink.log(.gapRecorded(gap), to: logger)
            case .failure(let error): logger.error("Failed to record the lost sessions as a gap: \(error)")
            }
        }
    }
    return SessionNumbers(next: max(highest, issued, reserved) + 1, reserved: reserved, store: ledger)
}

exit(runDaemon())

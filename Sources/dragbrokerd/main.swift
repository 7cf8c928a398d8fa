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

    static let usage = """
        Usage: dragbrokerd [--address ADDRESS] [--state-directory DIR] [--policy-directory DIR] [--exit-idle-time SEC]

        Brokers drag and drop between apps on the D-Bus session bus.

          --address ADDRESS        connect to this bus instead of the session bus
          --state-directory DIR    keep the transfer log in DIR
                                   (default: $STATE_DIRECTORY, else $XDG_STATE_HOME/dragbroker)
          --policy-directory DIR   read dragbroker.conf and dragbroker.conf.d/*.conf from DIR
                                   (default: /etc/dragbroker); reloaded on SIGHUP
          --exit-idle-time SEC     exit after SEC seconds without any session (for bus activation)
          --audit-queue-limit N    for tests: keep at most N records in memory while the transfer
                                   log cannot be written, counting any more as a gap (default 10000)
          --version                print the version and exit
          -h, --help               print this help and exit
        """

    static func parse(_ arguments: [String]) -> Options {
        var options = Options()
        var rest = arguments[...]
        func value(_ flag: String) -> String {
            guard let v = rest.popFirst() else { fail("\(flag) needs a value") }
            return v
        }
        while let argument = rest.popFirst() {
            switch argument {
            case "--address": options.address = value(argument)
            case "--state-directory": options.stateDirectory = value(argument)
            case "--policy-directory": options.policyDirectory = value(argument)
            case "--exit-idle-time":
                let text = value(argument)
                guard let seconds = UInt64(text), seconds > 0 else { fail("--exit-idle-time needs a positive number of seconds, not '\(text)'") }
                options.exitIdleTime = seconds * 1_000_000
            case "--audit-queue-limit":
                let text = value(argument)
                guard let limit = Int(text), limit > 0 else { fail("--audit-queue-limit needs a positive number, not '\(text)'") }
                options.auditQueueLimit = limit
            case "--version": print("dragbrokerd \(BrokerVersion.current)"); exit(0)
            case "-h", "--help": print(usage); exit(0)
            default: fail("unknown argument '\(argument)'")
            }
        }
        return options
    }

    static func fail(_ message: String) -> Never {
        FileHandle.standardError.write(Data("dragbrokerd: \(message)\n\(usage)\n".utf8))
        exit(2)
    }
}

func transferLogPath(_ options: Options) -> String {
    let environment = ProcessInfo.processInfo.environment
    if let directory = options.stateDirectory ?? environment["STATE_DIRECTORY"].flatMap({ $0.split(separator: ":").first.map(String.init) }) {
        return TransferLog.path(inStateDirectory: directory)
    }
    return TransferLog.defaultPath(environment: environment)
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
        let path = transferLogPath(options)
        let transferLog = try TransferLog(path: path, queueCapacity: options.auditQueueLimit) { event in
            AuditSink.log(event, to: Logger(label: "dragbrokerd"))
        }
        // The ledger's lock makes this daemon the only one on the state directory before
        // anything there is read as left behind by a daemon that died.
        let ledger: InFlightLedger
        do {
            ledger = try InFlightLedger(directory: (path as NSString).deletingLastPathComponent)
        } catch {
            logger.critical("Failed to open the in-flight ledger: \(error)")
            return 1
        }
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
        // Session IDs continue after the log's highest, read on the log's own queue while the
        // bus connects; nothing is served before it is known.
        let highest = Mutex<Result<Int, any Error>>(.success(0))
        let highestRead = DispatchSemaphore(value: 0)
        transferLog.highestSessionNumber(prefix: Registry.sessionIDPrefix) { result in
            highest.withLock { $0 = result }
            highestRead.signal()
        }
        let address = options.address ?? ProcessInfo.processInfo.environment["DRAGBROKER_BUS_ADDRESS"]
        let bus = try Bus.connect(address: address, loop: loop, description: "dragbrokerd")
        highestRead.wait()
        var firstSessionNumber = 1
        do {
            firstSessionNumber = try highest.withLock { try $0.get() } + 1
        } catch {
            logger.warning("Failed to read the last session ID from the transfer log: \(error), numbering from 1")
        }
        let daemon = Daemon(bus: bus, transferLog: transferLog, ledger: ledger, policy: policy, policyDirectory: options.policyDirectory,
                            types: MimeDatabase.system, firstSessionNumber: firstSessionNumber, logger: logger)
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
        return 1
    }
}

exit(runDaemon())

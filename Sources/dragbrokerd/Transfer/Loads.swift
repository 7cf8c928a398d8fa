import BrokerPolicy
import BrokerProtocol
import BusKit
import CSystemd
import Foundation
import TransferLog
import UniformTypes

/// Loads: the only way bytes move. A data load streams the source's pipe into the
/// destination's through `PipeProxy`; a file load hands the source's read-only file or
/// sealed memfd to the destination. Every load has progress, a first-byte and a stall
/// deadline, can be cancelled by either side or an administrator, and is audited.
extension Broker {
    /// Checks a load request and starts it. For data, `reply` gets the pipe at once; for a
    /// file, once the source has handed it over.
    func load(item: UInt32, type: String, by caller: AppIdentity, in session: Session,
              reply: @escaping (Result<(fd: Int32, id: UInt32, kind: RepresentationKind), BrokerError>) -> Void) throws(BrokerError) {
        switch session.state {
        case .active:
            throw .wrongState("Loads are allowed only after PerformDrop")
        case .concluded:
            throw .wrongState("Session \(session.id) was concluded: no new loads")
        case .dropped:
            break
        }
        guard caller.uniqueName == session.dropDestination else {
            throw .accessDenied("Only the destination that performed the drop may load from session \(session.id)")
        }
        let visible = session.visibleItems(for: caller)
        guard Int(item) < visible.count else {
            throw .notFound("No item \(item): session \(session.id) has \(visible.count) item(s)")
        }
        let canonical: String
        do {
            canonical = try TypeIdentifier(type).mime
        } catch {
            throw .invalidArgument(error.message)
        }
        let realItem = visible[Int(item)].index
        guard visible[Int(item)].item.typeIdentifiers.contains(canonical),
              let representation = session.items[realItem].representations.first(where: { $0.typeIdentifier == canonical }) else {
            throw .notFound("Item \(item) has no representation of type '\(canonical)'")
        }
        let conforms: (String, String) -> Bool = { [types] type, pattern in
            (try? TypeIdentifier(type)).map { types.conforms($0, to: pattern) } ?? false
        }
        let decision = policy.decide(from: party(session.source), to: party(caller), type: canonical, size: nil, conforms: conforms)
        if decision.action == .deny {
            var error = BrokerError.accessDenied(
                "The administrator's policy forbids \(canonical) from \(session.source.appID) to \(caller.appID) (rule at \(decision.rule.map { "\($0.origin)" } ?? "?"))")
            error.rule = decision.rule.map { "\($0.origin)" }
            throw error
        }
        guard session.loads.count < limits.concurrentLoadsPerSession else {
            throw .limitExceeded("Session \(session.id) already has \(session.loads.count) loads in flight")
        }
        // Records are written off the bus path, so "cannot be written" is known from the
        // batches before this one: while they fail, fail-closed refuses new transfers.
        if policy.audit.failClosed, transferLog.isFailing {
            throw BrokerError(.failed, "The transfer log cannot record transfers right now, and the policy refuses transfers it cannot audit (FailClosed=yes)")
        }
        let load = Load(id: session.nextLoadID, item: UInt32(realItem), typeIdentifier: canonical, kind: representation.kind,
                        destination: caller, now: Self.monotonicNow())
        session.nextLoadID += 1
        switch representation.kind {
        case .data:
            let sizeRule = policy.byteLimit(from: party(session.source), to: party(caller), type: canonical, conforms: conforms)
            let fd = try startDataLoad(load, in: session, sizeRule: sizeRule)
            session.loads[load.id] = load
            // The reply carries a duplicate; the destination's end must not stay open here.
            defer { close(fd) }
            reply(.success((fd, load.id, .data)))
        case .file:
            try startFileLoad(load, in: session, reply: reply)
            session.loads[load.id] = load
        }
        armDeadline(load, in: session, after: limits.firstByteTimeout)
        monitors.emit(session, "load", "\(load.id) \(canonical) (\(representation.kind.rawValue)) to \(caller.appID)")
    }

    private func startDataLoad(_ load: Load, in session: Session, sizeRule: (limit: UInt64, rule: FlowRule)?) throws(BrokerError) -> Int32 {
        let proxy = try PipeProxy(loop: bus.loop) { [unowned self, unowned session] (outcome: PipeProxy.Outcome) in
            switch outcome {
            case .endOfData:
                load.dataEnded = true
                if load.providerAnswered { finishLoad(load, in: session, error: nil) }
            case .destinationClosed:
                finishLoad(load, in: session, error: BrokerError(.cancelled, "The destination closed its end of the load"))
            case .limitExceeded:
                var error = BrokerError.accessDenied(
                    "The administrator's policy forbids more than \(sizeRule?.limit ?? 0) bytes of \(load.typeIdentifier) from \(session.source.appID) to \(load.destination.appID) (rule at \(sizeRule.map { "\($0.rule.origin)" } ?? "?"))")
                error.rule = sizeRule.map { "\($0.rule.origin)" }
                finishLoad(load, in: session, error: error)
            case .failed(let reason):
                finishLoad(load, in: session, error: BrokerError(.failed, reason))
            }
        }
        proxy.byteLimit = sizeRule?.limit
        proxy.onProgress = { [unowned self, unowned session] in progressed(load, in: session) }
        load.proxy = proxy
        defer { close(proxy.sourceEnd) }
        do {
            let call = try providerCall(session, load, member: "Provide")
            try call.append(fileDescriptor: proxy.sourceEnd)
            // The reply says the source wrote everything (or why it failed); deadlines are ours.
            load.providerCall = try bus.callAsync(call, timeout: UInt64.max) { [unowned self, unowned session] result in
                load.providerCall = nil
                switch result {
                case .success:
                    load.providerAnswered = true
                    if load.dataEnded { finishLoad(load, in: session, error: nil) }
                case .failure(let error):
                    finishLoad(load, in: session, error: Self.providerError(error, source: session.source))
                }
            }
        } catch {
            close(proxy.destinationEnd)
            throw BrokerError(.failed, "Failed to ask the source for the data: \(error.message)")
        }
        return proxy.destinationEnd
    }

    private func startFileLoad(_ load: Load, in session: Session,
                               reply: @escaping (Result<(fd: Int32, id: UInt32, kind: RepresentationKind), BrokerError>) -> Void) throws(BrokerError) {
        do {
            let call = try providerCall(session, load, member: "ProvideFile")
            load.providerCall = try bus.callAsync(call, timeout: UInt64.max) { [unowned self, unowned session] result in
                load.providerCall = nil
                switch result {
                case .success(let message):
                    do {
                        let handed = try message.readFileDescriptor()
                        defer { close(handed) }
                        let (fd, size) = try Self.checkedFile(handed)
                        load.fileSize = size
                        reply(.success((fd, load.id, .file)))
                        close(fd)
                        finishLoad(load, in: session, error: nil)
                    } catch let error as BrokerError {
                        reply(.failure(error))
                        finishLoad(load, in: session, error: error)
                    } catch {
                        let failure = BrokerError(.providerFailed, "The source's answer carried no file: \(error)")
                        reply(.failure(failure))
                        finishLoad(load, in: session, error: failure)
                    }
                case .failure(let error):
                    let failure = Self.providerError(error, source: session.source)
                    reply(.failure(failure))
                    finishLoad(load, in: session, error: failure)
                }
            }
        } catch {
            throw BrokerError(.failed, "Failed to ask the source for the file: \(error.message)")
        }
        // Should the load end another way (cancel, timeout, disconnect), the waiting caller hears why.
        load.onAbandoned = { error in reply(.failure(error)) }
    }

    private func providerCall(_ session: Session, _ load: Load, member: String) throws(BusError) -> Message {
        let call = try bus.newMethodCall(destination: session.source.uniqueName, path: session.providerPath,
                                         interface: BrokerNames.providerInterface, member: member)
        try call.append(objectPath: session.path)
        try call.append(load.item)
        try call.append(load.typeIdentifier)
        try call.append(load.id)
        return call
    }

    /// A file handed over must be a read-only regular file or a memfd sealed against writing,
    /// growing and shrinking, so what the destination reads is what the source offered.
    /// Returns a fresh read-only descriptor (its own file offset) and the size.
    static func checkedFile(_ fd: Int32) throws(BrokerError) -> (fd: Int32, size: UInt64) {
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            throw BrokerError(.providerFailed, "The source handed over a descriptor that cannot be examined: \(String(cString: strerror(errno)))")
        }
        switch info.st_mode & S_IFMT {
        case S_IFREG: break
        case S_IFDIR: throw BrokerError(.providerFailed, "The source handed over a directory, not a file")
        case S_IFSOCK: throw BrokerError(.providerFailed, "The source handed over a socket, not a file")
        case S_IFIFO: throw BrokerError(.providerFailed, "The source handed over a pipe, not a file: use a data representation to stream")
        default: throw BrokerError(.providerFailed, "The source handed over something that is not a regular file")
        }
        let seals = shim_get_seals(fd)
        if seals >= 0 {
            let required = shim_seal_write() | shim_seal_grow() | shim_seal_shrink()
            guard seals & required == required else {
                throw BrokerError(.providerFailed, "The source handed over a memfd without write, grow and shrink seals")
            }
        } else {
            let flags = fcntl(fd, F_GETFL)
            guard flags >= 0, flags & O_ACCMODE == O_RDONLY else {
                throw BrokerError(.providerFailed, "The source handed over a file open for writing: open it read-only, or pass a sealed memfd")
            }
        }
        let fresh = open("/proc/self/fd/\(fd)", O_RDONLY | O_CLOEXEC)
        guard fresh >= 0 else {
            throw BrokerError(.providerFailed, "Failed to reopen the handed-over file read-only: \(String(cString: strerror(errno)))")
        }
        return (fresh, UInt64(info.st_size))
    }

    static func providerError(_ error: BusError, source: AppIdentity) -> BrokerError {
        if let code = BrokerErrorCode(busName: error.name), code == .cancelled {
            return BrokerError(.cancelled, "The source cancelled the load: \(error.message)")
        }
        // The bus answers for a source that died with the call pending; say so the way the
        // session's end will, whichever of the two the daemon hears first.
        if ["org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.ServiceUnknown",
            "org.freedesktop.DBus.Error.NameHasNoOwner", "org.freedesktop.DBus.Error.Disconnected"].contains(error.name) {
            return BrokerError(.disconnected, "The source app \(source.appID) disconnected")
        }
        return BrokerError(.providerFailed, "The source failed to provide the data: \(error.name): \(error.message)")
    }

    // MARK: Progress and deadlines

    static func monotonicNow() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1_000
    }

    /// Bytes moved: the stall deadline restarts, and both ends hear of it at most every 50 ms.
    func progressed(_ load: Load, in session: Session) {
        let now = Self.monotonicNow()
        load.lastProgressAt = now
        if now - load.lastReportAt >= 50_000 {
            load.lastReportAt = now
            session.object?.emitLoadProgress(load)
            monitors.emit(session, "progress", "\(load.id) \(load.typeIdentifier)", bytes: load.bytes, expected: load.expected ?? 0)
        }
    }

    /// One timer per load: it fires at the earliest deadline and re-arms while bytes move.
    func armDeadline(_ load: Load, in session: Session, after delay: UInt64) {
        load.deadline = try? LoopTimer(loop: bus.loop, afterMicroseconds: delay) { [unowned self, unowned session] in
            guard session.loads[load.id] != nil else { return }
            let now = Self.monotonicNow()
            if load.bytes == 0 && !load.dataEnded && load.kind == .data || load.kind == .file {
                finishLoad(load, in: session, error: BrokerError(.timeout,
                    "The source produced nothing within \(limits.firstByteTimeout / 1_000_000) s (first-byte deadline)"))
            } else if now - load.lastProgressAt >= limits.stallTimeout {
                let who = load.proxy?.destinationIsFull == true ? "the destination stopped reading" : "the source stopped sending"
                finishLoad(load, in: session, error: BrokerError(.timeout,
                    "The load made no progress for \(limits.stallTimeout / 1_000_000) s: \(who) (stall deadline)"))
            } else {
                armDeadline(load, in: session, after: load.lastProgressAt + limits.stallTimeout - now)
            }
        }
    }

    /// The source announces how many bytes a data load will carry.
    func setExpectedSize(_ size: UInt64, load id: UInt32, by caller: AppIdentity, in session: Session) throws(BrokerError) {
        guard caller.uniqueName == session.source.uniqueName else {
            throw .accessDenied("Only the source of session \(session.id) may announce a load's size")
        }
        guard let load = session.loads[id] else {
            // The announcement raced the end of the load: nothing left to tell.
            if id > 0 && id < session.nextLoadID { return }
            throw .notFound("No load \(id) in session \(session.id)")
        }
        load.expected = size
        session.object?.emitLoadProgress(load)
    }

    /// Either end, or an administrator, cancels a load; the other side hears `Cancelled`.
    func cancelLoad(_ id: UInt32, by caller: AppIdentity, in session: Session, asAdministrator: Bool = false) throws(BrokerError) {
        guard let load = session.loads[id] else { throw .notFound("No load \(id) in flight in session \(session.id)") }
        let who: String
        if asAdministrator {
            who = "An administrator"
        } else if caller.uniqueName == load.destination.uniqueName {
            who = "The destination"
        } else if caller.uniqueName == session.source.uniqueName {
            who = "The source"
        } else {
            throw .accessDenied("Only the load's destination, the session's source or an administrator may cancel load \(id)")
        }
        finishLoad(load, in: session, error: BrokerError(.cancelled, "\(who) cancelled load \(id)"))
    }

    // MARK: Ending

    func finishLoad(_ load: Load, in session: Session, error: BrokerError?) {
        guard session.loads.removeValue(forKey: load.id) != nil else { return }
        load.providerCall = nil
        load.deadline = nil
        let bytes = load.bytes
        load.proxy?.stop()
        load.proxy = nil
        if let error, let abandoned = load.onAbandoned { abandoned(error) }
        load.onAbandoned = nil
        session.finishedBytes += bytes
        session.object?.emitLoadFinished(load, bytes: bytes, error: error)
        let record = LoadRecord(
            id: nil, sessionID: session.id, sourceApp: session.source.appID, destinationApp: load.destination.appID,
            typeIdentifier: load.typeIdentifier, bytes: Int64(bytes), startedAt: load.startedAt, endedAt: Date(),
            outcome: Self.outcome(of: error), errorName: error?.code.busName,
            sourceTeam: session.source.team, destinationTeam: load.destination.team)
        transferLog.submit(.load(record))
        AuditJournal.record(record)
        monitors.emit(session, "loaded", "\(load.id) \(load.typeIdentifier) \(record.outcome)", bytes: bytes, expected: load.expected ?? bytes)
        if let error {
            logger.notice("Load \(load.id) of session \(session.id) (\(load.typeIdentifier)) failed after \(bytes) bytes: \(error)")
        } else {
            logger.info("Load \(load.id) of session \(session.id) (\(load.typeIdentifier), \(load.kind.rawValue)) delivered \(bytes) bytes")
        }
        if session.state == .concluded && session.loads.isEmpty { finishTransfer(session) }
    }

    static func outcome(of error: BrokerError?) -> String {
        switch error?.code {
        case nil: "completed"
        case .cancelled: "cancelled"
        case .timeout: "timed-out"
        case .disconnected: "disconnected"
        case .accessDenied: "denied"
        default: "failed"
        }
    }
}

import BrokerProtocol
import BusKit
import SystemCalls

/// What a `Load` call is answered with once its load is on record and under way: the
/// destination's descriptor, the load's ID and its kind.
struct LoadHandover {
    let descriptor: FileDescriptor
    let load: UInt32
    let kind: RepresentationKind
    /// Called with the sent reply: sd-bus would close the reply's own copy of a source's file
    /// on the loop, so that copy is retired off the loop once written out.
    let replied: (Message) -> Void
}

extension Daemon {
    /// One `Load` call, from request to handover, in the order it happens: the session checks
    /// the request against its state, visibility and the policy; the fair shares admit it, and
    /// a file load's descriptor thread; the session opens the load, which puts it on record
    /// (`AuditSink`); and it starts. Data loads are handed over with a pipe at once, file
    /// loads once the source handed the file over; both only once on record (fail-closed: once
    /// its start record committed, and a record that cannot refuses the load). The face parses
    /// the call and answers with what `answer` gets.
    func startLoad(item: UInt32, type: String, in session: Session, by caller: AppIdentity,
                   answer: @escaping (Result<LoadHandover, BrokerError>) -> Void) throws {
        let descriptors = descriptors
        let source = LoadSource(bus: bus, sessionPath: session.path, app: session.source, providerPath: session.providerPath,
                                limits: { [unowned self] in registry.limits }, descriptors: descriptors,
                                afterReplies: dispatcher.afterReplies)
        let load = try session.openLoad(item: item, type: type, by: caller, rules: loadRules) { request throws(BrokerError) in
            try registry.admitLoad(in: session, to: caller)
            if request.kind == .file {
                try descriptors.workers.admit(owners: source.owners, HandedFile.work)
            }
        }
        do {
            try load.start(from: source) { started in
                answer(started.map { descriptor, kind in
                    LoadHandover(descriptor: descriptor, load: load.id, kind: kind) { sent in
                        guard kind == .file else { return }
                        try? sent.rewind()
                        if let number = try? sent.readBorrowedFileDescriptor() {
                            descriptors.retire(sent: sent, number: number, owners: source.owners)
                        }
                    }
                })
            }
        } catch {
            load.stop(BrokerError(.failed, "dragbrokerd failed to start the load: \(error)"))
            throw error
        }
    }
}

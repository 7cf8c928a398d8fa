import BrokerProtocol
import BusKit
import Foundation
import Glibc

/// Experiment: a destination without the client library, straight on BusKit, to tell the
/// library's cost from the daemon's.
actor RawDestination {
    let loop: EventLoop
    let bus: Bus
    var session = ""
    var broker = ""

    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    init(address: String) throws(BusError) {
        let loop = try EventLoop()
        bus = try Bus.connect(address: address, loop: loop, description: "dragbroker-bench-raw")
        loop.start(name: "dragbroker-bench-raw")
        self.loop = loop
    }

    /// Stops the loop, as `EchoClient.close()` does.
    nonisolated func close() {
        loop.stop()
    }

    func call(_ path: String, _ interface: String, _ member: String, _ build: (Message) throws(BusError) -> Void = { _ in }) async throws(BusError) -> Message {
        let m = try bus.newMethodCall(destination: broker, path: path, interface: interface, member: member)
        try build(m)
        return try await bus.call(m)
    }

    func join(token: String, drop: Bool = true) async throws(BusError) {
        broker = try await bus.nameOwner(BrokerNames.busName)
        let reply = try await call(BrokerNames.managerPath, BrokerNames.managerInterface, "PresentToken") { m throws(BusError) in try m.append(token) }
        session = try reply.readObjectPath()
        _ = try await call(session, BrokerNames.sessionInterface, "Enter") { m throws(BusError) in try m.append("copy") }
        if drop { _ = try await call(session, BrokerNames.sessionInterface, "PerformDrop") }
    }

    /// An Update round trip with the copy proposal.
    func update() async throws(BusError) {
        let reply = try await call(session, BrokerNames.sessionInterface, "Update") { m throws(BusError) in try m.append("copy") }
        _ = try reply.readString()
    }

    /// Load: the pipe's read end (or the file), owned by the caller.
    func load(_ type: String) async throws(BusError) -> Int32 {
        let reply = try await call(session, BrokerNames.sessionInterface, "Load") { m throws(BusError) in
            try m.append(UInt32(0))
            try m.append(type)
        }
        return try reply.readFileDescriptor()
    }
}

/// CPU time and page faults of this process and of the two children, around one run.
struct Usage {
    var cpu: [String: Double] = [:]
    var minorFaults: Int = 0
    var contextSwitches: Int = 0

    static func now(daemon: pid_t, source: pid_t) -> Usage {
        var usage = Usage()
        var self_ = rusage()
        getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &self_)
        usage.cpu["destination"] = Double(self_.ru_utime.tv_sec + self_.ru_stime.tv_sec)
            + Double(self_.ru_utime.tv_usec + self_.ru_stime.tv_usec) / 1e6
        usage.minorFaults = self_.ru_minflt
        usage.contextSwitches = self_.ru_nvcsw + self_.ru_nivcsw
        usage.cpu["daemon"] = processCPU(daemon)
        usage.cpu["source"] = processCPU(source)
        return usage
    }

    /// utime + stime from /proc/PID/stat, in seconds.
    static func processCPU(_ pid: pid_t) -> Double {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = text.lastIndex(of: ")") else { return .nan }
        let fields = text[text.index(after: close)...].split(separator: " ")
        // After the command: state is field 3, utime 14, stime 15.
        guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return .nan }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    func delta(from start: Usage) -> String {
        let cpuText = ["source", "daemon", "destination"].map { "\($0) \(format((cpu[$0] ?? .nan) - (start.cpu[$0] ?? .nan), 2)) s" }
            .joined(separator: ", ")
        return "CPU \(cpuText); destination minor faults \(minorFaults - start.minorFaults), context switches \(contextSwitches - start.contextSwitches)"
    }
}

enum Experiments {
    /// Variants of (a) and a library-free destination for (b) and (c), to tell where time goes.
    static func run(world: Orchestrator.World, buffer: UnsafeMutableRawBufferPointer, devNull: Int32,
                    plain: @escaping (Int, Bool, Bool) async throws -> Double,
                    broker: @escaping (Int) async throws -> Double,
                    libraryHandover: @escaping () async throws -> UInt64,
                    libraryFirstByte: @escaping () async throws -> UInt64,
                    libraryUpdateSession: @escaping (String) async throws -> () async throws -> UInt64,
                    timedEcho: @escaping () async throws -> UInt64) async throws -> [String] {
        var lines: [String] = []
        let begun = try world.sourceToken("begin", "the second drag failed")
        let raw = try RawDestination(address: world.address)
        defer { raw.close() }
        try await raw.join(token: begun)
        let rawBegun = try world.sourceToken("rawbegin", "the raw source's drag failed")
        let rawBoth = try RawDestination(address: world.address)
        defer { rawBoth.close() }
        try await rawBoth.join(token: rawBegun)
        let rawBroker: (Int) async throws -> Double = { size in
            let start = monotonicNanos()
            let fd = try await raw.load(size == BenchSizes.gib1 ? BenchTypes.data1G : BenchTypes.data256M)
            defer { close(fd) }
            let received = try await PlainReader(fd: fd, buffer: buffer).read(size + 1)
            let elapsed = monotonicNanos() - start
            guard received == size else { throw BenchError("the raw load delivered \(received) of \(size) bytes") }
            return Orchestrator.mibPerSecond(size, elapsed)
        }
        let variants: [(String, () async throws -> Double)] = [
            ("plain", { try await plain(BenchSizes.gib1, false, false) }),
            ("plain, writer hops per chunk (as DataWriter.write)", { try await plain(BenchSizes.gib1, true, false) }),
            ("plain, reader copies per chunk (as DescriptorIO.readChunks)", { try await plain(BenchSizes.gib1, false, true) }),
            ("plain, both", { try await plain(BenchSizes.gib1, true, true) }),
            ("broker, library destination (load(into:))", { try await broker(BenchSizes.gib1) }),
            ("broker, raw destination (Load on BusKit, read(2) into one buffer)", { try await rawBroker(BenchSizes.gib1) }),
        ]
        var rates: [Int: [Double]] = [:]
        var usages: [Int: String] = [:]
        for round in 0..<3 {
            for (index, variant) in variants.enumerated() {
                let before = Usage.now(daemon: world.daemonPID, source: world.source.pid)
                rates[index, default: []].append(try await variant.1())
                if round == 2 { usages[index] = Usage.now(daemon: world.daemonPID, source: world.source.pid).delta(from: before) }
            }
        }
        for (index, variant) in variants.enumerated() {
            let values = rates[index] ?? []
            lines.append("experiment 1 GiB \(variant.0): median \(format(Orchestrator.median(values))) MiB/s "
                         + "(\(format(values)))")
            lines.append("    last run: \(usages[index] ?? "")")
        }

        // Library and library-free ends, with the echo, one after another.
        func handover(_ destination: RawDestination) async throws -> UInt64 {
            let start = monotonicNanos()
            let fd = try await destination.load(BenchTypes.file)
            let elapsed = monotonicNanos() - start
            close(fd)
            return elapsed
        }
        func firstByte(_ destination: RawDestination) async throws -> UInt64 {
            let start = monotonicNanos()
            let fd = try await destination.load(BenchTypes.small)
            let n = try await offThread { () -> Int in
                var byte: UInt8 = 0
                return Glibc.read(fd, &byte, 1)
            }
            let elapsed = monotonicNanos() - start
            close(fd)
            guard n == 1 else { throw BenchError("the raw small load read \(n)") }
            return elapsed
        }
        let sections: [(String, () async throws -> UInt64, (RawDestination) async throws -> UInt64)] = [
            ("file handover", libraryHandover, handover), ("first byte", libraryFirstByte, firstByte),
        ]
        for (label, library, rawOp) in sections {
            // Interleaved, so all four see the same machine.
            var histograms = [latencyHistogram(), latencyHistogram(), latencyHistogram(), latencyHistogram()]
            for i in 0..<2200 {
                try await Orchestrator.settle()
                let a = try await library()
                try await Orchestrator.settle()
                let b = try await rawOp(raw)
                try await Orchestrator.settle()
                let c = try await rawOp(rawBoth)
                try await Orchestrator.settle()
                let values = [a, b, c, try await timedEcho()]
                if i >= 200 { for k in 0..<4 { histograms[k].record(values[k]) } }
            }
            let names = ["library both ends", "raw destination, library source", "raw both ends", "echo"]
            lines.append("experiment \(label), p50/p99 µs: "
                         + zip(names, histograms).map { "\($0) \(format($1.micros(50)))/\(format($1.micros(99)))" }.joined(separator: "; "))
        }

        // Update before a drop: two more drags, one proposed to through the library, one raw.
        var tokens: [String] = []
        for _ in 0..<2 {
            tokens.append(try world.sourceToken("begin", "another drag failed"))
        }
        let libraryUpdate = try await libraryUpdateSession(tokens[0])
        let rawUpdater = try RawDestination(address: world.address)
        defer { rawUpdater.close() }
        try await rawUpdater.join(token: tokens[1], drop: false)
        var histograms = [latencyHistogram(), latencyHistogram(), latencyHistogram()]
        for i in 0..<3200 {
            try await Orchestrator.settle()
            let a = try await libraryUpdate()
            try await Orchestrator.settle()
            let start = monotonicNanos()
            try await rawUpdater.update()
            let b = monotonicNanos() - start
            try await Orchestrator.settle()
            let values = [a, b, try await timedEcho()]
            if i >= 200 { for k in 0..<3 { histograms[k].record(values[k]) } }
        }
        lines.append("experiment Update, p50/p99 µs: "
                     + zip(["library", "raw destination", "echo"], histograms).map { "\($0) \(format($1.micros(50)))/\(format($1.micros(99)))" }
                        .joined(separator: "; "))
        return lines
    }
}

/// Experiment: a source without the client library, straight on BusKit, answering the
/// provider's calls synchronously on its loop thread.
actor RawSource {
    let loop: EventLoop
    let bus: Bus
    private var object: ExportedObject?

    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    init(address: String) throws(BusError) {
        let loop = try EventLoop()
        bus = try Bus.connect(address: address, loop: loop, description: "dragbroker-bench-raw-source")
        loop.start(name: "dragbroker-bench-raw-source")
        self.loop = loop
    }

    /// Begins a drag of one item with the file and the small data representation; returns the token.
    func begin(memfd: Int32, small: Data) async throws(BusError) -> String {
        let broker = try await bus.nameOwner(BrokerNames.busName)
        let path = BrokerNames.providerPathPrefix + "raw"
        object = try bus.export(path: path, interface: BrokerInterfaces.provider, implementation: InterfaceImplementation(methods: [
            "ProvideFile": { call throws(BusError) in
                guard call.sender == broker else { throw BusError(name: "org.freedesktop.DBus.Error.AccessDenied", message: "not the broker") }
                // sd-bus duplicates the descriptor into the message.
                try call.reply { r throws(BusError) in try r.append(fileDescriptor: memfd) }
            },
            "Provide": { call throws(BusError) in
                guard call.sender == broker else { throw BusError(name: "org.freedesktop.DBus.Error.AccessDenied", message: "not the broker") }
                let m = call.message
                _ = try m.readObjectPath()
                _ = try m.readUInt32()
                _ = try m.readString()
                _ = try m.readUInt32()
                let fd = try m.readFileDescriptor()
                _ = small.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
                close(fd)
                try call.reply()
            },
        ]))
        let item = ItemDescriptor(suggestedName: "bench.bin", representations: [
            RepresentationDescriptor(typeIdentifier: BenchTypes.small, visibility: .all, kind: .data),
            RepresentationDescriptor(typeIdentifier: BenchTypes.file, visibility: .all, kind: .file),
        ])
        let m = try beginSessionCall(on: bus, broker: broker, item: item, provider: path)
        let reply = try await bus.call(m)
        _ = try reply.readObjectPath()
        return try reply.readString()
    }
}

// dragbroker-bench: `make bench`. Run without arguments it orchestrates a private bus, the
// daemon and a source process, acts as the destination, and prints throughput and latency
// through the broker against a plain pipe and a bus echo. `source PIPE PIPES` is the source role,
// `scale-source` the source of the scale section's 10,000 sessions (Scale.swift), `flood` the
// app whose refused calls flood the daemon in section (f) (Flood.swift).
// With DRAGBROKER_BENCH_EXPERIMENTS=1 it also runs diagnostic variants (Experiments.swift)
// that separate the client library's cost from the daemon's; they change no ratio.
import Foundation

let arguments = CommandLine.arguments
if arguments.count == 4 && arguments[1] == "source" {
    await SourceRole.run(plainPipePath: arguments[2], concurrentPipePaths: arguments[3].split(separator: ",").map(String.init))
} else if arguments.count == 2 && arguments[1] == "scale-source" {
    await ScaleSourceRole.run()
} else if arguments.count == 4 && arguments[1] == "flood", let connections = Int(arguments[3]) {
    FloodRole.run(address: arguments[2], connections: connections)
} else if arguments.count == 1 {
    exit(await Orchestrator.main())
} else {
    FileHandle.standardError.write(Data("Usage: dragbroker-bench (no arguments; `source PIPE PIPES`, `scale-source` and `flood` are internal)\n".utf8))
    exit(2)
}

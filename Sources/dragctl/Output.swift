// What the subcommands share: the --json/--no-legend/--no-pager and --address options, tables, the pager, times, sizes, errors,
// and the escaping of what clients chose.
import ArgumentParser
import Foundation

enum JSONMode: String, ExpressibleByArgument, CaseIterable {
    case pretty, short, off
}

struct OutputOptions: ParsableArguments {
    @Option(name: .customLong("json"), help: "Print JSON: pretty, short or off.")
    var json: JSONMode = .off

    @Flag(name: .customShort("j"), help: "Same as --json=pretty.")
    var prettyJSON = false

    @Flag(name: .customLong("no-legend"), help: "Do not print the header and the legend line.")
    var noLegend = false

    @Flag(name: .customLong("no-pager"), help: "Do not pipe the output into a pager.")
    var noPager = false

    var mode: JSONMode { prettyJSON ? .pretty : json }

    func printJSON<T: Encodable>(_ value: T) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = mode == .pretty ? [.prettyPrinted, .sortedKeys] : [.sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        print(String(decoding: try encoder.encode(value), as: UTF8.self))
    }

    /// A table in the manner of systemd's tools: header, rows, then a legend line.
    func printTable(_ header: [String], _ rows: [[String]], legend: String) {
        page(table(header, rows, legend: legend))
    }

    /// Every cell is escaped here, before widths are measured, so no column can forget to and
    /// the padding counts what the terminal will show.
    func table(_ header: [String], _ rows: [[String]], legend: String) -> String {
        let header = header.map(\.escapedForTerminal)
        let rows = rows.map { $0.map(\.escapedForTerminal) }
        var lines: [String] = []
        let widths = header.indices.map { i in ([header[i]] + rows.map { $0[i] }).map(\.count).max() ?? 0 }
        func row(_ cells: [String]) -> String {
            cells.enumerated().map { i, cell in
                i == cells.count - 1 ? cell : cell.padding(toLength: widths[i] + 1, withPad: " ", startingAt: 0)
            }.joined()
        }
        if !noLegend && !rows.isEmpty { lines.append(row(header)) }
        lines += rows.map(row)
        if !noLegend {
            if !rows.isEmpty { lines.append("") }
            lines.append(legend)
        }
        return lines.joined(separator: "\n")
    }

    /// Like systemd's tools: on a terminal, output taller than the screen goes through
    /// `$PAGER` (default `less -FRX`), unless --no-pager or `$SYSTEMD_PAGER=cat`.
    func page(_ text: String) {
        let environment = ProcessInfo.processInfo.environment
        let pager = environment["DRAGCTL_PAGER"] ?? environment["SYSTEMD_PAGER"] ?? environment["PAGER"] ?? "less -FRX"
        var size = winsize()
        let rows = ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0 ? Int(size.ws_row) : 0
        guard !noPager, isatty(STDOUT_FILENO) == 1, rows > 0, text.split(separator: "\n").count >= rows,
              !pager.isEmpty, pager != "cat" else {
            print(text)
            return
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", pager]
        let input = Pipe()
        process.standardInput = input
        do {
            try process.run()
            input.fileHandleForWriting.write(Data((text + "\n").utf8))
            try? input.fileHandleForWriting.close()
            process.waitUntilExit()
        } catch {
            print(text)
        }
    }
}

struct BusOptions: ParsableArguments {
    @Option(help: "The bus address (default: $DRAGBROKER_BUS_ADDRESS, else the session bus).")
    var address: String?
}

func plural(_ n: Int, _ word: String) -> String { "\(n) \(word)\(n == 1 ? "" : "s")" }

func fail(_ message: String) -> ExitCode {
    FileHandle.standardError.write(Data("dragctl: \(message)\n".utf8))
    return ExitCode(1)
}

/// Local time and how long ago, as systemd's tools show times: "2026-11-21 09:12:03 (2min ago)".
func timestamp(_ date: Date, now: Date = Date()) -> String {
    let formatter = DateFormatter()
    formatter.dateFormat = "yyyy-MM-dd HH:mm:ss"
    return "\(formatter.string(from: date)) (\(relative(now.timeIntervalSince(date))))"
}

func relative(_ seconds: TimeInterval) -> String {
    let s = Int(seconds.rounded(.down))
    switch s {
    case ..<1: return "just now"
    case ..<60: return "\(s)s ago"
    case ..<3600: return "\(s / 60)min ago"
    case ..<86_400: return "\(s / 3600)h \(s % 3600 / 60)min ago"
    default: return "\(s / 86_400) days ago"
    }
}

func bytes(_ count: UInt64) -> String {
    let units: [(UInt64, String)] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")]
    guard let (size, unit) = units.first(where: { count >= $0.0 }) else { return "\(count)B" }
    return String(format: "%.1f%@", Double(count) / Double(size), unit)
}

/// Parses `--since`/`--until`: "2026-11-21 09:00:00", "2026-11-21", or "-2h"/"-30min"/"-3d".
func parseTime(_ text: String) -> Date? {
    if text.hasPrefix("-") {
        let body = text.dropFirst()
        for (suffix, unit) in [("min", 60.0), ("h", 3600.0), ("d", 86_400.0), ("s", 1.0)] where body.hasSuffix(suffix) {
            if let n = Double(body.dropLast(suffix.count)) { return Date().addingTimeInterval(-n * unit) }
        }
        return nil
    }
    let formatter = DateFormatter()
    for format in ["yyyy-MM-dd HH:mm:ss", "yyyy-MM-dd HH:mm", "yyyy-MM-dd"] {
        formatter.dateFormat = format
        if let date = formatter.date(from: text) { return date }
    }
    return nil
}

extension String {
    /// What a client chose, made safe to print: as systemd's `cescape()` does, control characters
    /// become `\a \b \f \n \r \t \v` or `\xNN`, so a path or name cannot retitle the window, move
    /// the cursor or clear the operator's screen, and `\\` keeps a backslash in the text apart from
    /// an escape. C1 controls go byte by byte too, since U+009B is a CSI to many terminals; other
    /// UTF-8 stays, so names in any script read as they are. Never for JSON: its encoder escapes
    /// by JSON's rules and must keep the exact string.
    var escapedForTerminal: String {
        guard unicodeScalars.contains(where: { $0 == "\\" || $0.isTerminalControl }) else { return self }
        var escaped = ""
        for scalar in unicodeScalars {
            switch scalar {
            case "\u{07}": escaped += "\\a"
            case "\u{08}": escaped += "\\b"
            case "\u{0C}": escaped += "\\f"
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            case "\u{0B}": escaped += "\\v"
            case "\\": escaped += "\\\\"
            case _ where scalar.isTerminalControl:
                for byte in String(scalar).utf8 {
                    escaped += "\\x" + (byte < 0x10 ? "0" : "") + String(byte, radix: 16)
                }
            default:
                escaped.unicodeScalars.append(scalar)
            }
        }
        return escaped
    }
}

extension Unicode.Scalar {
    /// C0, DEL and C1: what a terminal may act on instead of showing.
    fileprivate var isTerminalControl: Bool { value < 0x20 || (0x7F...0x9F).contains(value) }
}

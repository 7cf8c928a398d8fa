import Foundation
import XCTest

/// The scripts and apps under Tests/desktop: GTK 3 windows speaking the desktop drag protocol,
/// the Wayland virtual pointer, the sway session.
enum DesktopFiles {
    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("desktop")
    static func path(_ name: String) -> String { directory.appendingPathComponent(name).path }
}

/// A point on the 800x300 screen both desktops have. Every window is 200x200 at y 50, so
/// y 285 is empty at any x.
struct ScreenPoint {
    let x: Int
    let y: Int
    static let source = ScreenPoint(x: 120, y: 150)
    static let target = ScreenPoint(x: 400, y: 150)
    static let plainTarget = ScreenPoint(x: 680, y: 150)
    /// Below the source and left of the target: nothing is there.
    static let nothing = ScreenPoint(x: 250, y: 285)
}

/// A headless desktop to drag on: Xvfb driven by xdotool, or sway driven by a virtual pointer.
final class Desktop {
    enum Backend: String { case x11, wayland }

    let backend: Backend
    /// What a GTK 3 client needs to show its windows here.
    let environment: [String: String]
    private let server: Child
    private let pointer: Child?
    private let swaySocket: String?

    init(_ backend: Backend, scratch: URL) throws {
        self.backend = backend
        let base = ["PATH": "/usr/bin:/bin", "NO_AT_BRIDGE": "1"]
        switch backend {
        case .x11:
            // Xvfb picks a free display number itself and writes it once it accepts clients.
            server = try Child(executable: URL(fileURLWithPath: "/usr/bin/Xvfb"),
                               arguments: ["-displayfd", "1", "-screen", "0", "800x300x24", "-nolisten", "tcp"],
                               environment: base)
            guard let number = server.stdout.take(where: { Int($0) != nil }) else {
                throw HarnessError("Xvfb did not start: \(server.stderr.text)")
            }
            // Qt wants a runtime directory too, and warns on every start without one.
            let runtime = scratch.appendingPathComponent("runtime")
            try FileManager.default.createDirectory(at: runtime, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            environment = base.merging(["DISPLAY": ":\(number)", "GDK_BACKEND": "x11", "QT_QPA_PLATFORM": "xcb",
                                        "XDG_RUNTIME_DIR": runtime.path]) { $1 }
            pointer = nil
            swaySocket = nil
        case .wayland:
            server = try Child(executable: URL(fileURLWithPath: DesktopFiles.path("sway-session.sh")), environment: base)
            guard let display = server.stdout.take(where: { $0.hasPrefix("WAYLAND_DISPLAY=") }),
                  let ipc = server.stdout.take(where: { $0.hasPrefix("SWAYSOCK=") }) else {
                throw HarnessError("sway did not start: \(server.stderr.text)")
            }
            // GTK 3 takes an absolute WAYLAND_DISPLAY only when XDG_RUNTIME_DIR is set; a
            // directory of the clients' own keeps their files out of sway's.
            let runtime = scratch.appendingPathComponent("runtime")
            try FileManager.default.createDirectory(at: runtime, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            // Qt draws no decorations of its own on Wayland with this, so its windows are the
            // size and place the others are.
            environment = base.merging(["WAYLAND_DISPLAY": String(display.dropFirst("WAYLAND_DISPLAY=".count)),
                                        "XDG_RUNTIME_DIR": runtime.path, "GDK_BACKEND": "wayland",
                                        "QT_QPA_PLATFORM": "wayland", "QT_WAYLAND_DISABLE_WINDOWDECORATION": "1"]) { $1 }
            swaySocket = String(ipc.dropFirst("SWAYSOCK=".count))
            let build = scratch.appendingPathComponent("virtual-pointer")
            try Desktop.run("/bin/sh", [DesktopFiles.path("build-virtual-pointer.sh"), build.path], environment: base)
            pointer = try Child(executable: build.appendingPathComponent("virtual-pointer"), arguments: ["800", "300"],
                                environment: environment)
            guard pointer?.stdout.take(where: { $0 == "ready" }) != nil else {
                throw HarnessError("virtual-pointer did not start: \(pointer?.stderr.text ?? "")")
            }
        }
    }

    deinit {
        pointer?.terminate()
        server.terminate()
    }

    /// Waits until a window with exactly this title is on screen.
    func waitForWindow(_ title: String, timeout: TimeInterval = 20) throws {
        switch backend {
        case .x11:
            try Desktop.run("/usr/bin/timeout", [String(Int(timeout)), "/usr/bin/xdotool", "search", "--sync", "--name", "^\(title)$"],
                            environment: environment)
        case .wayland:
            let deadline = Date().addingTimeInterval(timeout)
            while Date() < deadline {
                let tree = try Desktop.run("/usr/bin/swaymsg", ["-t", "get_tree", "-r"], environment: ["SWAYSOCK": swaySocket!])
                if tree.contains("\"name\": \"\(title)\"") || tree.contains("\"name\":\"\(title)\"") { return }
                usleep(50_000)
            }
            throw HarnessError("no window \(title) on sway")
        }
    }

    /// Gives the window with this title the keyboard focus and types `keys` there, as a person
    /// does: xdotool's key names (`ctrl+c`) on X11, wtype on sway. With no window manager on
    /// Xvfb the focus is set directly.
    func type(_ keys: String, in title: String) throws {
        switch backend {
        case .x11:
            let window = try Desktop.run("/usr/bin/xdotool", ["search", "--sync", "--onlyvisible", "--name", "^\(title)$"],
                                         environment: environment).split(separator: "\n").first.map(String.init) ?? ""
            try Desktop.run("/usr/bin/xdotool", ["windowfocus", "--sync", window, "sleep", "0.1", "key", "--clearmodifiers", keys],
                            environment: environment)
        case .wayland:
            try Desktop.run("/usr/bin/swaymsg", ["[title=\"^\(title)$\"]", "focus"], environment: ["SWAYSOCK": swaySocket!])
            usleep(100_000)
            let parts = keys.split(separator: "+").map(String.init)
            let modifiers = parts.dropLast().map { $0 == "ctrl" ? "ctrl" : $0 }
            // Each wtype is a new virtual keyboard with a keymap of its own: the pause lets the
            // focused client take the keymap before the first key, which it would drop otherwise.
            try Desktop.run("/usr/bin/wtype", ["-s", "300"] + modifiers.flatMap { ["-M", $0] } + ["-k", parts.last!]
                                + modifiers.flatMap { ["-m", $0] }, environment: environment)
        }
    }

    /// Moves a window to `position` on X11; on sway the config already placed it by title.
    func place(_ title: String, at position: (x: Int, y: Int)) throws {
        guard backend == .x11 else { return }
        // GTK 4 makes a 1x1 leader window with the same title: only the visible one is the window.
        let window = try Desktop.run("/usr/bin/xdotool", ["search", "--sync", "--onlyvisible", "--name", "^\(title)$"], environment: environment)
            .split(separator: "\n").first.map(String.init) ?? ""
        try Desktop.run("/usr/bin/xdotool", ["windowmove", "--sync", window, "\(position.x)", "\(position.y)"], environment: environment)
    }

    /// A press on `from`, steps onto `to` each `stepInterval` apart, and a release: the moves
    /// a person makes, slowly enough that the toolkit starts its drag before the release.
    func drag(from: ScreenPoint, to: ScreenPoint, steps: Int = 9, stepInterval: TimeInterval? = nil) throws {
        let path = (1...steps).map { ScreenPoint(x: from.x + (to.x - from.x) * $0 / steps, y: from.y + (to.y - from.y) * $0 / steps) }
        switch backend {
        case .x11:
            let interval = String(format: "%.3f", stepInterval ?? 0.04)
            var arguments = ["mousemove", "\(from.x)", "\(from.y)", "sleep", "0.05", "mousedown", "1"]
            for point in path { arguments += ["sleep", interval, "mousemove", "\(point.x)", "\(point.y)"] }
            arguments += ["sleep", interval, "mouseup", "1"]
            try Desktop.run("/usr/bin/xdotool", arguments, environment: environment)
        case .wayland:
            let interval = stepInterval ?? 0.02
            try point("abs \(from.x) \(from.y)")
            usleep(50_000)
            try point("down")
            for step in path {
                usleep(useconds_t(interval * 1_000_000))
                try point("abs \(step.x) \(step.y)")
            }
            usleep(useconds_t(interval * 1_000_000))
            try point("up")
        }
    }

    /// A drag whose pointer comes into the target and is released there at once: it stops
    /// just left of the target's window, then one motion in, and the release 20 ms after
    /// `entered` says the target took the drag in. Without that wait a loaded machine lets the
    /// release reach the compositor before the target has handled the enter at all, which for
    /// any toolkit is no drop: the compositor cancels the drag, and the source its session.
    func quickDrag(from: ScreenPoint, to: ScreenPoint, entered: () -> Bool = { true }) throws {
        let outside = ScreenPoint(x: to.x - 115, y: to.y)
        try press(at: from)
        try move(to: outside)
        try move(to: to, steps: 1)
        guard entered() else { throw HarnessError("the target never took the quick drag in") }
        usleep(20_000)
        try release()
    }

    /// The pointer pressed at `point`, held until `release`.
    func press(at point: ScreenPoint) throws {
        switch backend {
        case .x11:
            try Desktop.run("/usr/bin/xdotool", ["mousemove", "\(point.x)", "\(point.y)", "sleep", "0.05", "mousedown", "1"],
                            environment: environment)
        case .wayland:
            try self.point("abs \(point.x) \(point.y)")
            usleep(50_000)
            try self.point("down")
        }
        position = point
    }

    /// Moves the pointer in `steps` equal steps, as `drag` does, with the button as it is.
    func move(to destination: ScreenPoint, steps: Int = 9, stepInterval: TimeInterval? = nil) throws {
        let from = position
        let path = (1...steps).map { ScreenPoint(x: from.x + (destination.x - from.x) * $0 / steps,
                                                 y: from.y + (destination.y - from.y) * $0 / steps) }
        switch backend {
        case .x11:
            let interval = String(format: "%.3f", stepInterval ?? 0.04)
            var arguments: [String] = []
            for point in path { arguments += ["sleep", interval, "mousemove", "\(point.x)", "\(point.y)"] }
            try Desktop.run("/usr/bin/xdotool", arguments, environment: environment)
        case .wayland:
            for step in path {
                usleep(useconds_t((stepInterval ?? 0.02) * 1_000_000))
                try point("abs \(step.x) \(step.y)")
            }
        }
        position = destination
    }

    func release() throws {
        switch backend {
        case .x11: try Desktop.run("/usr/bin/xdotool", ["mouseup", "1"], environment: environment)
        case .wayland: try point("up")
        }
    }

    /// Where `press` and `move` left the pointer.
    private var position = ScreenPoint(x: 0, y: 0)

    private func point(_ command: String) throws {
        pointer!.send(command)
        guard pointer!.stdout.take(timeout: 10, where: { $0 == "ok \(command)" }) != nil else {
            throw HarnessError("virtual-pointer did not do \(command): \(pointer!.stderr.text)")
        }
    }

    /// A picture of the whole screen, for a person to look at when a drag went wrong.
    @discardableResult
    func screenshot(named name: String) -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-desktop-shots")
        try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent("\(name)-\(backend.rawValue).png").path
        switch backend {
        case .x11: _ = try? Desktop.run("/usr/bin/import", ["-window", "root", file], environment: environment)
        case .wayland: _ = try? Desktop.run("/usr/bin/grim", [file], environment: environment)
        }
        return file
    }

    /// Runs a command to its end; its standard output, or an error with its standard error.
    @discardableResult
    static func run(_ executable: String, _ arguments: [String], environment: [String: String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = environment
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        try process.run()
        // Read before waiting: a full pipe would stall the child.
        let output = out.fileHandleForReading.readDataToEndOfFile()
        let errors = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw HarnessError("\(executable) \(arguments.joined(separator: " ")) exited \(process.terminationStatus): \(String(decoding: errors, as: UTF8.self))")
        }
        return String(decoding: output, as: UTF8.self)
    }
}

/// An app with a window on `desktop`: one of the Python GTK 3 apps, or any program that says
/// when its window is up. With `scope`, a Python app joins that app scope before its first bus
/// call, so the daemon sees it as that app, not as python3.
final class DesktopApp: Child {
    let title: String

    init(_ script: String, title: String, arguments: [String], on desktop: Desktop, bus: PrivateBus?, scope: AppScope? = nil) throws {
        self.title = title
        var all = [DesktopFiles.path(script), "--title", title] + arguments
        if let bus { all += ["--bus", bus.address] }
        if scope != nil { all.append("--wait-for-go") }
        try super.init(executable: URL(fileURLWithPath: "/usr/bin/python3"), arguments: all, environment: desktop.environment)
        if let scope {
            try scope.adopt(process.processIdentifier)
            send("go")
        }
        guard stdout.take(where: { $0 == "READY" }) != nil else {
            throw HarnessError("\(script) did not show its window: \(stderr.text)")
        }
        try desktop.waitForWindow(title)
    }

    /// A program that finds the bus in the environment (the Swift client library, GDBus) and
    /// prints `ready` once its window is shown. It is moved to `position`: GTK 4 windows do not
    /// place themselves on X11 (sway places them by title).
    init(executable: URL, title: String, arguments: [String], ready: String, at position: (x: Int, y: Int),
         on desktop: Desktop, bus: PrivateBus) throws {
        self.title = title
        let environment = desktop.environment.merging(["DRAGBROKER_BUS_ADDRESS": bus.address, "DBUS_SESSION_BUS_ADDRESS": bus.address,
                                                       "GTK_A11Y": "none"]) { $1 }
        try super.init(executable: executable, arguments: arguments, environment: environment)
        guard stdout.take(where: { $0 == ready }) != nil else {
            throw HarnessError("\(executable.lastPathComponent) did not show its window: \(stderr.text)")
        }
        try desktop.waitForWindow(title)
        try desktop.place(title, at: position)
    }

    /// Waits for a line, exactly, leaving it for `lines`.
    func waitFor(_ line: String, timeout: TimeInterval = 20) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if !stdout.all(where: { $0 == line }).isEmpty { return true }
            usleep(20_000)
        }
        return false
    }

    /// Every line so far whose first word is one of `words`, in order.
    func lines(_ words: Set<String>) -> [String] {
        stdout.all { words.contains(String($0.prefix { $0 != " " })) }
    }
}

/// The SHA-256 of a file, as sha256sum prints it.
func sha256(of file: URL) throws -> String {
    let output = try Desktop.run("/usr/bin/sha256sum", [file.path], environment: ["PATH": "/usr/bin:/bin"])
    return String(output.prefix { $0 != " " })
}

/// An example app under examples/, built with its own Makefile, as its README tells a new
/// user to, into a temporary directory of its own; callers keep the result in a static.
func buildExample(_ name: String, product: String) throws -> URL {
    let build = FileManager.default.temporaryDirectory.appendingPathComponent("dragbroker-\(name)-\(getpid())")
    let example = DocumentationTests.root.appendingPathComponent("examples/\(name)")
    try Desktop.run("/usr/bin/make", ["-s", "-C", example.path, "BUILD=\(build.path)"], environment: ["PATH": "/usr/bin:/bin"])
    return build.appendingPathComponent(product)
}

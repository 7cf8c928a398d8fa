// The daemon's state directory is its own, the way ssh (StrictModes) and systemd
// (StateDirectory=) hold theirs: a directory, owned by the daemon's user, that no one else may
// write to, under parents that no one but root or that user may change; every file in it is a
// regular file of that user's, reached through the directory's descriptor and never through
// a symbolic link.
import Foundation
import SystemCalls

public enum StateDirectoryError: Error, Equatable, CustomStringConvertible {
    /// The directory, a parent of it or a file in it could be changed by someone else, or is a
    /// link: using it would let another user redirect or rewrite what the daemon writes.
    case unsafe(path: String, reason: String)
    /// A call on it failed (a full disk, an I/O error, no permission).
    case system(path: String, call: String, Errno)

    public var description: String {
        switch self {
        case .unsafe(let path, let reason): "refusing to use \(path): \(reason)"
        case .system(let path, let call, let errno): "\(path): \(call) failed: \(errno)"
        }
    }
}

public final class StateDirectory: Sendable {
    public let path: String
    /// Held open for the process: every entry is reached through it.
    public let descriptor: FileDescriptor
    /// The user the directory and its files must belong to: the daemon's.
    public let owner: UInt32

    /// Opens `path`, creating it and any missing parent 0700 first, and checks it and its
    /// parents.
    public init(path: String, owner: UInt32 = Kernel.effectiveUserID) throws(StateDirectoryError) {
        let path = Self.normalized(path)
        self.path = path
        self.owner = owner
        try Self.create(path)
        let parent = (path as NSString).deletingLastPathComponent
        let resolvedParent: String
        do {
            resolvedParent = try Kernel.resolvedPath(parent)
        } catch {
            throw .system(path: parent, call: "realpath", error)
        }
        try Self.checkParents(resolvedParent, owner: owner)
        let resolved = (resolvedParent as NSString).appendingPathComponent((path as NSString).lastPathComponent)
        do {
            descriptor = try FileDescriptor.openDirectory(resolved)
        } catch .tooManySymbolicLinkLevels, .notDirectory {
            let kind = (try? Kernel.entryStatus(resolved))??.kind == .symbolicLink ? "a symbolic link" : "not a directory"
            throw .unsafe(path: path, reason: "it is \(kind); the state directory must be a directory of its own")
        } catch {
            throw .system(path: path, call: "open", error)
        }
        do {
            let status = try descriptor.status()
            try Self.check(status, path: path, owner: owner, what: "the state directory")
        } catch let error as StateDirectoryError {
            descriptor.closeQuietly()
            throw error
        } catch {
            descriptor.closeQuietly()
            throw .system(path: path, call: "fstat", error as? Errno ?? .ioError)
        }
    }

    deinit {
        descriptor.closeQuietly()
    }

    public func pathOf(_ name: String) -> String {
        (path as NSString).appendingPathComponent(name)
    }

    /// What is at `name`: nothing (nil), or a regular file of the owner's that no one else may
    /// write; anything else is refused.
    @discardableResult
    public func checkEntry(_ name: String) throws(StateDirectoryError) -> FileStatus? {
        let status: FileStatus?
        do {
            status = try descriptor.entryStatus(name)
        } catch {
            throw .system(path: pathOf(name), call: "fstatat", error)
        }
        guard let status else { return nil }
        guard status.kind == .regular else {
            let kind = status.kind == .symbolicLink ? "a symbolic link" : "not a regular file"
            throw .unsafe(path: pathOf(name), reason: "it is \(kind), in the daemon's state directory")
        }
        try Self.check(status, path: pathOf(name), owner: owner, what: "the file")
        return status
    }

    /// Opens `name` read-write without following a link, creating it 0600 when `create`,
    /// checks it as `checkEntry` does, and takes away what others may read (`fchmod`).
    public func openFile(_ name: String, create: Bool = true, exclusive: Bool = false) throws(StateDirectoryError) -> FileDescriptor {
        let file: FileDescriptor
        do {
            file = try descriptor.openEntry(name, create: create, exclusive: exclusive)
        } catch .tooManySymbolicLinkLevels {
            throw .unsafe(path: pathOf(name), reason: "it is a symbolic link, in the daemon's state directory")
        } catch {
            throw .system(path: pathOf(name), call: "open", error)
        }
        do {
            let status = try file.status()
            guard status.kind == .regular else {
                throw StateDirectoryError.unsafe(path: pathOf(name), reason: "it is not a regular file, in the daemon's state directory")
            }
            try Self.check(status, path: pathOf(name), owner: owner, what: "the file")
            if status.permissions & 0o077 != 0 { try file.setPermissions(0o600) }
            return file
        } catch let error as StateDirectoryError {
            file.closeQuietly()
            throw error
        } catch {
            file.closeQuietly()
            throw .system(path: pathOf(name), call: "fchmod", error as? Errno ?? .ioError)
        }
    }

    /// Checks `name` and, when it is there, takes away what others may read: for files another
    /// program (SQLite) opens by path.
    public func tighten(_ name: String) throws(StateDirectoryError) {
        guard try checkEntry(name) != nil else { return }
        try openFile(name, create: false).closeQuietly()
    }

    /// fsync of the directory: entries made or renamed in it survive a power cut.
    public func synchronize() throws(StateDirectoryError) {
        do {
            try descriptor.synchronize()
        } catch {
            throw .system(path: path, call: "fsync", error)
        }
    }

    // MARK: Rules

    private static func check(_ status: FileStatus, path: String, owner: UInt32, what: String) throws(StateDirectoryError) {
        guard status.owner == owner else {
            throw .unsafe(path: path, reason: "\(what) is owned by uid \(status.owner), not by uid \(owner) that dragbrokerd runs as")
        }
        guard !status.writableByOthers else {
            throw .unsafe(path: path, reason: "\(what) is writable by group or others (mode \(octal(status.permissions))); run chmod go-w on it")
        }
    }

    /// Each directory from `/` down to `resolved` must belong to root or the owner, and be
    /// writable by no one else, unless it is sticky and root's (as /tmp): others can then add
    /// entries, but never move or replace the owner's.
    private static func checkParents(_ resolved: String, owner: UInt32) throws(StateDirectoryError) {
        var current = ""
        for component in ["/"] + resolved.split(separator: "/").map(String.init) {
            current = component == "/" ? "/" : (current as NSString).appendingPathComponent(component)
            let status: FileStatus?
            do {
                status = try Kernel.entryStatus(current)
            } catch {
                throw .system(path: current, call: "lstat", error)
            }
            guard let status else { throw .system(path: current, call: "lstat", .noSuchFileOrDirectory) }
            guard status.owner == 0 || status.owner == owner else {
                throw .unsafe(path: current, reason: """
                    a parent of the state directory is owned by uid \(status.owner), neither root nor uid \(owner) that dragbrokerd runs as
                    """)
            }
            if status.writableByOthers && !(status.sticky && status.owner == 0) {
                throw .unsafe(path: current, reason: """
                    a parent of the state directory is writable by group or others (mode \(octal(status.permissions))) and is not \
                    a sticky directory owned by root
                    """)
            }
        }
    }

    /// Makes the missing directories of `path`, each 0700 whatever the umask; one that exists
    /// is left as it is (and checked later).
    private static func create(_ path: String) throws(StateDirectoryError) {
        var missing: [String] = []
        var directory = path
        while !directory.isEmpty, directory != "/" {
            let status: FileStatus?
            do {
                status = try Kernel.entryStatus(directory)
            } catch {
                throw .system(path: directory, call: "lstat", error)
            }
            if status != nil { break }
            missing.append(directory)
            directory = (directory as NSString).deletingLastPathComponent
        }
        for directory in missing.reversed() {
            let parentPath = (directory as NSString).deletingLastPathComponent
            do {
                let parent = try FileDescriptor.openDirectory(parentPath.isEmpty ? "/" : parentPath)
                defer { parent.closeQuietly() }
                let name = (directory as NSString).lastPathComponent
                guard try parent.makeDirectory(name) else { continue }
                let made = try parent.openEntryDirectory(name)
                defer { made.closeQuietly() }
                try made.setPermissions(0o700)
            } catch {
                throw .system(path: directory, call: "mkdir", error)
            }
        }
    }

    /// Absolute, without empty or `.` components; a `..` is resolved with the parents, and
    /// a final one refused by the open (it is not the directory's own name).
    private static func normalized(_ path: String) -> String {
        let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        let components = absolute.split(separator: "/").filter { $0 != "." }
        return "/" + components.joined(separator: "/")
    }

    private static func octal(_ mode: UInt32) -> String {
        "0" + String(mode, radix: 8)
    }
}

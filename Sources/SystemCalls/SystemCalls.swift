// Every raw system call the daemon, the client library and the bus layer make, each behind
// one typed wrapper. errno is captured inside the wrapper, right after the call, and EINTR
// is retried in one place (`valueOrErrno`), as swift-system's own `FileOperations.swift`
// does. Descriptors are swift-system's `FileDescriptor`; failures its `Errno`.
import CLinux
import Glibc
@_exported import SystemPackage

/// Runs `call` until it stops failing with EINTR; -1 becomes the errno it left.
@inline(__always)
private func valueOrErrno<I: FixedWidthInteger>(_ call: () -> I) throws(Errno) -> I {
    while true {
        let result = call()
        if result != -1 { return result }
        let error = Errno(rawValue: linux_errno())
        if error != .interrupted { throw error }
    }
}

// MARK: Pipes and splice

extension FileDescriptor {
    /// pipe2(2) with O_CLOEXEC, and O_NONBLOCK on both ends when `nonBlocking`.
    public static func makePipe(nonBlocking: Bool) throws(Errno) -> (readEnd: FileDescriptor, writeEnd: FileDescriptor) {
        var fds: [Int32] = [-1, -1]
        _ = try valueOrErrno { linux_pipe2(&fds, nonBlocking ? 1 : 0) }
        return (FileDescriptor(rawValue: fds[0]), FileDescriptor(rawValue: fds[1]))
    }

    /// fcntl(F_SETPIPE_SZ). An unprivileged user may be capped by /proc/sys/fs/pipe-max-size.
    public func setPipeCapacity(_ bytes: Int32) throws(Errno) {
        _ = try valueOrErrno { linux_set_pipe_size(rawValue, bytes) }
    }

    /// fcntl(F_GETPIPE_SZ).
    public func pipeCapacity() throws(Errno) -> Int32 {
        try valueOrErrno { linux_get_pipe_size(rawValue) }
    }

    /// ioctl(FIONREAD): bytes waiting to be read from a pipe or socket.
    public func bytesPending() throws(Errno) -> Int {
        var count: Int32 = 0
        _ = try valueOrErrno { linux_pending_bytes(rawValue, &count) }
        return Int(count)
    }

    /// splice(2) of up to `count` bytes into `output`, never blocking (SPLICE_F_NONBLOCK) and
    /// moving pages rather than copying them where it can. 0 means end of file;
    /// `.resourceTemporarilyUnavailable` that either pipe is not ready.
    public func splice(to output: FileDescriptor, count: Int) throws(Errno) -> Int {
        try valueOrErrno { linux_splice(rawValue, output.rawValue, count, 1) }
    }

    /// splice(2) of up to `count` bytes from this pipe into `output` (a file, a pipe, a
    /// socket), waiting as a read and a write would. 0 means end of file;
    /// `.invalidArgument` that `output` takes no splice (a file opened O_APPEND, a terminal).
    public func spliceWaiting(to output: FileDescriptor, count: Int) throws(Errno) -> Int {
        try valueOrErrno { linux_splice(rawValue, output.rawValue, count, 0) }
    }

    /// poll(2) without waiting: which of `events` (POLLIN, POLLOUT) hold now, plus POLLHUP
    /// and POLLERR, which poll always reports.
    public func readiness(_ events: Int16) throws(Errno) -> Int16 {
        var entry = pollfd(fd: rawValue, events: events, revents: 0)
        let ready = try valueOrErrno { poll(&entry, 1, 0) }
        return ready == 0 ? 0 : entry.revents
    }
}

// MARK: Sockets

extension FileDescriptor {
    /// socketpair(2): two connected AF_UNIX stream sockets, close-on-exec.
    public static func makeSocketPair() throws(Errno) -> (FileDescriptor, FileDescriptor) {
        var fds: [Int32] = [-1, -1]
        _ = try valueOrErrno { socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) }
        return (FileDescriptor(rawValue: fds[0]), FileDescriptor(rawValue: fds[1]))
    }
}

// MARK: Descriptors and files

/// What fstat(2) says about a descriptor, as far as this project asks.
public struct FileStatus: Sendable, Equatable {
    public enum Kind: Sendable, Equatable { case regular, directory, socket, fifo, symbolicLink, other }
    public var kind: Kind
    public var size: UInt64
    public var device: UInt64
    public var inode: UInt64
    public var owner: UInt32 = 0
    /// The permission bits, set-ID and sticky bits included (st_mode & 07777).
    public var permissions: UInt32 = 0

    init(_ info: Glibc.stat) {
        kind = switch info.st_mode & S_IFMT {
        case S_IFREG: .regular
        case S_IFDIR: .directory
        case S_IFSOCK: .socket
        case S_IFIFO: .fifo
        case S_IFLNK: .symbolicLink
        default: .other
        }
        size = UInt64(max(0, info.st_size))
        device = UInt64(info.st_dev)
        inode = UInt64(info.st_ino)
        owner = info.st_uid
        permissions = info.st_mode & 0o7777
    }

    /// Whether a user other than the owner may change what is in it.
    public var writableByOthers: Bool { permissions & 0o022 != 0 }
    public var sticky: Bool { permissions & 0o1000 != 0 }
}

/// What an open file description permits, from its status flags.
public enum DescriptorAccess: Sendable, Equatable {
    case readOnly, writeOnly, readWrite
    /// `O_PATH`: a location only, which neither reads nor writes.
    case pathOnly
}

/// memfd seals (F_ADD_SEALS): what may no longer happen to the file's contents.
public struct FileSeals: OptionSet, Sendable {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    /// No further seals may be added.
    public static let seal = FileSeals(rawValue: 0x1)
    public static let shrink = FileSeals(rawValue: 0x2)
    public static let grow = FileSeals(rawValue: 0x4)
    public static let write = FileSeals(rawValue: 0x8)
    /// What makes a memfd's contents fixed for every reader.
    public static let immutable: FileSeals = [.shrink, .grow, .write]
}

extension FileDescriptor {
    /// fcntl(F_DUPFD_CLOEXEC): a new descriptor the caller owns, e.g. to keep one that a bus
    /// message only lends.
    public func duplicateCloseOnExec() throws(Errno) -> FileDescriptor {
        FileDescriptor(rawValue: try valueOrErrno { linux_dupfd_cloexec(rawValue) })
    }

    /// fstat(2).
    public func status() throws(Errno) -> FileStatus {
        var info = Glibc.stat()
        _ = try valueOrErrno { Glibc.fstat(rawValue, &info) }
        return FileStatus(info)
    }

    /// fcntl(F_GETFL) & O_ACCMODE: whether the descriptor was opened for reading only.
    public func isReadOnly() throws(Errno) -> Bool {
        try access() == .readOnly
    }

    /// fcntl(F_GETFL): what the open file description was opened for. An `O_PATH` descriptor
    /// reads as O_RDONLY in O_ACCMODE, yet grants no reading at all: it is told apart here.
    public func access() throws(Errno) -> DescriptorAccess {
        let flags = try valueOrErrno { linux_get_flags(rawValue) }
        if flags & linux_o_path() != 0 { return .pathOnly }
        switch flags & O_ACCMODE {
        case O_RDONLY: return .readOnly
        case O_WRONLY: return .writeOnly
        default: return .readWrite
        }
    }

    /// dup3(2) with O_CLOEXEC: this descriptor's file now also sits at `number`, and whatever
    /// sat there is closed (which, on a file system like FUSE, may block).
    public func duplicate(over number: Int32) throws(Errno) {
        _ = try valueOrErrno { linux_dup3_cloexec(rawValue, number) }
    }

    /// fcntl(F_GET_SEALS); nil for a file that cannot carry seals (anything but a memfd).
    public func seals() throws(Errno) -> FileSeals? {
        do {
            return FileSeals(rawValue: try valueOrErrno { linux_get_seals(rawValue) })
        } catch .invalidArgument {
            return nil
        }
    }

    /// fcntl(F_ADD_SEALS).
    public func addSeals(_ seals: FileSeals) throws(Errno) {
        _ = try valueOrErrno { linux_add_seals(rawValue, seals.rawValue) }
    }

    /// A new read-only descriptor for the same file, with its own offset, through
    /// /proc/self/fd: what the holder of the old one can do no longer matters.
    public func reopenReadOnly() throws(Errno) -> FileDescriptor {
        FileDescriptor(rawValue: try valueOrErrno { Glibc.open("/proc/self/fd/\(rawValue)", O_RDONLY | O_CLOEXEC) })
    }

    /// open(2) with O_PATH: a location that grants neither reading nor writing.
    public static func openLocation(_ path: String) throws(Errno) -> FileDescriptor {
        FileDescriptor(rawValue: try valueOrErrno { Glibc.open(path, linux_o_path() | O_CLOEXEC) })
    }

    /// lseek(2) to the start.
    public func rewind() throws(Errno) {
        _ = try valueOrErrno { Glibc.lseek(rawValue, 0, SEEK_SET) }
    }

    /// One read(2) into `buffer`; 0 at end of file.
    public func readSome(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int {
        try valueOrErrno { Glibc.read(rawValue, buffer.baseAddress, buffer.count) }
    }

    /// write(2) until every byte of `bytes` is out.
    public func writeFully(_ bytes: UnsafeRawBufferPointer) throws(Errno) {
        var offset = 0
        while offset < bytes.count {
            offset += try valueOrErrno { Glibc.write(rawValue, bytes.baseAddress! + offset, bytes.count - offset) }
        }
    }

    /// fcntl(F_GETFD) succeeds: the number is an open descriptor (this one, unless it was
    /// closed and the number given out again).
    public var isOpen: Bool {
        Glibc.fcntl(rawValue, F_GETFD) >= 0
    }

    /// close(2), for a descriptor whose owner is done with it; a failure leaves nothing to do.
    public func closeQuietly() {
        _ = Glibc.close(rawValue)
    }
}

// MARK: Files that outlive the process

/// A directory held open, whose entries are reached through it and never through a symbolic
/// link: what replaces a path between a check and an open cannot redirect the open.
extension FileDescriptor {
    /// open(2) of a directory with O_NOFOLLOW: fails with ELOOP (or ENOTDIR) when `path` itself
    /// is a symbolic link.
    public static func openDirectory(_ path: String) throws(Errno) -> FileDescriptor {
        FileDescriptor(rawValue: try valueOrErrno { Glibc.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) })
    }

    /// fstatat(2) of an entry of this directory, without following a link; nil when there is none.
    public func entryStatus(_ name: String) throws(Errno) -> FileStatus? {
        var info = Glibc.stat()
        do {
            _ = try valueOrErrno { Glibc.fstatat(rawValue, name, &info, AT_SYMLINK_NOFOLLOW) }
        } catch .noSuchFileOrDirectory {
            return nil
        }
        return FileStatus(info)
    }

    /// openat(2) of an entry of this directory with O_NOFOLLOW (ELOOP on a link), read-write or
    /// read-only; `create` makes it 0600 when missing, `exclusive` only if missing.
    public func openEntry(_ name: String, readOnly: Bool = false, create: Bool = false, exclusive: Bool = false) throws(Errno) -> FileDescriptor {
        var flags = (readOnly ? O_RDONLY : O_RDWR) | O_NOFOLLOW | O_CLOEXEC
        if create { flags |= O_CREAT }
        if exclusive { flags |= O_EXCL }
        return FileDescriptor(rawValue: try valueOrErrno { Glibc.openat(rawValue, name, flags, 0o600) })
    }

    /// openat(2) of a directory entry of this directory with O_NOFOLLOW.
    public func openEntryDirectory(_ name: String) throws(Errno) -> FileDescriptor {
        FileDescriptor(rawValue: try valueOrErrno { Glibc.openat(rawValue, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) })
    }

    /// mkdirat(2), 0700; true when made, false when an entry of that name was there.
    public func makeDirectory(_ name: String) throws(Errno) -> Bool {
        do {
            _ = try valueOrErrno { Glibc.mkdirat(rawValue, name, 0o700) }
            return true
        } catch .fileExists {
            return false
        }
    }

    /// renameat(2) within this directory, replacing `to`.
    public func renameEntry(_ from: String, to: String) throws(Errno) {
        _ = try valueOrErrno { Glibc.renameat(rawValue, from, rawValue, to) }
    }

    /// unlinkat(2); a missing entry is not an error.
    public func removeEntry(_ name: String) throws(Errno) {
        do {
            _ = try valueOrErrno { Glibc.unlinkat(rawValue, name, 0) }
        } catch .noSuchFileOrDirectory {}
    }

    /// fchmod(2): through the descriptor, so never through a link.
    public func setPermissions(_ mode: UInt32) throws(Errno) {
        _ = try valueOrErrno { Glibc.fchmod(rawValue, mode_t(mode)) }
    }

    /// fsync(2): the file's data and metadata (for a directory, its entries) are on disk.
    public func synchronize() throws(Errno) {
        _ = try valueOrErrno { Glibc.fsync(rawValue) }
    }

    /// fdatasync(2): the file's data, and the metadata needed to read it back, are on disk.
    public func synchronizeData() throws(Errno) {
        _ = try valueOrErrno { Glibc.fdatasync(rawValue) }
    }

    /// pread(2) until `buffer` is full or the file ends; returns the bytes read. Never faults
    /// the way a mapping of a hole on a full file system does (SIGBUS): a read meets an error.
    public func readFully(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws(Errno) -> Int {
        var done = 0
        while done < buffer.count {
            let count = try valueOrErrno { Glibc.pread(rawValue, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done)) }
            if count == 0 { break }
            done += count
        }
        return done
    }

    /// pwrite(2) of every byte at `offset`.
    public func writeFully(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws(Errno) {
        var done = 0
        while done < bytes.count {
            done += try valueOrErrno { Glibc.pwrite(rawValue, bytes.baseAddress! + done, bytes.count - done, off_t(offset) + off_t(done)) }
        }
    }
}

extension Kernel {
    /// lstat(2): the entry at `path` itself, a link not followed; nil when there is none.
    public static func entryStatus(_ path: String) throws(Errno) -> FileStatus? {
        var info = Glibc.stat()
        do {
            _ = try valueOrErrno { Glibc.lstat(path, &info) }
        } catch .noSuchFileOrDirectory {
            return nil
        }
        return FileStatus(info)
    }

    /// realpath(3): `path` with every link, `.` and `..` resolved.
    public static func resolvedPath(_ path: String) throws(Errno) -> String {
        guard let resolved = Glibc.realpath(path, nil) else { throw Errno(rawValue: linux_errno()) }
        defer { free(resolved) }
        return String(cString: resolved)
    }
}

extension FileDescriptor {
    /// flock(LOCK_EX | LOCK_NB): false when another open file description holds the lock. It
    /// is released when every descriptor of this one closes, so also when the process dies.
    public func lockExclusively() throws(Errno) -> Bool {
        do {
            _ = try valueOrErrno { linux_flock_exclusive(rawValue) }
            return true
        } catch .wouldBlock {
            return false
        }
    }

    /// posix_fallocate(3): the blocks of `offset..<offset+length` belong to the file from now
    /// on (growing it), so a store into a shared mapping of them cannot meet a full disk (SIGBUS).
    public func reserve(offset: Int64, length: Int64) throws(Errno) {
        while true {
            let result = Glibc.posix_fallocate(rawValue, off_t(offset), off_t(length))
            if result == 0 { return }
            if result != EINTR { throw Errno(rawValue: result) }
        }
    }
}

/// mmap(2) of part of a file, shared: a store is in the page cache as soon as it is made, so it
/// outlives a crash of the process (not of the machine) without a system call.
public final class SharedMapping: @unchecked Sendable {
    public let base: UnsafeMutableRawPointer
    public let count: Int

    public init(_ file: FileDescriptor, offset: Int64, count: Int) throws(Errno) {
        guard let pointer = Glibc.mmap(nil, count, PROT_READ | PROT_WRITE, MAP_SHARED, file.rawValue, off_t(offset)),
              pointer != MAP_FAILED else {
            throw Errno(rawValue: linux_errno())
        }
        base = pointer
        self.count = count
    }

    deinit {
        Glibc.munmap(base, count)
    }
}

// MARK: The kernel's other services

public enum Kernel {
    /// getrandom(2): `count` bytes from the kernel's CSPRNG, blocking only before it is seeded.
    public static func randomBytes(_ count: Int) throws(Errno) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        var filled = 0
        while filled < count {
            // withUnsafeMutableBytes only rethrows untyped errors: carry the errno out in a Result.
            filled += try bytes.withUnsafeMutableBytes { buffer in
                Result { () throws(Errno) in try valueOrErrno { linux_getrandom(buffer.baseAddress! + filled, count - filled) } }
            }.get()
        }
        return bytes
    }

    /// pidfd_open(2): pins a process, so its PID cannot be recycled while the descriptor lives.
    public static func openProcess(_ pid: pid_t) throws(Errno) -> FileDescriptor {
        FileDescriptor(rawValue: try valueOrErrno { linux_pidfd_open(pid) })
    }

    /// The device of the kernel's internal tmpfs that holds every memfd (and nothing that has a
    /// path): a tmpfs file also answers F_GET_SEALS, so a memfd is told by where it lives. Nil
    /// when no memfd could be made to ask.
    public static let memoryFileDevice: UInt64? = {
        guard let probe = try? makeMemoryFile(name: "dragbroker-probe") else { return nil }
        defer { probe.closeQuietly() }
        return try? probe.status().device
    }()

    /// /dev/null, open read-only for the life of the process: what a borrowed descriptor's
    /// number is pointed at, so that whoever closes that number later closes nothing that blocks.
    public static let nullDevice: FileDescriptor? = {
        let fd = Glibc.open("/dev/null", O_RDONLY | O_CLOEXEC)
        return fd < 0 ? nil : FileDescriptor(rawValue: fd)
    }()

    /// getrlimit/setrlimit(RLIMIT_NOFILE): raises the soft limit on open descriptors to the
    /// hard one, as systemd's own daemons do (select(2)'s FD_SETSIZE is no concern here), and
    /// returns the limits now in force.
    public static func raiseDescriptorLimit() throws(Errno) -> (soft: UInt64, hard: UInt64) {
        var limit = rlimit()
        _ = try valueOrErrno { getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            _ = try valueOrErrno { setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) }
            limit = raised
        }
        return (UInt64(limit.rlim_cur), UInt64(limit.rlim_max))
    }

    /// geteuid(2).
    public static var effectiveUserID: uid_t { geteuid() }

    /// memfd_create(2) with close-on-exec and sealing allowed.
    public static func makeMemoryFile(name: String) throws(Errno) -> FileDescriptor {
        FileDescriptor(rawValue: try valueOrErrno { linux_memfd_create(name) })
    }

    /// eventfd(2), non-blocking and close-on-exec: how other threads wake an event loop.
    public static func makeEventFD() throws(Errno) -> FileDescriptor {
        FileDescriptor(rawValue: try valueOrErrno { linux_eventfd() })
    }

    /// Names the calling thread for the kernel (`top -H`, `perf`, /proc/…/comm), cut to the 15
    /// bytes it keeps. Foundation's `Thread.name` does not reach the kernel: without this a
    /// thread keeps the name of the thread that started it.
    public static func nameCurrentThread(_ name: String) {
        _ = linux_set_thread_name(String(decoding: name.utf8.prefix(15), as: UTF8.self))
    }

    /// getrusage(RUSAGE_THREAD): the CPU time the calling thread used so far (user and system,
    /// in microseconds) and how often the kernel took the CPU from it while it could still run
    /// (involuntary context switches).
    public static func currentThreadUsage() -> (cpuMicroseconds: UInt64, involuntarySwitches: Int) {
        var usage = rusage()
        // RUSAGE_THREAD, which Glibc's Swift overlay does not name.
        getrusage(__rusage_who_t(1), &usage)
        func micros(_ t: timeval) -> UInt64 { UInt64(t.tv_sec) * 1_000_000 + UInt64(t.tv_usec) }
        return (micros(usage.ru_utime) + micros(usage.ru_stime), usage.ru_nivcsw)
    }

    /// The calling thread's kernel ID: its entry under /proc/self/task.
    public static func currentThreadID() -> pid_t {
        pid_t(linux_gettid())
    }

    /// A peer that closes its pipe must cost an EPIPE, never the process.
    public static func ignoreSIGPIPE() {
        linux_ignore_sigpipe()
    }

    /// CLOCK_MONOTONIC in microseconds.
    public static func monotonicMicroseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1_000
    }

    /// Runs `body` with SIGPIPE blocked on this thread, and consumes one it raised before the
    /// mask is restored: a write to a pipe whose reader left fails with EPIPE instead of
    /// killing a process whose signal handling is not ours to change (the client library's).
    public static func withSIGPIPEBlocked<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        var block = sigset_t()
        var previous = sigset_t()
        sigemptyset(&block)
        sigaddset(&block, SIGPIPE)
        pthread_sigmask(SIG_BLOCK, &block, &previous)
        defer {
            var pending = sigset_t()
            sigpending(&pending)
            if sigismember(&pending, SIGPIPE) == 1 {
                var zero = timespec()
                _ = sigtimedwait(&block, nil, &zero)
            }
            pthread_sigmask(SIG_SETMASK, &previous, nil)
        }
        return try body()
    }
}

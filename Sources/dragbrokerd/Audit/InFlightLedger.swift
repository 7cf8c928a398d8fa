// Write-ahead for running loads at the price of a few memory stores, so recording a load
// before its first byte moves costs the transfer nothing: see `InFlightLedger`.
import Foundation
import Synchronization
import SystemCalls
import TransferLog

/// A file beside the transfer log with one fixed-size slot per running load, mapped shared.
/// A load takes a slot before any of its bytes move and gives it back once its end record has
/// committed, so a daemon killed in between leaves the load in the page cache, whatever
/// SQLite had written yet; the next daemon reads what is left (`leftBehind`) and records it as
/// interrupted. Its bytes and time are brought up to date at each checkpoint.
///
/// Its header says what the file is (magic, version, sizes) and carries the session numbers:
/// the highest handed out, stored at each session's start, and the highest that may be, synced
/// before any number past it is handed out, so no ID is ever handed out twice, across crashes
/// and power cuts alike.
///
/// The file also carries the state directory's lock: one daemon per log, so a second one can
/// never take the first one's running loads for leftovers.
///
/// Nothing read from the file is trusted: every slot is checked before it is used, a file that
/// is not a ledger is moved aside (what could be read from it recovered), and every block is
/// allocated before it is mapped, so neither a full disk nor a hole can fault (SIGBUS).
///
/// Slots live for the process: claimed and updated on the bus loop, released on the log's
/// writer queue once the end is on disk; `Mutex` guards the list of free ones.
final class InFlightLedger: Sendable {
    struct Slot: @unchecked Sendable {
        let index: Int
        fileprivate let base: UnsafeMutableRawPointer
    }

    enum OpenError: Error, CustomStringConvertible {
        case locked(String)
        case system(String, Errno)
        /// A later version of dragbroker wrote it: its slots cannot be read, nor may it be replaced.
        case newerVersion(String, UInt32)
        case unsafe(StateDirectoryError)

        var description: String {
            switch self {
            case .locked(let path): "another dragbrokerd is using the state directory (\(path) is locked)"
            case .system(let what, let errno): "\(what): \(errno)"
            case .newerVersion(let path, let version):
                "\(path) was written by a newer version of dragbroker (ledger version \(version), this one knows \(InFlightLedger.version)); run that version, or move the file aside"
            case .unsafe(let error): error.description
            }
        }

        /// Whether starting again cannot help: the state on disk has to change first.
        var stateUnusable: Bool {
            switch self {
            case .newerVersion, .unsafe: true
            case .locked, .system: false
            }
        }
    }

    /// What the daemon found and did at start, for its log.
    struct Opening {
        /// Migrated from the headerless format of dragbroker 0.x, its slots kept.
        var migrated = false
        /// Not a ledger: moved to `damagedName`; `recovered` loads could still be read from it.
        var damaged: String?
        var recovered = 0
        /// Slots marked in use whose contents could not be trusted: cleared, their loads unknown.
        var unreadableSlots = 0
    }

    static let fileName = "transfers.inflight"
    static let damagedName = "transfers.inflight.damaged"
    private static let newName = "transfers.inflight.new"
    static let version: UInt32 = 1
    static let magic = Array("dragbroker-ldgr\n".utf8)
    /// A page, so every chunk after it is mapped at a page boundary.
    static let headerSize = 4096
    static let slotSize = 2048
    static let slotsPerChunk = 64
    static let chunkBytes = slotSize * slotsPerChunk
    /// One slot per load in flight; past this many, loads wait for their start record in SQLite.
    static let maximumSlots = 16_384

    private enum HeaderOffset {
        static let magic = 0, version = 16, slotSize = 20, headerSize = 24, slotsPerChunk = 28
        static let issuedSession = 32, reservedSession = 40
    }

    // Slot layout: state, load number, start, last checkpoint, bytes, session start, item
    // count, text length, then the text fields, each ended by a NUL.
    private enum Offset {
        static let state = 0, loadID = 4, loadStartedAt = 8, updatedAt = 16, bytes = 24
        static let sessionStartedAt = 32, itemCount = 40, textLength = 44, text = 48
    }
    private enum SlotState: UInt32 {
        case free = 0
        /// A load of this run.
        case running = 1
        /// A load of an earlier run, not yet on record.
        case leftBehind = 2
    }
    /// Each text field keeps at most this many bytes, so seven always fit.
    static let fieldLimit = 280
    /// Stands for a team the app has not got (nil), which no UTF-8 string can spell.
    private static let noTeam: UInt8 = 0xFF
    /// The latest time a slot may hold: the end of year 9999, in microseconds.
    private static let latestTime: Int64 = 253_402_300_799_999_999

    let path: String
    let opening: Opening
    private let file: FileDescriptor
    private let header: SharedMapping
    private struct Slots {
        var chunks: [SharedMapping] = []
        var free: [Int] = []
        /// Loads of an earlier run not yet on record: in a slot, or recovered from a damaged file.
        var leftBehind: [(index: Int?, load: TransferLog.InFlight)] = []
    }
    private let slots: Mutex<Slots>

    /// Opens (creating if needed) the ledger in `directory` and takes its lock. Slots a dead
    /// daemon left running are kept as left behind until `forget` says they are on record.
    init(directory: StateDirectory) throws(OpenError) {
        path = directory.pathOf(Self.fileName)
        var file: FileDescriptor
        do {
            file = try directory.openFile(Self.fileName)
        } catch {
            throw .unsafe(error)
        }
        var opening = Opening()
        var contents: [UInt8]
        do {
            guard try file.lockExclusively() else {
                file.closeQuietly()
                throw OpenError.locked(path)
            }
            // Read, never mapped, until it is known to be whole: a read of a hole meets an
            // error where a mapping of it faults.
            let size = Int(min(try file.status().size, UInt64(Self.headerSize + Self.maximumSlots * Self.slotSize)))
            contents = [UInt8](repeating: 0, count: size)
            let read = try contents.withUnsafeMutableBytes { buffer throws(Errno) in try file.readFully(into: buffer, at: 0) }
            contents.removeSubrange(read...)
        } catch let error as OpenError {
            throw error
        } catch {
            file.closeQuietly()
            throw .system("cannot read \(path)", error as? Errno ?? .ioError)
        }
        var recovered: [TransferLog.InFlight] = []
        do {
            switch try Self.format(of: contents, path: path) {
            case .current:
                contents.removeFirst(Self.headerSize)
            case .empty:
                file = try Self.replace(file, in: directory, slots: [], keepingAs: nil)
            case .headerless:
                // Chunks past the last slot in use hold nothing to keep (and may be holes).
                let inUse = stride(from: 0, to: contents.count, by: Self.slotSize).reversed().first { offset in
                    contents.withUnsafeBytes { $0.load(fromByteOffset: offset, as: UInt32.self) } != SlotState.free.rawValue
                }
                contents = inUse.map { Array(contents[..<(($0 / Self.chunkBytes + 1) * Self.chunkBytes)]) } ?? []
                file = try Self.replace(file, in: directory, slots: contents, keepingAs: nil)
                opening.migrated = true
            case .damaged(let why):
                recovered = Self.recoverable(in: contents)
                file = try Self.replace(file, in: directory, slots: [], keepingAs: Self.damagedName)
                opening.damaged = why
                opening.recovered = recovered.count
                contents = []
            }
        } catch let error as OpenError {
            file.closeQuietly()
            throw error
        } catch {
            file.closeQuietly()
            throw .system("cannot rewrite \(path)", error as? Errno ?? .ioError)
        }
        var state = Slots()
        state.leftBehind = recovered.map { (nil, $0) }
        let chunkCount = min(contents.count / Self.chunkBytes, Self.maximumSlots / Self.slotsPerChunk)
        do {
            // Every block the mappings cover belongs to the file before anything is mapped.
            try file.reserve(offset: 0, length: Int64(Self.headerSize + chunkCount * Self.chunkBytes))
            header = try SharedMapping(file, offset: 0, count: Self.headerSize)
            for chunk in 0..<chunkCount {
                state.chunks.append(try SharedMapping(file, offset: Int64(Self.headerSize + chunk * Self.chunkBytes), count: Self.chunkBytes))
            }
        } catch {
            file.closeQuietly()
            throw .system("cannot allocate and map \(path)", error)
        }
        self.file = file
        contents.withUnsafeBytes { bytes in
            for index in (0..<chunkCount * Self.slotsPerChunk).reversed() {
                let copy = bytes.baseAddress! + index * Self.slotSize
                let base = Self.base(of: index, in: state.chunks)
                let slotState = SlotState(rawValue: copy.load(fromByteOffset: Offset.state, as: UInt32.self))
                if slotState == .free {
                    state.free.append(index)
                } else if slotState != nil, let load = Self.read(copy) {
                    base.storeBytes(of: SlotState.leftBehind.rawValue, toByteOffset: Offset.state, as: UInt32.self)
                    state.leftBehind.append((index, load))
                } else {
                    // An unknown state, or a load out of range: neither trusted nor lost silently.
                    opening.unreadableSlots += 1
                    base.storeBytes(of: SlotState.free.rawValue, toByteOffset: Offset.state, as: UInt32.self)
                    state.free.append(index)
                }
            }
        }
        state.leftBehind.reverse()
        self.opening = opening
        slots = Mutex(state)
    }

    private enum Format {
        case empty, current, headerless
        case damaged(String)
    }

    private static func format(of contents: [UInt8], path: String) throws(OpenError) -> Format {
        guard !contents.isEmpty else { return .empty }
        func field(_ offset: Int) -> UInt32 {
            contents.withUnsafeBytes { $0.load(fromByteOffset: offset, as: UInt32.self) }
        }
        if contents.count >= headerSize, Array(contents[..<magic.count]) == magic {
            let version = field(HeaderOffset.version)
            guard version <= Self.version else { throw .newerVersion(path, version) }
            guard version == Self.version, field(HeaderOffset.slotSize) == UInt32(slotSize),
                  field(HeaderOffset.headerSize) == UInt32(headerSize), field(HeaderOffset.slotsPerChunk) == UInt32(slotsPerChunk) else {
                return .damaged("its header names a version \(version) layout this version does not write")
            }
            return .current
        }
        // dragbroker 0.x wrote no header: whole chunks of slots, each starting with a state.
        guard contents.count % chunkBytes == 0 else {
            return .damaged("it has no ledger header, and its size (\(contents.count) bytes) is not a whole number of slot chunks")
        }
        let states = stride(from: 0, to: contents.count, by: slotSize).map(field)
        guard states.allSatisfy({ SlotState(rawValue: $0) != nil }) else {
            return .damaged("it has no ledger header, and not every slot holds a known state")
        }
        return .headerless
    }

    /// What can be read from a file that is not a ledger, taken as headerless slots: a load
    /// only when everything in its slot is in range.
    private static func recoverable(in contents: [UInt8]) -> [TransferLog.InFlight] {
        contents.withUnsafeBytes { bytes in
            stride(from: 0, through: bytes.count - slotSize, by: slotSize).compactMap { offset in
                let base = bytes.baseAddress! + offset
                let state = SlotState(rawValue: base.load(fromByteOffset: Offset.state, as: UInt32.self))
                guard state == .running || state == .leftBehind else { return nil }
                return read(base)
            }
        }
    }

    /// Writes a new ledger (header, then `slots`) beside the old one, syncs it, and puts it in
    /// the old one's place, which is kept as `keepingAs` or dropped; the new file is locked
    /// before it takes the name, so the directory is never without its lock.
    private static func replace(_ old: FileDescriptor, in directory: StateDirectory, slots: [UInt8], keepingAs: String?) throws -> FileDescriptor {
        try directory.descriptor.removeEntry(newName)
        let new = try directory.openFile(newName, exclusive: true)
        do {
            guard try new.lockExclusively() else { throw Errno.resourceTemporarilyUnavailable }
            var header = [UInt8](repeating: 0, count: headerSize)
            header.replaceSubrange(0..<magic.count, with: magic)
            header.withUnsafeMutableBytes { bytes in
                bytes.storeBytes(of: Self.version, toByteOffset: HeaderOffset.version, as: UInt32.self)
                bytes.storeBytes(of: UInt32(slotSize), toByteOffset: HeaderOffset.slotSize, as: UInt32.self)
                bytes.storeBytes(of: UInt32(headerSize), toByteOffset: HeaderOffset.headerSize, as: UInt32.self)
                bytes.storeBytes(of: UInt32(slotsPerChunk), toByteOffset: HeaderOffset.slotsPerChunk, as: UInt32.self)
            }
            try header.withUnsafeBytes { try new.writeFully($0, at: 0) }
            try slots.withUnsafeBytes { try new.writeFully($0, at: Int64(headerSize)) }
            try new.synchronize()
            if let keepingAs { try directory.descriptor.renameEntry(fileName, to: keepingAs) }
            try directory.descriptor.renameEntry(newName, to: fileName)
            try directory.synchronize()
        } catch {
            new.closeQuietly()
            throw error
        }
        old.closeQuietly()
        return new
    }

    deinit {
        file.closeQuietly()
    }

    private static func base(of index: Int, in chunks: [SharedMapping]) -> UnsafeMutableRawPointer {
        chunks[index / slotsPerChunk].base + (index % slotsPerChunk) * slotSize
    }

    // MARK: This run's loads

    /// Takes a slot for a load about to start, and fills it; nil when none can be had (the
    /// ledger is at its limit, or the disk is too full to grow it).
    func claim(_ load: LoadRecord, of session: SessionRecord) -> Slot? {
        let claimed: Slot? = slots.withLock { state in
            if state.free.isEmpty {
                let first = state.chunks.count * Self.slotsPerChunk
                guard first < Self.maximumSlots else { return nil }
                let offset = Int64(Self.headerSize + first * Self.slotSize)
                do {
                    try file.reserve(offset: offset, length: Int64(Self.chunkBytes))
                    state.chunks.append(try SharedMapping(file, offset: offset, count: Self.chunkBytes))
                } catch {
                    return nil
                }
                state.free = Array((first..<first + Self.slotsPerChunk).reversed())
            }
            let index = state.free.removeLast()
            return Slot(index: index, base: Self.base(of: index, in: state.chunks))
        }
        guard let slot = claimed else { return nil }
        let base = slot.base
        base.storeBytes(of: UInt32(truncatingIfNeeded: load.loadID ?? 0), toByteOffset: Offset.loadID, as: UInt32.self)
        base.storeBytes(of: MicrosecondTimestamp.microseconds(load.startedAt), toByteOffset: Offset.loadStartedAt, as: Int64.self)
        base.storeBytes(of: MicrosecondTimestamp.microseconds(load.endedAt), toByteOffset: Offset.updatedAt, as: Int64.self)
        base.storeBytes(of: load.bytes, toByteOffset: Offset.bytes, as: Int64.self)
        base.storeBytes(of: MicrosecondTimestamp.microseconds(session.startedAt), toByteOffset: Offset.sessionStartedAt, as: Int64.self)
        base.storeBytes(of: UInt32(clamping: session.itemCount), toByteOffset: Offset.itemCount, as: UInt32.self)
        var length = 0
        let text = (base + Offset.text).assumingMemoryBound(to: UInt8.self)
        func append(_ field: String?) {
            guard var field else {
                text[length] = Self.noTeam
                text[length + 1] = 0
                length += 2
                return
            }
            field.withUTF8 { bytes in
                var count = 0
                for byte in bytes.prefix(Self.fieldLimit + 1) where byte != 0 {
                    text[length + count] = byte
                    count += 1
                }
                // Cut at a character's boundary.
                if count > Self.fieldLimit {
                    count = Self.fieldLimit
                    while count > 0, text[length + count] & 0xC0 == 0x80 { count -= 1 }
                }
                text[length + count] = 0
                length += count + 1
            }
        }
        for field in [load.sessionID, load.sourceApp, load.destinationApp, load.typeIdentifier, session.operation] {
            append(field)
        }
        append(load.sourceTeam)
        append(load.destinationTeam)
        base.storeBytes(of: UInt32(length), toByteOffset: Offset.textLength, as: UInt32.self)
        // The slot counts only once every field is in it: a crash between stores leaves a free slot.
        atomicMemoryFence(ordering: .releasing)
        base.storeBytes(of: SlotState.running.rawValue, toByteOffset: Offset.state, as: UInt32.self)
        return slot
    }

    /// The load's bytes so far, at `at`.
    func update(_ slot: Slot, bytes: Int64, at: Date) {
        slot.base.storeBytes(of: bytes, toByteOffset: Offset.bytes, as: Int64.self)
        slot.base.storeBytes(of: MicrosecondTimestamp.microseconds(at), toByteOffset: Offset.updatedAt, as: Int64.self)
    }

    /// The load's end is on record: the slot is free again. Any thread.
    func release(_ slot: Slot) {
        slot.base.storeBytes(of: SlotState.free.rawValue, toByteOffset: Offset.state, as: UInt32.self)
        slots.withLock { $0.free.append(slot.index) }
    }

    // MARK: What an earlier run left

    struct LeftBehind {
        var slots: [Int]
        var loads: [TransferLog.InFlight]
    }

    /// The loads a daemon that died was running, as open records ending at their last checkpoint.
    func leftBehind() -> LeftBehind {
        slots.withLock { state in
            LeftBehind(slots: state.leftBehind.compactMap(\.index), loads: state.leftBehind.map(\.load))
        }
    }

    /// Those slots' loads are on record: they are free for this run.
    func forget(_ indices: [Int]) {
        slots.withLock { state in
            for index in indices {
                Self.base(of: index, in: state.chunks).storeBytes(of: SlotState.free.rawValue, toByteOffset: Offset.state, as: UInt32.self)
                state.free.append(index)
            }
            state.leftBehind = []
        }
    }

    // MARK: Session numbers

    /// The highest session number handed out, as last stored: exact after a crash of the
    /// process, and after a power cut at least what was last synced.
    var issuedSessionNumber: UInt64 {
        header.base.load(fromByteOffset: HeaderOffset.issuedSession, as: UInt64.self)
    }

    /// The highest session number that may have been handed out, synced.
    var reservedSessionNumber: UInt64 {
        header.base.load(fromByteOffset: HeaderOffset.reservedSession, as: UInt64.self)
    }

    /// A memory store: in the page cache at once, on disk with the next sync.
    func recordIssued(_ number: UInt64) {
        header.base.storeBytes(of: number, toByteOffset: HeaderOffset.issuedSession, as: UInt64.self)
    }

    /// The header (and every slot) as it is now, on disk: a power cut then leaves at least
    /// this session number recorded as handed out.
    func syncIssued() throws(Errno) {
        try file.synchronizeData()
    }

    /// Numbers up to `number` may be handed out once this returns: it is on disk.
    func reserve(through number: UInt64) throws(Errno) {
        try withUnsafeBytes(of: number) { bytes throws(Errno) in try file.writeFully(bytes, at: Int64(HeaderOffset.reservedSession)) }
        try file.synchronizeData()
    }

    /// The slot's load when everything in it is in range; nil for anything else.
    private static func read(_ base: UnsafeRawPointer) -> TransferLog.InFlight? {
        let length = Int(base.load(fromByteOffset: Offset.textLength, as: UInt32.self))
        guard length <= slotSize - Offset.text else { return nil }
        let text = UnsafeRawBufferPointer(start: base + Offset.text, count: length)
        guard text.last == 0 else { return nil }
        let fields = text.split(separator: 0, omittingEmptySubsequences: false).dropLast().map(Array.init)
        guard fields.count == 7, !fields[0].isEmpty, fields.allSatisfy({ $0.count <= fieldLimit }) else { return nil }
        let times = [Offset.loadStartedAt, Offset.updatedAt, Offset.sessionStartedAt].map { base.load(fromByteOffset: $0, as: Int64.self) }
        guard times.allSatisfy({ (0...latestTime).contains($0) }), base.load(fromByteOffset: Offset.bytes, as: Int64.self) >= 0 else {
            return nil
        }
        let strings = fields.map { String(decoding: $0, as: UTF8.self) }
        let teams = fields[5...].map { $0 == [noTeam] ? nil : String(decoding: $0, as: UTF8.self) }
        let date = { (offset: Int) in MicrosecondTimestamp.date(base.load(fromByteOffset: offset, as: Int64.self)) }
        let session = SessionRecord(sessionID: strings[0], sourceApp: strings[1], destinationApp: strings[2],
                                    itemCount: Int(base.load(fromByteOffset: Offset.itemCount, as: UInt32.self)),
                                    operation: strings[4], outcome: SessionRecord.open,
                                    startedAt: date(Offset.sessionStartedAt), endedAt: date(Offset.updatedAt))
        let load = LoadRecord(sessionID: strings[0], loadID: Int64(base.load(fromByteOffset: Offset.loadID, as: UInt32.self)),
                              sourceApp: strings[1], destinationApp: strings[2], typeIdentifier: strings[3],
                              bytes: base.load(fromByteOffset: Offset.bytes, as: Int64.self),
                              startedAt: date(Offset.loadStartedAt), endedAt: date(Offset.updatedAt), outcome: LoadRecord.open,
                              sourceTeam: teams[0], destinationTeam: teams[1])
        return TransferLog.InFlight(session: session, load: load)
    }
}

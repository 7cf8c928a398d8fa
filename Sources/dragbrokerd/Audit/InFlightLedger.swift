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
/// The file also carries the state directory's lock: one daemon per log, so a second one can
/// never take the first one's running loads for leftovers.
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

        var description: String {
            switch self {
            case .locked(let path): "another dragbrokerd is using the state directory (\(path) is locked)"
            case .system(let what, let errno): "\(what): \(errno)"
            }
        }
    }

    static let fileName = "transfers.inflight"
    static let slotSize = 2048
    static let slotsPerChunk = 64
    /// One slot per load in flight; past this many, loads wait for their start record in SQLite.
    static let maximumSlots = 16_384

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

    let path: String
    private let file: FileDescriptor
    private struct Slots {
        var chunks: [SharedMapping] = []
        var free: [Int] = []
    }
    private let slots: Mutex<Slots>

    /// Opens (creating if needed) the ledger in `directory` and takes its lock. Slots a dead
    /// daemon left running are kept as left behind until `forget` says they are on record.
    init(directory: String) throws(OpenError) {
        path = (directory as NSString).appendingPathComponent(Self.fileName)
        do {
            file = try FileDescriptor.openPrivately(path)
        } catch {
            throw .system("cannot open \(path)", error)
        }
        var state = Slots()
        do {
            guard try file.lockExclusively() else {
                file.closeQuietly()
                throw OpenError.locked(path)
            }
            let size = try file.status().size
            let chunkBytes = Self.slotSize * Self.slotsPerChunk
            for chunk in 0..<min(Int(size) / chunkBytes, Self.maximumSlots / Self.slotsPerChunk) {
                state.chunks.append(try SharedMapping(file, offset: Int64(chunk * chunkBytes), count: chunkBytes))
            }
        } catch let error as OpenError {
            throw error
        } catch {
            file.closeQuietly()
            throw .system("cannot map \(path)", error as? Errno ?? .ioError)
        }
        let total = state.chunks.count * Self.slotsPerChunk
        for index in (0..<total).reversed() {
            let base = Self.base(of: index, in: state.chunks)
            switch SlotState(rawValue: base.load(fromByteOffset: Offset.state, as: UInt32.self)) {
            case .running?, .leftBehind?:
                base.storeBytes(of: SlotState.leftBehind.rawValue, toByteOffset: Offset.state, as: UInt32.self)
            case .free?:
                state.free.append(index)
            case nil:
                // Not a slot this daemon wrote: neither trust it nor reuse it.
                break
            }
        }
        slots = Mutex(state)
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
                let chunkBytes = Self.slotSize * Self.slotsPerChunk
                do {
                    try file.reserve(offset: Int64(first * Self.slotSize), length: Int64(chunkBytes))
                    state.chunks.append(try SharedMapping(file, offset: Int64(first * Self.slotSize), count: chunkBytes))
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
            var found = LeftBehind(slots: [], loads: [])
            for index in 0..<state.chunks.count * Self.slotsPerChunk {
                let base = Self.base(of: index, in: state.chunks)
                guard base.load(fromByteOffset: Offset.state, as: UInt32.self) == SlotState.leftBehind.rawValue,
                      let load = Self.read(base) else { continue }
                found.slots.append(index)
                found.loads.append(load)
            }
            return found
        }
    }

    /// Those slots' loads are on record: they are free for this run.
    func forget(_ indices: [Int]) {
        slots.withLock { state in
            for index in indices {
                Self.base(of: index, in: state.chunks).storeBytes(of: SlotState.free.rawValue, toByteOffset: Offset.state, as: UInt32.self)
                state.free.append(index)
            }
        }
    }

    private static func read(_ base: UnsafeMutableRawPointer) -> TransferLog.InFlight? {
        let length = Int(base.load(fromByteOffset: Offset.textLength, as: UInt32.self))
        guard length <= slotSize - Offset.text else { return nil }
        let text = UnsafeRawBufferPointer(start: base + Offset.text, count: length)
        let fields = text.split(separator: 0, omittingEmptySubsequences: false).dropLast().map(Array.init)
        guard fields.count == 7 else { return nil }
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

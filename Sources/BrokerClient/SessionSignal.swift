import BrokerProtocol
import BusKit

/// How many events a session's or a pasteboard entry's `events` keeps for a reader that has
/// not come for them: the newest, which always include the end. An app that never reads them
/// holds no more than this however many loads and pastes it serves or makes.
let unreadEventLimit = 256

/// A session signal the broker sent this connection, decoded on the event loop where the
/// message arrived: sessions only ever see these values, never the message.
enum SessionSignal: Sendable, Equatable {
    case willEnd(DropOperation)
    /// `Ended(operation, error, message)`; an empty error name means success.
    case ended(DropOperation, BrokerError?)
    case loadProgress(load: UInt32, bytes: UInt64, expected: UInt64?)
    case loadFinished(load: UInt32, LoadOutcome)
    case transferFinished
    /// An app pasted this pasteboard entry: the paste's path and the app's ID.
    case pasted(path: String, app: String)

    /// Decodes `member`'s arguments; nil for a member this library does not know, or malformed
    /// arguments.
    init?(member: String, _ m: Message) {
        do throws(BusError) {
            switch SessionMember(rawValue: member) {
            case .willEnd:
                guard let operation = DropOperation(rawValue: try m.readString()) else { return nil }
                self = .willEnd(operation)
            case .ended:
                guard let operation = DropOperation(rawValue: try m.readString()) else { return nil }
                self = .ended(operation, Self.error(name: try m.readString(), message: try m.readString()))
            case .loadProgress:
                let load = try m.readUInt32(), bytes = try m.readUInt64(), expected = try m.readUInt64()
                self = .loadProgress(load: load, bytes: bytes, expected: expected == 0 ? nil : expected)
            case .loadFinished:
                let load = try m.readUInt32(), bytes = try m.readUInt64()
                let error = Self.error(name: try m.readString(), message: try m.readString())
                self = .loadFinished(load: load, LoadOutcome(bytes: bytes, error: error))
            case .transferFinished:
                self = .transferFinished
            case .pasted:
                self = .pasted(path: try m.readObjectPath(), app: try m.readString())
            default:
                return nil
            }
        } catch {
            return nil
        }
    }

    private static func error(name: String, message: String) -> BrokerError? {
        name.isEmpty ? nil : BrokerError(BusError(name: name, message: message))
    }
}

/// How the broker says one load ended: the bytes it delivered, and why it stopped early.
struct LoadOutcome: Sendable, Equatable {
    var bytes: UInt64
    var error: BrokerError?
}

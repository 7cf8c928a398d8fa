import CSystemd
import Glibc

/// An error that travels over the bus: a D-Bus error name and a message a developer can act on.
public struct BusError: Error, Equatable, Sendable, CustomStringConvertible {
    public var name: String
    public var message: String

    public init(name: String, message: String) {
        self.name = name
        self.message = message
    }

    public var description: String { "\(name): \(message)" }

    /// A failed libsystemd call, which returns `-errno`.
    static func system(_ negativeErrno: Int32, _ what: String) -> BusError {
        let text = String(cString: strerror(-negativeErrno))
        return BusError(name: "System.Error.\(errnoName(-negativeErrno))", message: "\(what) failed: \(text)")
    }

    /// Decodes the error carried by an `sd_bus_error`.
    init(_ error: UnsafePointer<sd_bus_error>) {
        let name = error.pointee.name.map { String(cString: $0) } ?? "org.freedesktop.DBus.Error.Failed"
        let message = error.pointee.message.map { String(cString: $0) } ?? ""
        self.init(name: name, message: message)
    }

    /// Fills an `sd_bus_error` and returns the negative errno sd-bus expects from a handler.
    func fill(_ target: UnsafeMutablePointer<sd_bus_error>?) -> Int32 {
        shim_bus_error_set(target, name, message)
    }
}

/// Checks a libsystemd return value, turning `-errno` into a `BusError`.
@discardableResult
func check(_ result: Int32, _ what: @autoclosure () -> String) throws(BusError) -> Int32 {
    if result < 0 { throw BusError.system(result, what()) }
    return result
}

/// The symbolic errno name (`EPIPE`), as sd-bus uses in its `System.Error.*` names.
func errnoName(_ code: Int32) -> String {
    switch code {
    case EBADF: "EBADF"
    case EPIPE: "EPIPE"
    case EINVAL: "EINVAL"
    case ENOENT: "ENOENT"
    case EACCES: "EACCES"
    case EPERM: "EPERM"
    case ETIMEDOUT: "ETIMEDOUT"
    case EAGAIN: "EAGAIN"
    case ECONNRESET: "ECONNRESET"
    case ENOTCONN: "ENOTCONN"
    case ENOMEM: "ENOMEM"
    case EIO: "EIO"
    case EEXIST: "EEXIST"
    default: "E\(code)"
    }
}

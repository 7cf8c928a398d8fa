import Synchronization

/// A value behind a mutex, shareable across tasks.
final class Locked<Value: ~Copyable>: Sendable where Value: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: consuming sending Value) { mutex = Mutex(value) }
    func withLock<T>(_ body: (inout sending Value) throws -> sending T) rethrows -> sending T {
        try mutex.withLock(body)
    }
}

/// A value that only its event loop's thread may touch (see `EventLoop`), after swift-nio's
/// `NIOLoopBound`: it is `Sendable`, so it may travel with a task or a closure, and every
/// access checks the thread, in release builds too, instead of trusting a comment. Use it for
/// state that sd-bus callbacks and a loop-isolated actor share, never for values other
/// threads need: decode those on the loop and send the decoded values.
public struct LoopBound<Value>: @unchecked Sendable {
    public let loop: EventLoop
    private var storage: Value

    public init(_ value: Value, loop: EventLoop) {
        loop.preconditionCurrentOrIdle("LoopBound value created")
        self.loop = loop
        storage = value
    }

    public var value: Value {
        get {
            loop.preconditionCurrentOrIdle("LoopBound value read")
            return storage
        }
        _modify {
            loop.preconditionCurrentOrIdle("LoopBound value changed")
            yield &storage
        }
    }
}

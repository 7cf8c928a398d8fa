/// Bounds on everything a client can make the daemon hold. Each is answered with
/// `LimitExceeded` when reached.
struct Limits: Sendable {
    var sessionsPerConnection = 16
    var sessionsTotal = 1024
    var itemsPerSession = 256
    var representationsPerItem = 32
    var destinationsPerSession = 64
    var concurrentLoadsPerSession = 16
    var typeIdentifierLength = 255
    var suggestedNameLength = 255
    var tokenLength = 128
    /// How long a provider may take to answer a load, in microseconds.
    var providerTimeout: UInt64 = 300 * 1_000_000
}

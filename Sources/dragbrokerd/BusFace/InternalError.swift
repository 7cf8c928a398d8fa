/// The daemon's own failure (a descriptor or random bytes it could not get, a reply it could
/// not send): never the caller's fault, so never answered as a refusal nor recorded as one.
struct InternalError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

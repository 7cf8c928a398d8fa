import Foundation

/// A suggested name is a hint a destination may use as a file name: it must not carry path
/// separators, control characters (including bidirectional overrides), or unbounded length.
enum SuggestedName {
    static func sanitize(_ raw: String, maxBytes: Int) -> String {
        var out = String.UnicodeScalarView()
        for scalar in raw.unicodeScalars {
            switch scalar.properties.generalCategory {
            case .control, .format, .lineSeparator, .paragraphSeparator, .surrogate, .privateUse, .unassigned:
                continue
            default:
                out.append(scalar == "/" || scalar == "\\" ? "_" : scalar)
            }
        }
        var name = String(out).trimmingCharacters(in: .whitespaces)
        if name == "." || name == ".." { name = "_" }
        // Cut at a character boundary so the result stays valid UTF-8.
        while name.utf8.count > maxBytes { name.removeLast() }
        return name
    }
}

@testable import UniformTypes
import XCTest

/// `MimeSyntax.parsePlain` reads the common form byte by byte; `parseGenerally` is the grammar.
/// Whatever the first takes, it must read exactly as the second; whatever it declines goes to
/// the second, which words every refusal.
final class PlainParseTests: XCTestCase {
    func testTheCommonFormsAreTakenAndReadAsTheGrammarReadsThem() throws {
        let longestSubtype = "application/" + String(repeating: "a", count: 127)
        let at255 = "application/x;p=" + String(repeating: "v", count: 255 - 16)
        let eightParameters = "text/plain" + (1...8).map { ";p\($0)=v" }.joined()
        let cases: [(String, ParsedMime)] = [
            // A small string (at most 15 bytes) lives inside the String value itself.
            ("a/b", ParsedMime(type: "a", subtype: "b", parameters: [])),
            ("image/png", ParsedMime(type: "image", subtype: "png", parameters: [])),
            ("Text/Plain;Charset=UTF-8;Format=Flowed",
             ParsedMime(type: "text", subtype: "plain", parameters: [MimeParameter(name: "charset", value: "utf-8"),
                                                                   MimeParameter(name: "format", value: "Flowed")])),
            ("image/svg+xml", ParsedMime(type: "image", subtype: "svg+xml", parameters: [])),
            ("application/vnd.ms-excel", ParsedMime(type: "application", subtype: "vnd.ms-excel", parameters: [])),
            (longestSubtype, ParsedMime(type: "application", subtype: String(repeating: "a", count: 127), parameters: [])),
            (at255, ParsedMime(type: "application", subtype: "x",
                               parameters: [MimeParameter(name: "p", value: String(repeating: "v", count: 239))])),
            (eightParameters, ParsedMime(type: "text", subtype: "plain",
                                         parameters: (1...8).map { MimeParameter(name: "p\($0)", value: "v") })),
        ]
        for (input, expected) in cases {
            XCTAssertEqual(MimeSyntax.parsePlain(input), expected, input)
            XCTAssertEqual(try general(input, wildcards: false), expected, input)
            XCTAssertEqual(try general(input, wildcards: true), expected, input)
        }
    }

    func testEverythingElseIsLeftToTheGrammar() {
        let declined = [
            "", "image", "public.png", "*", "image/*", "*/*", " image/png", "image/png ", "image/ png",
            "text/plain; charset=utf-8", "text/plain;charset=\"utf-8\"", "text/plain;", "text/plain;;a=b",
            "text/plain;charset", "text/plain;charset=", "text/plain;a=b=c", "text/plain;a=b;a=c", "text/plain;A=b;a=c",
            "/png", "image/", "image//png", "image/png/x", "-image/png", "image/-png", "text/plain;-a=b",
            "image/p\u{7F}g", "image/p\tg", "image/pñg", "te(xt/plain", "text/plain;a=b/c",
            "application/" + String(repeating: "a", count: 128),
            "application/x;p=" + String(repeating: "v", count: 256 - 16),
            "text/plain" + (1...9).map { ";p\($0)=v" }.joined(),
        ]
        for input in declined {
            XCTAssertNil(MimeSyntax.parsePlain(input), input)
        }
    }

    /// Every string over an alphabet of the bytes that matter to the grammar, up to a length, and
    /// random longer ones: the two readings never differ.
    func testTheTwoReadingsAgreeOnEveryShortStringAndManyLongOnes() {
        let alphabet: [String] = ["a", "Z", "0", "/", ";", "=", "*", "\"", " ", ".", "-", "+", "(", "\\", "\t", "é"]
        var inputs: [String] = [""]
        var frontier: [String] = [""]
        for _ in 1...4 {
            frontier = frontier.flatMap { prefix in alphabet.map { prefix + $0 } }
            inputs += frontier
        }
        let exhaustive = inputs.count
        var generator = SplitMix(seed: 0x5EED)
        // Longer ones built as type/subtype;name=value…, from fragments of real names, with now and
        // then a fragment of every byte class the grammar treats apart put in anywhere.
        let good = ["text", "plain", "Image", "svg+xml", "x", "0", "!", "#", "$", "&", "-", "^", "_", ".", "+", "UTF-8",
                    String(repeating: "a", count: 60)]
        let bad = ["*", " ", "\"", "(", ")", "<", ">", "@", ",", ":", "\\", "?", "[", "]", "=", "/", ";", "\u{7F}", "\t", "é", ""]
        func pick(_ list: [String]) -> String { list[Int(generator.next() % UInt64(list.count))] }
        func piece() -> String {
            var parts = (0...(generator.next() % 3)).map { _ in pick(good) }
            if generator.next() % 10 == 0 { parts.insert(pick(bad), at: Int(generator.next() % UInt64(parts.count + 1))) }
            return parts.joined()
        }
        for _ in 0..<30_000 {
            let parameters = (0..<(generator.next() % 10)).map { _ in ";" + piece() + "=" + piece() }
            inputs.append(piece() + "/" + piece() + parameters.joined())
        }
        var taken = 0, takenLonger = 0
        for (index, input) in inputs.enumerated() {
            guard let plain = MimeSyntax.parsePlain(input) else { continue }
            if index < exhaustive { taken += 1 } else { takenLonger += 1 }
            XCTAssertEqual(try general(input, wildcards: false), plain, input)
            XCTAssertEqual(try general(input, wildcards: true), plain, input)
        }
        // Of four bytes or fewer, the plain forms are x/y with each name starting with a, Z or 0
        // and going on with those or . - +: 9 of three bytes, 108 of four.
        XCTAssertEqual(taken, 117)
        XCTAssertEqual(takenLonger, 886)
    }

    private func general(_ input: String, wildcards: Bool) throws -> ParsedMime? {
        guard case .mime(let parsed) = try MimeSyntax.parseGenerally(input, wildcards: wildcards, expected: "x") else { return nil }
        return parsed
    }
}

/// A seeded generator, so a failure names an input that is the same on every run.
private struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

import XCTest

@testable import dragctl

/// dragctl's escaping of what clients chose, on exact strings: systemd's `cescape()` for C0 and
/// DEL, `\xNN` per UTF-8 byte for C1, everything else printable as it is.
final class TerminalEscapeTests: XCTestCase {
    func testTitleAndClearScreenSequencesAreEscaped() {
        XCTAssertEqual("a\u{1B}]0;pwn\u{07}\u{1B}[2Jb".escapedForTerminal, #"a\x1b]0;pwn\a\x1b[2Jb"#)
    }

    func testControlCharactersAreEscapedAsSystemdDoes() {
        XCTAssertEqual("\u{07}\u{08}\u{0C}\n\r\t\u{0B}".escapedForTerminal, #"\a\b\f\n\r\t\v"#)
        XCTAssertEqual("\u{00}\u{01}\u{1B}\u{1F}\u{7F}".escapedForTerminal, #"\x00\x01\x1b\x1f\x7f"#)
        XCTAssertEqual("line\r\nnext".escapedForTerminal, #"line\r\nnext"#, "CR LF is two escapes, not one character left raw")
    }

    /// A backslash in the text must not read as an escape dragctl wrote.
    func testBackslashIsDoubled() {
        XCTAssertEqual(#"C:\new"#.escapedForTerminal, #"C:\\new"#)
        XCTAssertEqual(#"\x1b"#.escapedForTerminal, #"\\x1b"#)
    }

    /// U+009B is a one-character CSI to many terminals; all of C1 is written byte by byte.
    func testC1ControlsAreEscapedByteByByte() {
        XCTAssertEqual("\u{9B}2J".escapedForTerminal, #"\xc2\x9b2J"#)
        XCTAssertEqual("\u{80}\u{9F}".escapedForTerminal, #"\xc2\x80\xc2\x9f"#)
    }

    func testPrintableTextStaysAsItIs() {
        for text in ["", "image/png", "/usr/bin/gnome-text-editor", "Résumé é.pdf", "写真 📷.jpg", "\u{A0}\u{A9}", #"say "hi" 'there'"#] {
            XCTAssertEqual(text.escapedForTerminal, text)
        }
    }
}

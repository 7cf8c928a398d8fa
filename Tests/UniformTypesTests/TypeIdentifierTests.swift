import UniformTypes
import XCTest

final class TypeIdentifierTests: XCTestCase {
    func testCanonicalisation() throws {
        let cases: [(String, String)] = [
            ("Text/Plain; Charset=UTF-8", "text/plain;charset=utf-8"),
            ("image/PNG", "image/png"),
            ("  image/png  ", "image/png"),
            ("text/plain ; charset = \"UTF-8\" ; format=Flowed", "text/plain;charset=utf-8;format=Flowed"),
            ("multipart/mixed; Boundary=\"a;b c\"", "multipart/mixed;boundary=\"a;b c\""),
            ("application/vnd.ms-excel", "application/vnd.ms-excel"),
            ("image/svg+xml", "image/svg+xml"),
            ("application/x-shellscript;x=1;y=2", "application/x-shellscript;x=1;y=2"),
        ]
        for (input, expected) in cases {
            XCTAssertEqual(try TypeIdentifier(input).mime, expected, input)
        }
        let type = try TypeIdentifier("Text/Plain; Charset=UTF-8")
        XCTAssertEqual(type.essence, "text/plain")
        XCTAssertEqual(type.description, "text/plain;charset=utf-8")
        XCTAssertEqual(try TypeIdentifier("TEXT/plain"), try TypeIdentifier("text/plain"))
        XCTAssertEqual(Set([try TypeIdentifier("TEXT/plain"), try TypeIdentifier("text/plain")]).count, 1)
    }

    func testLengthLimits() throws {
        let longest = "application/" + String(repeating: "a", count: 127)
        XCTAssertEqual(try TypeIdentifier(longest).mime, longest)
        let at255 = "application/x;p=" + String(repeating: "v", count: 255 - 16)
        XCTAssertEqual(at255.utf8.count, 255)
        XCTAssertEqual(try TypeIdentifier(at255).mime, at255)
        assertRefused(longest + "a",
                      "'\(longest)a' is not a type identifier: the subtype is 128 characters long; at most 127 are allowed")
        let eightParameters = "text/plain" + (1...8).map { ";p\($0)=v" }.joined()
        XCTAssertEqual(try TypeIdentifier(eightParameters).mime, eightParameters)
    }

    func testEveryUTIAlias() throws {
        let aliases: [String: String] = [
            "public.png": "image/png",
            "public.jpeg": "image/jpeg",
            "public.tiff": "image/tiff",
            "com.compuserve.gif": "image/gif",
            "public.heic": "image/heic",
            "org.webmproject.webp": "image/webp",
            "com.microsoft.bmp": "image/bmp",
            "com.adobe.pdf": "application/pdf",
            "public.plain-text": "text/plain",
            "public.utf8-plain-text": "text/plain;charset=utf-8",
            "public.utf16-plain-text": "text/plain;charset=utf-16",
            "public.html": "text/html",
            "public.xhtml": "application/xhtml+xml",
            "public.rtf": "text/rtf",
            "public.json": "application/json",
            "public.xml": "application/xml",
            "public.yaml": "application/yaml",
            "public.url": "text/uri-list",
            "public.file-url": "text/uri-list",
            "public.vcard": "text/vcard",
            "public.mpeg-4": "video/mp4",
            "com.apple.quicktime-movie": "video/quicktime",
            "public.mp3": "audio/mpeg",
            "public.mpeg-4-audio": "audio/mp4",
            "public.zip-archive": "application/zip",
            "public.tar-archive": "application/x-tar",
            "org.gnu.gnu-zip-archive": "application/gzip",
            "public.csv": "text/csv",
            "public.comma-separated-values-text": "text/csv",
            "public.svg-image": "image/svg+xml",
            "public.python-script": "text/x-python",
            "public.shell-script": "application/x-shellscript",
        ]
        for (uti, mime) in aliases {
            XCTAssertEqual(try TypeIdentifier(uti).mime, mime, uti)
            XCTAssertNoThrow(try MimeDatabase.validatePattern(uti), uti)
        }
        XCTAssertEqual(try TypeIdentifier("Public.PNG").mime, "image/png")
        XCTAssertEqual(try TypeIdentifier("public.utf8-plain-text").essence, "text/plain")
    }

    func testMalformedInputsAreRefusedWithExactMessages() {
        let long = "application/" + String(repeating: "a", count: 288)
        XCTAssertEqual(long.utf8.count, 300)
        let nineParameters = "text/plain" + (1...9).map { ";p\($0)=v" }.joined()
        let cases: [(String, String)] = [
            ("", "'' is not a type identifier: it is empty; expected a MIME type such as image/png or a UTI such as public.png"),
            ("   ", "'   ' is not a type identifier: it is empty; expected a MIME type such as image/png or a UTI such as public.png"),
            ("image", "'image' is not a type identifier: expected a MIME type such as image/png or a UTI such as public.png"),
            ("image/", "'image/' is not a type identifier: the subtype after '/' is empty"),
            ("/png", "'/png' is not a type identifier: the type before '/' is empty"),
            ("image/*", "'image/*' is not a type identifier: '*' is a wildcard, allowed only in patterns, not in a concrete type"),
            ("*/*", "'*/*' is not a type identifier: '*' is a wildcard, allowed only in patterns, not in a concrete type"),
            ("*", "'*' is not a type identifier: '*' is a wildcard, allowed only in patterns, not in a concrete type"),
            ("ima ge/png", "'ima ge/png' is not a type identifier: the type 'ima ge' contains whitespace"),
            ("image/ png", "'image/ png' is not a type identifier: the subtype ' png' contains whitespace"),
            ("text/pl\u{7}ain", "'text/pl\\u{7}ain' is not a type identifier: it contains the control character U+0007"),
            ("text/plain\n", "'text/plain\\u{A}' is not a type identifier: it contains the control character U+000A"),
            ("image/pngé", "'image/pngé' is not a type identifier: it contains the non-ASCII character 'é'"),
            (long, "'\(long)' is not a type identifier: it is 300 bytes long; at most 255 are allowed"),
            ("image/p@ng", "'image/p@ng' is not a type identifier: the subtype 'p@ng' contains '@'; only letters, digits and ! # $ & - ^ _ . + are allowed"),
            ("a/b/c", "'a/b/c' is not a type identifier: the subtype 'b/c' contains '/'; only letters, digits and ! # $ & - ^ _ . + are allowed"),
            ("-image/png", "'-image/png' is not a type identifier: the type '-image' must begin with a letter or digit"),
            ("text/plain;", "'text/plain;' is not a type identifier: there is an empty parameter after ';'"),
            ("text/plain;charset", "'text/plain;charset' is not a type identifier: the parameter 'charset' has no value; write it as name=value"),
            ("text/plain;charset=", "'text/plain;charset=' is not a type identifier: the parameter 'charset' has no value after '='"),
            ("text/plain;=utf-8", "'text/plain;=utf-8' is not a type identifier: a parameter has no name before '='"),
            ("text/plain;a=1;A=2", "'text/plain;a=1;A=2' is not a type identifier: the parameter 'a' is given twice"),
            ("text/plain;charset=utf 8", "'text/plain;charset=utf 8' is not a type identifier: the value of parameter 'charset' contains a space; put such values in double quotes"),
            ("text/plain;title=\"abc", "'text/plain;title=\"abc' is not a type identifier: a quoted parameter value is not closed"),
            ("text/plain;charset=\"utf-8\"x", "'text/plain;charset=\"utf-8\"x' is not a type identifier: the value of parameter 'charset' has text after its closing quote"),
            (nineParameters, "'\(nineParameters)' is not a type identifier: it has 9 parameters; at most 8 are allowed"),
            ("text;charset=a/b", "'text;charset=a/b' is not a type identifier: 'text' before the first ';' is not of the form type/subtype, such as image/png"),
            ("public.image", "'public.image' is an abstract type: use it to ask for conformance, not to offer data"),
            ("public.data", "'public.data' is an abstract type: use it to ask for conformance, not to offer data"),
            ("public.audiovisual-content", "'public.audiovisual-content' is an abstract type: use it to ask for conformance, not to offer data"),
            ("com.example.unknown", "'com.example.unknown' is not a type identifier: it is not a UTI with a known MIME type; use the MIME type itself, such as image/png"),
        ]
        for (input, message) in cases {
            assertRefused(input, message)
        }
    }

    func testPatternValidation() {
        for pattern in ["image/*", "*/*", "*", "TEXT/*", "public.image", "public.item", "public.png",
                        "text/plain;charset=utf-8", "text/*;charset=utf-8", "application/x-pdf"] {
            XCTAssertNoThrow(try MimeDatabase.validatePattern(pattern), pattern)
        }
        let expected = "expected a MIME type such as image/png, a wildcard such as image/* or */*, or a UTI such as public.image"
        let cases: [(String, String)] = [
            ("", "'' is not a type pattern: it is empty; \(expected)"),
            ("images", "'images' is not a type pattern: \(expected)"),
            ("*/png", "'*/png' is not a type pattern: a wildcard type needs a wildcard subtype, as in */*"),
            ("image/pn*", "'image/pn*' is not a type pattern: a wildcard must stand for a whole type or subtype, as in image/* or */*"),
            ("image*", "'image*' is not a type pattern: a wildcard must stand for a whole type or subtype, as in image/* or */*"),
            ("image /*", "'image /*' is not a type pattern: the type 'image ' contains whitespace"),
            ("com.example.unknown", "'com.example.unknown' is not a type pattern: it is not a UTI this system knows; use a MIME type or wildcard instead, such as image/*"),
        ]
        for (pattern, message) in cases {
            XCTAssertThrowsError(try MimeDatabase.validatePattern(pattern), pattern) { error in
                XCTAssertEqual((error as? TypeIdentifierError)?.message, message, pattern)
                XCTAssertEqual((error as? TypeIdentifierError)?.description, message, pattern)
            }
        }
    }

    private func assertRefused(_ input: String, _ message: String, line: UInt = #line) {
        XCTAssertThrowsError(try TypeIdentifier(input), input, line: line) { error in
            XCTAssertEqual(error as? TypeIdentifierError, TypeIdentifierError(message: message), line: line)
        }
    }
}

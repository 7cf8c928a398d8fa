import Foundation
import UniformTypes
import XCTest

final class MimeDatabaseTests: XCTestCase {
    private let database = MimeDatabase(
        subclasses: [
            "application/x-child": ["application/x-parent"],
            "application/x-parent": ["application/x-grand"],
            "text/x-foo": ["application/x-executable"],
            "inode/mount-point": ["inode/directory"],
        ],
        aliases: ["application/x-old": "application/x-child"]
    )

    private func type(_ raw: String) throws -> TypeIdentifier { try TypeIdentifier(raw) }

    func testAParentNamedByItsAliasIsASupertypeUnderItsCanonicalName() throws {
        let aliased = MimeDatabase(subclasses: ["application/x-child": ["application/x-old-parent"]],
                                   aliases: ["application/x-old-parent": "application/x-parent"])
        let child = try type("application/x-child")
        XCTAssertTrue(aliased.conforms(child, to: "application/x-parent"))
        XCTAssertTrue(aliased.conforms(child, to: "application/x-old-parent"))
        XCTAssertFalse(aliased.conforms(try type("application/x-parent"), to: "application/x-child"))
    }

    func testSupertypesIncludeImplicitRules() {
        XCTAssertEqual(database.supertypes(of: "application/x-child"),
                       ["application/x-parent", "application/x-grand", "application/octet-stream"])
        XCTAssertEqual(database.supertypes(of: "text/x-foo"),
                       ["application/x-executable", "text/plain", "application/octet-stream"])
        XCTAssertEqual(database.supertypes(of: "text/plain"), ["application/octet-stream"])
        XCTAssertEqual(database.supertypes(of: "application/octet-stream"), [])
        XCTAssertEqual(database.supertypes(of: "inode/mount-point"), ["inode/directory"])
        XCTAssertEqual(database.supertypes(of: "inode/directory"), [])
        XCTAssertEqual(database.supertypes(of: "image/x-foo+xml"), ["application/xml", "application/octet-stream"])
        XCTAssertEqual(database.supertypes(of: "application/x-foo+json"), ["application/json", "application/octet-stream"])
        XCTAssertEqual(database.supertypes(of: "application/xml"), ["application/octet-stream"])
    }

    func testAliases() throws {
        XCTAssertEqual(database.canonical("Application/X-Old"), "application/x-child")
        XCTAssertEqual(database.canonical("application/x-child"), "application/x-child")
        XCTAssertEqual(database.supertypes(of: "application/x-old"), database.supertypes(of: "application/x-child"))
        XCTAssertTrue(database.conforms(try type("application/x-old"), to: "application/x-grand"))
        XCTAssertTrue(database.conforms(try type("application/x-child"), to: "application/x-old"))
        XCTAssertTrue(database.conforms(try type("application/x-old"), to: "application/x-child"))
    }

    func testConformanceWithHandcraftedDatabase() throws {
        let child = try type("application/x-child")
        XCTAssertTrue(database.conforms(child, to: "application/x-child"))
        XCTAssertTrue(database.conforms(child, to: "Application/X-Parent"))
        XCTAssertTrue(database.conforms(child, to: "application/octet-stream"))
        XCTAssertTrue(database.conforms(child, to: "application/*"))
        XCTAssertFalse(database.conforms(try type("application/x-grand"), to: "application/x-child"))

        let foo = try type("text/x-foo")
        XCTAssertTrue(database.conforms(foo, to: "text/plain"))
        XCTAssertTrue(database.conforms(foo, to: "text/*"))
        XCTAssertTrue(database.conforms(foo, to: "application/*"), "through application/x-executable")
        XCTAssertTrue(database.conforms(foo, to: "public.plain-text"))
        XCTAssertTrue(database.conforms(foo, to: "public.text"))

        // Every stream is application/octet-stream, but that alone must not make it application/*.
        let png = try type("image/png")
        XCTAssertTrue(database.conforms(png, to: "application/octet-stream"))
        XCTAssertFalse(database.conforms(png, to: "application/*"))
        XCTAssertTrue(database.conforms(try type("application/octet-stream"), to: "application/*"))

        let directory = try type("inode/directory")
        XCTAssertTrue(database.conforms(directory, to: "*"))
        XCTAssertTrue(database.conforms(directory, to: "*/*"))
        XCTAssertTrue(database.conforms(directory, to: "public.item"))
        XCTAssertFalse(database.conforms(directory, to: "application/octet-stream"))
        XCTAssertTrue(database.conforms(try type("inode/mount-point"), to: "inode/directory"))

        let svg = try type("image/svg+xml")
        XCTAssertTrue(database.conforms(svg, to: "application/xml"))
        XCTAssertTrue(database.conforms(svg, to: "public.xml"))
        XCTAssertTrue(database.conforms(try type("application/ld+json"), to: "public.json"))
    }

    func testAbstractUTIPatterns() throws {
        let png = try type("image/png"), mp3 = try type("audio/mpeg"), mp4 = try type("video/mp4")
        let text = try type("text/plain")
        for pattern in ["public.item", "public.data", "public.content"] {
            for t in [png, mp3, mp4, text] { XCTAssertTrue(database.conforms(t, to: pattern), "\(t) \(pattern)") }
        }
        XCTAssertTrue(database.conforms(png, to: "public.image"))
        XCTAssertFalse(database.conforms(text, to: "public.image"))
        XCTAssertTrue(database.conforms(text, to: "public.text"))
        XCTAssertFalse(database.conforms(png, to: "public.text"))
        XCTAssertTrue(database.conforms(mp3, to: "public.audio"))
        XCTAssertFalse(database.conforms(mp4, to: "public.audio"))
        XCTAssertTrue(database.conforms(mp4, to: "public.movie"))
        XCTAssertFalse(database.conforms(mp3, to: "public.movie"))
        XCTAssertTrue(database.conforms(mp3, to: "public.audiovisual-content"))
        XCTAssertTrue(database.conforms(mp4, to: "public.audiovisual-content"))
        XCTAssertFalse(database.conforms(png, to: "public.audiovisual-content"))
        XCTAssertTrue(database.conforms(png, to: "public.png"))
        XCTAssertFalse(database.conforms(png, to: "public.jpeg"))
    }

    func testParameterRules() throws {
        let utf8 = try type("text/plain;charset=utf-8")
        let plain = try type("text/plain")
        XCTAssertTrue(database.conforms(utf8, to: "text/plain"))
        XCTAssertFalse(database.conforms(plain, to: "text/plain;charset=utf-8"))
        XCTAssertTrue(database.conforms(utf8, to: "text/plain; Charset=\"UTF-8\""))
        XCTAssertFalse(database.conforms(try type("text/plain;charset=utf-16"), to: "text/plain;charset=utf-8"))
        XCTAssertTrue(database.conforms(try type("text/plain;format=flowed;charset=utf-8"), to: "text/plain;charset=utf-8"))
        XCTAssertTrue(database.conforms(try type("text/x-foo;charset=utf-8"), to: "public.utf8-plain-text"))
        XCTAssertFalse(database.conforms(plain, to: "public.utf8-plain-text"))
        XCTAssertTrue(database.conforms(utf8, to: "text/*;charset=utf-8"))
        XCTAssertFalse(database.conforms(plain, to: "text/*;charset=utf-8"))
    }

    /// The one rule's ranking: the exact type, then the same type with parameters the request
    /// leaves out, then a subtype, wildcard or abstract UTI; ties go to the earlier pattern,
    /// then to the earlier listed type.
    func testSelectPrefersTheClosestMatchThenTheFirstListed() throws {
        func select(_ listed: [String], _ patterns: [String]) throws -> String? {
            database.select(among: listed, for: try patterns.map(TypePattern.init)).map { listed[$0] }
        }
        let note = ["text/html", "text/plain;charset=iso-8859-1", "text/plain;charset=utf-8"]
        XCTAssertEqual(try select(note, ["text/plain"]), "text/plain;charset=iso-8859-1", "the first listed of two charsets")
        XCTAssertEqual(try select(note, ["text/plain;charset=utf-8"]), "text/plain;charset=utf-8")
        XCTAssertEqual(try select(note, ["public.utf8-plain-text"]), "text/plain;charset=utf-8")
        XCTAssertEqual(try select(note, ["text/*"]), "text/html", "every text type only conforms to text/*: the first listed")
        XCTAssertEqual(try select(note, ["public.text"]), "text/html")
        XCTAssertNil(try select(note, ["text/plain;charset=utf-16"]))
        XCTAssertNil(try select(note, ["image/png"]))
        XCTAssertEqual(try select(note, ["image/png", "text/plain"]), "text/plain;charset=iso-8859-1", "a later pattern when the first matches nothing")

        let withExact = ["text/plain;charset=utf-8;format=flowed", "text/plain;charset=utf-8"]
        XCTAssertEqual(try select(withExact, ["text/plain;charset=utf-8"]), "text/plain;charset=utf-8", "the exact type over the first listed")
        XCTAssertEqual(try select(withExact, ["text/plain"]), "text/plain;charset=utf-8;format=flowed")

        XCTAssertEqual(try select(["application/x-child", "application/x-parent"], ["application/x-parent"]), "application/x-parent",
                       "the type itself over a subtype listed before it")
        XCTAssertEqual(try select(["application/x-child"], ["application/x-parent"]), "application/x-child")
        XCTAssertEqual(try select(["application/x-old"], ["application/x-child"]), "application/x-old", "an alias is its canonical type")
        XCTAssertEqual(try select(["text/html", "text/plain"], ["text/html", "text/plain"]), "text/html", "the reader's order among exact matches")
        XCTAssertEqual(try select(["text/html", "text/plain"], ["text/*", "text/plain"]), "text/plain", "an exact match over an earlier wildcard")
        XCTAssertEqual(try select(["not a type", "image/png"], ["*/*"]), "image/png", "a listed type that does not parse is skipped")
        XCTAssertNil(try select([], ["*/*"]))
        XCTAssertNil(try select(["image/png"], []))
    }

    func testMatchNamesTheCloseness() throws {
        XCTAssertEqual(database.match(try type("text/plain;charset=utf-8"), to: try TypePattern("text/plain;charset=UTF-8")), .exact)
        XCTAssertEqual(database.match(try type("text/plain;charset=utf-8"), to: try TypePattern("text/plain")), .parameters)
        XCTAssertEqual(database.match(try type("text/x-foo"), to: try TypePattern("text/plain")), .conforming)
        XCTAssertEqual(database.match(try type("image/png"), to: try TypePattern("public.png")), .exact)
        XCTAssertEqual(database.match(try type("image/png"), to: try TypePattern("*")), .conforming)
        XCTAssertNil(database.match(try type("text/plain"), to: try TypePattern("text/plain;charset=utf-8")))
        XCTAssertThrowsError(try TypePattern("public.no-such-thing")) { error in
            XCTAssertEqual((error as? TypeIdentifierError)?.message, "'public.no-such-thing' is not a type pattern: "
                + "it is not a UTI this system knows; use a MIME type or wildcard instead, such as image/*")
        }
    }

    func testUnparseablePatternsConformToNothing() throws {
        let png = try type("image/png")
        for pattern in ["", "image", "*/png", "image/p*", "com.example.unknown", "image/png;", "ima ge/*"] {
            XCTAssertFalse(database.conforms(png, to: pattern), pattern)
        }
    }

    func testCyclesTerminate() throws {
        let cyclic = MimeDatabase(
            subclasses: [
                "application/x-a": ["application/x-b"],
                "application/x-b": ["application/x-c"],
                "application/x-c": ["application/x-a"],
                "application/x-self": ["application/x-self"],
            ],
            aliases: ["application/x-p": "application/x-q", "application/x-q": "application/x-p"]
        )
        XCTAssertEqual(cyclic.supertypes(of: "application/x-a"),
                       ["application/x-b", "application/x-c", "application/octet-stream"])
        XCTAssertEqual(cyclic.supertypes(of: "application/x-self"), ["application/octet-stream"])
        XCTAssertTrue(cyclic.conforms(try type("application/x-b"), to: "application/x-a"))
        XCTAssertFalse(cyclic.conforms(try type("application/x-a"), to: "application/x-unrelated"))
        XCTAssertFalse(cyclic.conforms(try type("application/x-a"), to: "image/*"))
        XCTAssertEqual(cyclic.canonical("application/x-p"), "application/x-q")
        XCTAssertEqual(cyclic.supertypes(of: "application/x-p"), ["application/octet-stream"])
    }

    func testLoadSkipsMalformedLinesAndMissingFiles() throws {
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("uniformtypes-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try """
        application/x-child application/x-parent
        application/x-lonely

        application/x-three fields here
        Application/X-Child\tapplication/x-second

        """.write(to: directory.appendingPathComponent("subclasses"), atomically: true, encoding: .utf8)

        let withoutAliases = try MimeDatabase.load(directory: directory.path)
        XCTAssertEqual(withoutAliases.supertypes(of: "application/x-child"),
                       ["application/x-parent", "application/x-second", "application/octet-stream"])
        XCTAssertEqual(withoutAliases.supertypes(of: "application/x-three"), ["application/octet-stream"])
        XCTAssertEqual(withoutAliases.canonical("application/x-old"), "application/x-old")

        try "application/x-old application/x-child\nbroken\n"
            .write(to: directory.appendingPathComponent("aliases"), atomically: true, encoding: .utf8)
        let withAliases = try MimeDatabase.load(directory: directory.path)
        XCTAssertEqual(withAliases.canonical("application/x-old"), "application/x-child")
        XCTAssertEqual(withAliases.canonical("broken"), "broken")

        let empty = try MimeDatabase.load(directory: directory.appendingPathComponent("absent").path)
        XCTAssertEqual(empty.supertypes(of: "text/x-python"), ["text/plain", "application/octet-stream"])
    }
}

/// Against the real shared-mime-info database; every relation used here was checked in
/// /usr/share/mime/subclasses and /usr/share/mime/aliases of Debian's shared-mime-info.
final class SystemMimeDatabaseTests: XCTestCase {
    override func setUpWithError() throws {
        try XCTSkipUnless(FileManager.default.fileExists(atPath: "/usr/share/mime/subclasses"),
                          "shared-mime-info is not installed")
    }

    func testRealHierarchy() throws {
        let db = MimeDatabase.system
        let python = try TypeIdentifier("text/x-python")
        XCTAssertTrue(db.conforms(python, to: "text/plain"))
        XCTAssertTrue(db.conforms(python, to: "application/x-executable"))
        XCTAssertTrue(db.conforms(try TypeIdentifier("text/x-python3"), to: "public.python-script"))

        let svg = try TypeIdentifier("image/svg+xml")
        XCTAssertTrue(db.conforms(svg, to: "application/xml"))
        XCTAssertTrue(db.conforms(svg, to: "public.image"))
        XCTAssertTrue(db.conforms(svg, to: "image/*"))
        XCTAssertTrue(db.conforms(svg, to: "text/*"), "shared-mime-info makes application/xml a subclass of text/plain")

        let tarball = try TypeIdentifier("application/x-compressed-tar")
        XCTAssertTrue(db.conforms(tarball, to: "application/gzip"))
        XCTAssertTrue(db.conforms(tarball, to: "application/x-gzip"), "alias in the pattern")
        XCTAssertTrue(db.conforms(tarball, to: "org.gnu.gnu-zip-archive"))

        let png = try TypeIdentifier("image/png")
        XCTAssertTrue(db.conforms(png, to: "public.image"))
        XCTAssertTrue(db.conforms(png, to: "public.data"))
        XCTAssertFalse(db.conforms(png, to: "text/*"))
        XCTAssertFalse(db.conforms(png, to: "public.text"))

        let shell = try TypeIdentifier("application/x-shellscript")
        XCTAssertTrue(db.conforms(shell, to: "text/plain"))
        XCTAssertTrue(db.conforms(shell, to: "public.text"))
    }

    /// `match` skips the walk up the hierarchy for a wanted type that is nobody's supertype: over
    /// every type the database names, as child, parent or alias, an exact pattern conforms
    /// exactly when the walk finds it.
    func testTheShortcutPastTypesThatAreNobodysSupertypeAnswersAsTheWalk() throws {
        var names: Set<String> = ["text/x-unlisted", "application/x-unlisted+xml", "image/x-unlisted+json"]
        for file in ["subclasses", "aliases"] {
            let text = try String(contentsOfFile: "/usr/share/mime/" + file, encoding: .utf8)
            names.formUnion(text.split(whereSeparator: \.isWhitespace).map { $0.lowercased() })
        }
        let db = try MimeDatabase.load()
        let all = names.sorted()
        let wanted = all.enumerated().filter { $0.offset % 7 == 0 }.map(\.element)
            + ["text/plain", "application/xml", "application/json", "application/octet-stream", "application/x-gzip"]
        var conforming = 0
        for listed in all {
            guard let type = try? TypeIdentifier(listed) else { continue }
            let supertypes = Set(db.supertypes(of: type.essence))
            for pattern in wanted {
                let canonical = db.canonical(pattern)
                let walked = canonical == db.canonical(type.essence) || supertypes.contains(canonical)
                XCTAssertEqual(db.conforms(type, to: pattern), walked, "\(listed) to \(pattern)")
                if walked && canonical != db.canonical(type.essence) { conforming += 1 }
            }
        }
        XCTAssertGreaterThan(conforming, 1000, "pairs where only the walk says yes")
    }

    func testRealAliases() throws {
        let db = try MimeDatabase.load()
        XCTAssertEqual(db.canonical("application/x-pdf"), "application/pdf")
        XCTAssertEqual(db.canonical("application/x-gzip"), "application/gzip")
        XCTAssertTrue(db.conforms(try TypeIdentifier("application/x-pdf"), to: "com.adobe.pdf"))
        XCTAssertTrue(db.conforms(try TypeIdentifier("image/pdf"), to: "application/pdf"))
        XCTAssertFalse(db.conforms(try TypeIdentifier("application/x-pdf"), to: "public.image"))
    }
}

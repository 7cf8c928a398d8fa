import BrokerProtocol
import Foundation
import XCTest

/// Typed objects between two real processes: values registered with `ItemProvider(object:)`
/// on one side, `canLoadObjects`/`loadObjects` on the other, through the real daemon.
final class TypedObjectTests: XCTestCase {
    static let threeObjects = #"[{"string":"grüße, drop"},{"data":"AAEC/f7/"},{"file":"notes.txt","text":"line one\nline two\n"}]"#

    func testStringDataAndFileURLArriveWithExactBytes() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, path) = try source.beginObjects(Self.threeObjects)
        XCTAssertEqual(destination.run("present \(token)"), "OK \(path)")
        XCTAssertEqual(destination.run("items"), "OK ["
            + #"{"preferredHeight":0,"preferredWidth":0,"suggestedName":"","typeIdentifiers":["text\/plain;charset=utf-8","text\/plain"]},"#
            + #"{"preferredHeight":0,"preferredWidth":0,"suggestedName":"","typeIdentifiers":["application\/octet-stream"]},"#
            + #"{"preferredHeight":0,"preferredWidth":0,"suggestedName":"notes.txt","typeIdentifiers":["text\/plain"]}]"#,
                       "each object's types in its order; a file URL typed by its extension and named by its file")
        XCTAssertEqual(destination.run("canload String"), "OK true")
        XCTAssertEqual(destination.run("canload Data"), "OK true")
        XCTAssertEqual(destination.run("canload URL"), "OK true")
        XCTAssertEqual(destination.run("loadobjects String"), err(.wrongState, "Loads are allowed only after PerformDrop"))
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")

        // The file is text/plain too, so it reads as a String; the raw bytes do not.
        XCTAssertEqual(destination.run("loadobjects String"), #"OK ["grüße, drop","line one\nline two\n"]"#)
        XCTAssertTrue(source.waitFor("EVENT loadRequested 1 0 text/plain;charset=utf-8"), source.stdout.text)
        XCTAssertTrue(source.waitFor("EVENT loadRequested 2 2 text/plain"), source.stdout.text)

        // Every representation is a byte stream: Data reads each item's best one.
        XCTAssertEqual(destination.run("loadobjects Data"),
                       "OK [\"\(base64("grüße, drop"))\",\"AAEC/f7/\",\"\(base64("line one\nline two\n"))\"]")
        XCTAssertTrue(source.waitFor("EVENT loadRequested 3 0 text/plain;charset=utf-8"), source.stdout.text)
        XCTAssertTrue(source.waitFor("EVENT loadRequested 4 1 application/octet-stream"), source.stdout.text)
        XCTAssertTrue(source.waitFor("EVENT loadRequested 5 2 text/plain"), source.stdout.text)

        // URLs are temporary files: the file keeps its name, items without one are "item".
        XCTAssertEqual(destination.run("loadobjects URL"), "OK ["
            + "{\"contents\":\"\(base64("grüße, drop"))\",\"name\":\"item\",\"temporary\":\"true\"},"
            + "{\"contents\":\"AAEC/f7/\",\"name\":\"item\",\"temporary\":\"true\"},"
            + "{\"contents\":\"\(base64("line one\nline two\n"))\",\"name\":\"notes.txt\",\"temporary\":\"true\"}]")
        XCTAssertTrue(source.waitFor("EVENT loadRequested 8 2 text/plain"), source.stdout.text)

        // The file URL was registered as a file representation: the read-only file itself.
        XCTAssertEqual(destination.run("loadfile 2 text/plain"), "OK 18 readonly \(base64("line one\nline two\n"))")
        XCTAssertEqual(destination.run("conclude"), "OK")
        XCTAssertTrue(source.waitFor("EVENT transferFinished"), source.stdout.text)
    }

    func testNothingLoadsForATypeNoItemOffers() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.beginObjects(
            #"[{"data":"AAEC"},{"file":"photo.png","text":"not really a png"},{"file":"backup.TAR.GZ"},{"file":"blob.zzqx"}]"#)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("items"), "OK ["
            + #"{"preferredHeight":0,"preferredWidth":0,"suggestedName":"","typeIdentifiers":["application\/octet-stream"]},"#
            + #"{"preferredHeight":0,"preferredWidth":0,"suggestedName":"photo.png","typeIdentifiers":["image\/png"]},"#
            + #"{"preferredHeight":0,"preferredWidth":0,"suggestedName":"backup.TAR.GZ","typeIdentifiers":["application\/x-compressed-tar"]},"#
            + #"{"preferredHeight":0,"preferredWidth":0,"suggestedName":"blob.zzqx","typeIdentifiers":["application\/octet-stream"]}]"#,
                       "the longest extension wins, without regard to case; an unknown one is octet-stream")
        XCTAssertEqual(destination.run("canload String"), "OK false")
        XCTAssertEqual(destination.run("canload Data"), "OK true")
        XCTAssertEqual(destination.run("canload URL"), "OK true")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("loadobjects String"), "OK []")
        XCTAssertEqual(destination.run("loadobjects URL"), "OK ["
            + #"{"contents":"AAEC","name":"item","temporary":"true"},"#
            + "{\"contents\":\"\(base64("not really a png"))\",\"name\":\"photo.png\",\"temporary\":\"true\"},"
            + #"{"contents":"","name":"backup.TAR.GZ","temporary":"true"},"#
            + #"{"contents":"","name":"blob.zzqx","temporary":"true"}]"#)
        XCTAssertEqual(source.lines(startingWith: "EVENT loadRequested", count: 4), [
            "EVENT loadRequested 1 0 application/octet-stream", "EVENT loadRequested 2 1 image/png",
            "EVENT loadRequested 3 2 application/x-compressed-tar", "EVENT loadRequested 4 3 application/octet-stream",
        ], "the String load asked the source for nothing")
    }

    func testALinkIsAURIListThatReadsAsText() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.beginObjects(#"[{"url":"https://example.com/page?q=1"}]"#)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("items"),
                       #"OK [{"preferredHeight":0,"preferredWidth":0,"suggestedName":"","typeIdentifiers":["text\/uri-list"]}]"#)
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("loadobjects String"), #"OK ["https://example.com/page?q=1\r\n"]"#)
    }

    func testStringPrefersTheTypeItNamesAndRefusesTextItCannotDecode() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let destination = try world.peer("destination-app")
        let (token, _) = try source.begin(#"{"items":["#
            + #"{"reps":[{"type":"text/html","text":"<p>hi</p>"},{"type":"text/plain","text":"hi"}]},"#
            + #"{"reps":[{"type":"image/png","size":4}]},"#
            + #"{"reps":[{"type":"text/x-python","text":"print(1)"}]}]}"#)
        _ = destination.run("present \(token)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("loadobjects String"), #"OK ["hi","print(1)"]"#)
        XCTAssertEqual(source.handlerCalls, ["HANDLER 0 text/plain", "HANDLER 2 text/x-python"],
                       "text/plain named exactly beats the HTML listed first; Python is text; the image is skipped")

        let (undecodable, _) = try source.begin(#"{"items":[{"reps":[{"type":"text/plain","size":8}]}]}"#)
        _ = destination.run("present \(undecodable)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("loadobjects String"),
                       err(.failed, "Item 0's 'text/plain' does not make a String: The 8 bytes of 'text/plain' are not valid utf-8"),
                       "byte 4 is 0x83, which no UTF-8 character begins with: refused, never replaced")

        let (koi8, _) = try source.begin(#"{"items":[{"reps":[{"type":"text/plain;charset=koi8-r","text":"x"}]}]}"#)
        _ = destination.run("present \(koi8)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("loadobjects String"),
                       err(.failed, "Item 0's 'text/plain;charset=koi8-r' does not make a String: "
                           + "The charset 'koi8-r' of 'text/plain;charset=koi8-r' is not one String reads"))

        // A source that fails ends the whole load with its own error, by name.
        let (failing, _) = try source.begin(#"{"items":[{"reps":[{"type":"text/plain","text":"ok"}]},{"reps":[{"type":"text/plain","fail":"render failed"}]}]}"#)
        _ = destination.run("present \(failing)")
        XCTAssertEqual(destination.run("enter copy"), "OK copy")
        XCTAssertEqual(destination.run("drop"), "OK copy")
        XCTAssertEqual(destination.run("loadobjects URL"),
                       err(.providerFailed, "The source failed to provide the data: \(BrokerErrorCode.providerFailed.busName): render failed"))
    }

    func testAStringTheDestinationMayNotSeeIsNotLoadable() throws {
        let world = try World()
        let source = try world.peer("source-app")
        let stranger = try world.peer("destination-app")
        let (hiddenToken, _) = try source.beginObjects(#"[{"string":"app only","visibility":"app"}]"#)
        _ = stranger.run("present \(hiddenToken)")
        XCTAssertEqual(stranger.run("items"), "OK []")
        XCTAssertEqual(stranger.run("canload String"), "OK false")
        XCTAssertEqual(stranger.run("canload Data"), "OK false")
        XCTAssertEqual(stranger.run("canload URL"), "OK false")
        XCTAssertEqual(stranger.run("enter copy"), "OK cancel", "nothing it may take: no policy refused it")

        // The same app sees it: visibility, not the object, decided.
        let sibling = try world.peer("source-app")
        _ = sibling.run("present \(hiddenToken)")
        XCTAssertEqual(sibling.run("canload String"), "OK true")
        XCTAssertEqual(source.run("cancel"), "OK")

        // Beside a String it may see, the hidden one is skipped, and never asked for.
        let (token, _) = try source.beginObjects(#"[{"string":"app only","visibility":"app"},{"string":"for everyone"}]"#)
        _ = stranger.run("present \(token)")
        XCTAssertEqual(stranger.run("canload String"), "OK true")
        XCTAssertEqual(stranger.run("enter copy"), "OK copy")
        XCTAssertEqual(stranger.run("drop"), "OK copy")
        XCTAssertEqual(stranger.run("loadobjects String"), #"OK ["for everyone"]"#)
        XCTAssertEqual(stranger.run("loadobjects Data"), "OK [\"\(base64("for everyone"))\"]")
        XCTAssertEqual(source.lines(startingWith: "EVENT loadRequested", count: 2), [
            "EVENT loadRequested 1 1 text/plain;charset=utf-8", "EVENT loadRequested 2 1 text/plain;charset=utf-8",
        ], "item 1 in the source's numbering, twice; item 0 never")
    }
}

extension Peer {
    /// Begins a drag of typed objects from a JSON list (see the test peer's `beginobjects`).
    func beginObjects(_ json: String) throws -> (token: String, path: String) {
        let answer = run("beginobjects " + json)
        let parts = answer.split(separator: " ")
        guard parts.count == 3, parts[0] == "OK" else { throw HarnessError("beginobjects failed: \(answer)") }
        return (String(parts[1]), String(parts[2]))
    }
}

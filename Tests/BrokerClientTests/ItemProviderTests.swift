@testable import BrokerClient
import BrokerProtocol
import Foundation
import SystemCalls
import XCTest

/// What a provider tells the broker about each registration, and what it hands over in the
/// clear (`loadDataRepresentation`), for handlers and for values registered as they are.
final class ItemProviderTests: XCTestCase {
    func testValuesRegisteredAsTheyAreAreDescribedAsHandlersAreAndOfferedInTheClearAlike() async throws {
        let provider = ItemProvider(suggestedName: "x")
        let file = try SealedMemoryFile.make(name: "held", data: Data("sealed".utf8))
        provider.registerDataRepresentation(forTypeIdentifier: "text/plain", data: Data("held".utf8))
        provider.registerDataRepresentation(forTypeIdentifier: "text/html") { Data("<b>handler</b>".utf8) }
        provider.registerStreamRepresentation(forTypeIdentifier: "video/mp4") { _ in }
        provider.registerFileRepresentation(forTypeIdentifier: "image/png", file: file)
        provider.registerFileRepresentation(forTypeIdentifier: "application/pdf") { try file.duplicateCloseOnExec() }

        XCTAssertEqual(provider.descriptor.representations.map { "\($0.typeIdentifier) \($0.kind.rawValue)" },
                       ["text/plain data", "text/html data", "video/mp4 data", "image/png file", "application/pdf file"])
        let plain = try await provider.loadDataRepresentation(forTypeIdentifier: "text/plain")
        XCTAssertEqual(plain, Data("held".utf8))
        let html = try await provider.loadDataRepresentation(forTypeIdentifier: "text/html")
        XCTAssertEqual(html, Data("<b>handler</b>".utf8))
        for type in ["video/mp4", "image/png", "application/pdf", "text/rtf"] {
            let none = try await provider.loadDataRepresentation(forTypeIdentifier: type)
            XCTAssertNil(none, type)
        }
    }

    /// The provider owns a file registered open: it stays open while the provider lives, and
    /// is closed when the provider is released.
    func testAFileRegisteredOpenLivesAsLongAsItsProvider() throws {
        var provider: ItemProvider? = ItemProvider()
        let file = try SealedMemoryFile.make(name: "held", data: Data("sealed".utf8))
        provider?.registerFileRepresentation(forTypeIdentifier: "image/png", file: file)
        XCTAssertNoThrow(try file.status())
        provider = nil
        XCTAssertThrowsError(try file.status()) { error in
            XCTAssertEqual(error as? Errno, .badFileDescriptor)
        }
    }

    func testStringAndDataRegisterTheirBytesAsTheyAre() throws {
        let text = ItemProvider(object: "hello")
        guard case .bytes(let bytes)? = text.provision(for: "text/plain;charset=utf-8") else {
            return XCTFail("String registers no handler")
        }
        XCTAssertEqual(bytes, Data("hello".utf8))
        let data = ItemProvider(object: Data([0, 1, 2]))
        guard case .bytes(let raw)? = data.provision(for: "application/octet-stream") else {
            return XCTFail("Data registers no handler")
        }
        XCTAssertEqual(raw, Data([0, 1, 2]))
    }
}

// `make interfaces`: writes the published introspection XML from the interface tables in
// BrokerProtocol, which are the one declaration of each interface. The files are kept in git,
// as the contract other languages' generators read; a test fails while they differ.
import BrokerProtocol
import Foundation

let directory = CommandLine.arguments.dropFirst().first ?? "Sources/BrokerProtocol/Interfaces"
for (name, xml) in BrokerInterfaces.publishedXML {
    let path = "\(directory)/\(name).xml"
    do {
        try xml.write(toFile: path, atomically: true, encoding: .utf8)
        print("wrote \(path)")
    } catch {
        FileHandle.standardError.write(Data("generate-interfaces: cannot write \(path): \(error)\n".utf8))
        exit(1)
    }
}

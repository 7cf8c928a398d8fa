// An example drop target: it accepts only images, and saves what it receives.
import BrokerClient
import BrokerProtocol
import Foundation

let arguments = CommandLine.arguments
guard arguments.count == 3 else {
    print("usage: dragbroker-demo-target TOKEN OUTPUT-DIRECTORY")
    exit(2)
}
let (token, outputDirectory) = (arguments[1], arguments[2])

do {
    let broker = try await BrokerConnection.connect()
    let drop = try await broker.presentToken(token)
    let items = try await drop.items()
    print("target: the drag carries \(items.count) item(s)")
    for (index, item) in items.enumerated() {
        print("target:   item \(index): \"\(item.suggestedName)\" \(Int(item.preferredWidth))x\(Int(item.preferredHeight)), types visible to me: \(item.typeIdentifiers.joined(separator: ", "))")
    }
    // canHandle: we take images only, and ask the broker before any data moves.
    let images = try await drop.items(conformingTo: "public.image")
    guard let index = images.first, let type = items[index].typeIdentifiers.first(where: { $0.hasPrefix("image/") }) else {
        _ = try await drop.enter(proposing: .forbidden)
        print("target: nothing here is an image I may see: the drop is forbidden")
        exit(1)
    }
    let allowed = try await drop.enter(proposing: .copy)
    print("target: proposed copy, the broker allows \(allowed.rawValue)")
    let operation = try await drop.performDrop()
    print("target: performed the drop (\(operation.rawValue)); loading item \(index) as \(type)")
    let data = try await drop.loadData(item: index, typeIdentifier: type) { bytes, expected in
        // A placeholder's progress bar, as a collection view would show it.
        let fraction = expected.map { Double(bytes) / Double(max($0, 1)) } ?? 0
        let bar = String(repeating: "#", count: Int(fraction * 20)).padding(toLength: 20, withPad: "-", startingAt: 0)
        print("target: loading [\(bar)] \(bytes) of \(expected.map(String.init) ?? "?") bytes")
    }
    let name = items[index].suggestedName.isEmpty ? "dropped" : items[index].suggestedName
    let file = URL(fileURLWithPath: outputDirectory).appendingPathComponent(name)
    try FileManager.default.createDirectory(atPath: outputDirectory, withIntermediateDirectories: true)
    try data.write(to: file)
    let magic = data.prefix(8).map { String(format: "%02x", $0) }.joined(separator: " ")
    print("target: received \(data.count) bytes (\(magic) …), saved to \(file.path)")
    try await drop.conclude()
} catch {
    print("target: \(error)")
    exit(1)
}

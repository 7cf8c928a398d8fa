// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "dragbroker",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "BrokerClient", targets: ["BrokerClient"]),
        .library(name: "BrokerProtocol", targets: ["BrokerProtocol"]),
        .library(name: "BrokerGTK", targets: ["BrokerGTK"]),
        .executable(name: "dragbrokerd", targets: ["dragbrokerd"]),
        .executable(name: "dragctl", targets: ["dragctl"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-system", from: "1.8.1"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.2.0"),
    ],
    targets: [
        // The one place that touches libsystemd's C API.
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        // GTK 4, for BrokerGTK only: the toolkit drag carries the token, the broker the rest.
        .systemLibrary(
            name: "CGtk",
            pkgConfig: "gtk4",
            providers: [.apt(["libgtk-4-dev"])]
        ),
        // Linux calls Swift cannot reach directly (variadic fcntl, splice, pidfd_open, …).
        .systemLibrary(name: "CLinux"),
        // The one file of raw system calls, shared by the bus layer, the daemon and the client.
        .target(
            name: "SystemCalls",
            dependencies: ["CLinux", .product(name: "SystemPackage", package: "swift-system")]
        ),
        .target(
            name: "BusKit",
            dependencies: ["CSystemd", "SystemCalls"]
        ),
        .target(
            name: "BrokerProtocol",
            dependencies: ["BusKit"],
            exclude: ["Interfaces"]
        ),
        .target(
            name: "TransferLog",
            dependencies: ["SystemCalls", .product(name: "GRDB", package: "GRDB.swift")]
        ),
        .target(name: "BrokerPolicy"),
        .target(
            name: "BrokerClient",
            dependencies: [
                "BusKit", "BrokerProtocol", "UniformTypes", "SystemCalls",
            ]
        ),
        .executableTarget(
            name: "dragbrokerd",
            dependencies: [
                "BusKit", "BrokerProtocol", "TransferLog", "BrokerPolicy", "UniformTypes", "SystemCalls",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "dragctl",
            dependencies: [
                "BrokerClient", "BrokerProtocol", "TransferLog", "BrokerPolicy", "UniformTypes",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .target(
            name: "BrokerGTK",
            dependencies: ["BrokerClient", "BrokerProtocol", "CGtk", "UniformTypes", "SystemCalls",
                           .product(name: "SystemPackage", package: "swift-system")]
        ),
        .executableTarget(
            name: "dragbroker-demo-source",
            dependencies: ["BrokerClient", "BrokerGTK", "CGtk"],
            path: "Sources/Examples/DemoSource"
        ),
        .executableTarget(
            name: "dragbroker-demo-target",
            dependencies: ["BrokerClient", "BrokerGTK", "CGtk"],
            path: "Sources/Examples/DemoTarget"
        ),
        // A scriptable peer the end-to-end tests run as separate processes.
        .executableTarget(
            name: "dragbroker-testpeer",
            dependencies: ["BrokerClient", "SystemCalls", .product(name: "SystemPackage", package: "swift-system")],
            path: "Tests/TestPeer"
        ),
        // `make bench`: broker vs plain pipe throughput, file handover, first byte, Update.
        .executableTarget(
            name: "dragbroker-bench",
            dependencies: ["BrokerClient", "BrokerProtocol", "BusKit", "TransferLog", "SystemCalls",
                           .product(name: "Histogram", package: "hdrhistogram-swift"),
                           .product(name: "SystemPackage", package: "swift-system")],
            path: "Sources/Bench"
        ),
        // `make bench`'s yardstick: the calls BrokerClient makes for a drop, from plain C on
        // sd-bus, so the bench can print what the library adds (`client_*_vs_c`).
        .executableTarget(
            name: "dragbroker-bench-c",
            path: "Sources/BenchCClient",
            cSettings: [.unsafeFlags(["-Wall", "-Wextra", "-Werror"])],
            linkerSettings: [.linkedLibrary("systemd")]
        ),
        // `make interfaces`: the published XML, written from the interface tables.
        .executableTarget(
            name: "generate-interfaces",
            dependencies: ["BrokerProtocol"],
            path: "Sources/GenerateInterfaces"
        ),
        .target(name: "UniformTypes"),
        .testTarget(
            name: "UniformTypesTests",
            dependencies: ["UniformTypes"]
        ),
        .testTarget(
            name: "DaemonTests",
            dependencies: ["dragbrokerd"]
        ),
        .testTarget(
            name: "TransferLogTests",
            dependencies: ["TransferLog", .product(name: "GRDB", package: "GRDB.swift")]
        ),
        .testTarget(name: "BrokerPolicyTests", dependencies: ["BrokerPolicy"]),
        .testTarget(name: "BusKitTests", dependencies: ["BusKit"]),
        .testTarget(name: "BrokerClientTests", dependencies: ["BrokerClient", "BrokerProtocol"]),
        .testTarget(
            name: "BrokerTests",
            dependencies: ["BusKit", "BrokerProtocol", "BrokerClient", "TransferLog", "BrokerPolicy", "UniformTypes",
                           "dragbrokerd", "dragctl", "dragbroker-testpeer"]
        ),
    ],
    swiftLanguageModes: [.v6]
)

import Foundation
import TransferLog
import XCTest

/// The state directory is the daemon's own, as ssh and systemd hold theirs: a link, another
/// user's directory or file, one that others may write, or a parent others may change is
/// refused at start with the exit status of unusable state, and nothing is written through it.
/// The other user is real (`dragbroker-b`), and owns the files a planted link points at.
final class StateDirectoryTests: XCTestCase {
    static let stateUnusable: Int32 = 65
    static let victimText = Data("dragbroker-b's own file\n".utf8)

    /// A world with the daemon stopped, and a directory of `dragbroker-b`'s that anyone may
    /// write, as /tmp would be without its sticky bit.
    func world() throws -> (AuditWorld, victim: TestUser, victimDirectory: URL) {
        let victim = try TestUser.require("dragbroker-b")
        let world = try AuditWorld()
        world.stopDaemon()
        let victimDirectory = world.directory.appendingPathComponent("victim")
        try FileManager.default.createDirectory(at: victimDirectory, withIntermediateDirectories: false)
        try victim.own(victimDirectory)
        XCTAssertEqual(chmod(victimDirectory.path, 0o777), 0)
        return (world, victim, victimDirectory)
    }

    func mode(_ url: URL) throws -> Int {
        try XCTUnwrap((FileManager.default.attributesOfItem(atPath: url.path)[.posixPermissions] as? NSNumber)?.intValue)
    }

    func assertRefused(_ world: AuditWorld, _ step: String, because reason: String, file: StaticString = #filePath, line: UInt = #line) throws {
        let refused = try world.refusedStart(saying: "Failed to open \(step)")
        XCTAssertEqual(refused.status, Self.stateUnusable, refused.stderr, file: file, line: line)
        XCTAssertTrue(refused.line?.contains(reason) == true, "\(refused.line ?? refused.stderr) does not say: \(reason)", file: file, line: line)
    }

    /// A state directory that is a link into another user's world-writable directory was used
    /// as it was: every file the daemon made landed there.
    func testAStateDirectoryThatIsASymbolicLinkIsRefused() throws {
        let (world, _, victimDirectory) = try world()
        try FileManager.default.removeItem(at: world.stateDirectory)
        try FileManager.default.createSymbolicLink(at: world.stateDirectory, withDestinationURL: victimDirectory)
        try assertRefused(world, "the state directory",
                          because: "refusing to use \(world.stateDirectory.path): it is a symbolic link; the state directory must be a directory of its own")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: victimDirectory.path), [], "nothing was made through the link")
    }

    func testAStateDirectoryAnotherUserOwnsIsRefused() throws {
        let (world, victim, _) = try world()
        try victim.own(world.stateDirectory)
        try assertRefused(world, "the state directory", because: "the state directory is owned by uid \(victim.uid), not by uid 0 that dragbrokerd runs as")
    }

    func testAStateDirectoryOthersMayWriteIsRefused() throws {
        let (world, _, _) = try world()
        XCTAssertEqual(chmod(world.stateDirectory.path, 0o770), 0)
        try assertRefused(world, "the state directory", because: "the state directory is writable by group or others (mode 0770); run chmod go-w on it")
    }

    /// A parent anyone may write lets anyone replace the state directory: refused, unless it is
    /// sticky and root's, like /tmp (where the test's own directories live).
    func testAParentOthersMayWriteIsRefusedUnlessStickyAndRoots() throws {
        let (world, _, _) = try world()
        XCTAssertEqual(chmod(world.directory.path, 0o777), 0)
        try assertRefused(world, "the state directory", because: """
            refusing to use \(world.directory.path): a parent of the state directory is writable by group or others (mode 0777) \
            and is not a sticky directory owned by root
            """)
        XCTAssertEqual(chmod(world.directory.path, 0o1777), 0)
        try world.startDaemon()
    }

    /// Links planted where the daemon keeps its files once made it overwrite a user's file with
    /// ledger slots, chmod another (the chmod followed the link), and turn a third into a
    /// SQLite database with -wal and -shm files beside it. Each is refused, its target untouched.
    func testALinkPlantedForAnyFileOfTheStateIsRefusedAndItsTargetUntouched() throws {
        let (world, victim, victimDirectory) = try world()
        let cases = [
            ("transfers.inflight", "the in-flight ledger"), ("transfers.sqlite", "the transfer log"),
            ("transfers.sqlite-wal", "the transfer log"), ("transfers.sqlite-shm", "the transfer log"),
        ]
        for (name, step) in cases {
            let planted = world.stateDirectory.appendingPathComponent(name)
            let target = victimDirectory.appendingPathComponent("target-of-\(name)")
            try Self.victimText.write(to: target)
            try victim.own(target)
            XCTAssertEqual(chmod(target.path, 0o644), 0)
            let kept = world.stateDirectory.appendingPathComponent("kept")
            try? FileManager.default.moveItem(at: planted, to: kept)
            try FileManager.default.createSymbolicLink(at: planted, withDestinationURL: target)

            try assertRefused(world, step, because: "refusing to use \(planted.path): it is a symbolic link, in the daemon's state directory")
            XCTAssertEqual(try Data(contentsOf: target), Self.victimText, name)
            XCTAssertEqual(try mode(target), 0o644, name)
            XCTAssertEqual(try FileManager.default.attributesOfItem(atPath: target.path)[.ownerAccountID] as? NSNumber, NSNumber(value: victim.uid))
            XCTAssertFalse(FileManager.default.fileExists(atPath: target.path + "-wal"), name)
            XCTAssertFalse(FileManager.default.fileExists(atPath: target.path + "-shm"), name)

            try FileManager.default.removeItem(at: planted)
            if FileManager.default.fileExists(atPath: kept.path) { try FileManager.default.moveItem(at: kept, to: planted) }
        }
        try world.startDaemon()
    }

    /// A file of the state that another user owns, or that others may write, is not the daemon's.
    func testAFileOfTheStateAnotherUserOwnsOrOthersMayWriteIsRefused() throws {
        let (world, victim, _) = try world()
        let log = URL(fileURLWithPath: world.daemon.transferLogPath)
        try victim.own(log)
        try assertRefused(world, "the transfer log", because: "the file is owned by uid \(victim.uid), not by uid 0 that dragbrokerd runs as")
        XCTAssertEqual(chown(log.path, 0, 0), 0)
        XCTAssertEqual(chmod(log.path, 0o666), 0)
        try assertRefused(world, "the transfer log", because: "the file is writable by group or others (mode 0666); run chmod go-w on it")
        XCTAssertEqual(chmod(log.path, 0o644), 0)
        try world.startDaemon()
        XCTAssertEqual(try mode(log), 0o600, "what others could read is taken away, through the descriptor")
    }
}

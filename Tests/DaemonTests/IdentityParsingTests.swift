import XCTest

@testable import dragbrokerd

/// The /proc parsers behind identity, on the exact texts the kernel and sandboxes write.
final class IdentityParsingTests: XCTestCase {
    func testFlatpakInfoNamesTheApplication() {
        let info = "[Application]\nname=org.gnome.Maps\nruntime=runtime/org.gnome.Platform/x86_64/45\n\n[Instance]\ninstance-id=123\n"
        XCTAssertEqual(IdentityResolver.flatpakApp(info: info), "org.gnome.Maps")
        XCTAssertNil(IdentityResolver.flatpakApp(info: "[Runtime]\nname=org.gnome.Platform\n"), "a runtime is not an app")
        XCTAssertNil(IdentityResolver.flatpakApp(info: "[Application]\nname=\n"))
    }

    func testCgroupPathPrefersTheUnifiedHierarchy() {
        XCTAssertEqual(IdentityResolver.cgroupPath("0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome.Terminal-42.scope\n"),
                       "/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome.Terminal-42.scope")
        XCTAssertEqual(IdentityResolver.cgroupPath("9:name=systemd:/app-org.example.A-1.scope\n4:memory:/x\n0::/\n"),
                       "/app-org.example.A-1.scope", "hybrid hierarchy with nothing in the unified one")
        XCTAssertEqual(IdentityResolver.cgroupPath("4:memory:/x\n"), "")
    }

    func testXDGUnitNames() {
        XCTAssertEqual(IdentityResolver.unitApp(cgroup: "/user.slice/app.slice/app-gnome-org.gnome.Terminal-4242.scope"), "org.gnome.Terminal")
        XCTAssertEqual(IdentityResolver.unitApp(cgroup: "/app.slice/app-org.gnome.Terminal-4242.scope"), "org.gnome.Terminal")
        XCTAssertEqual(IdentityResolver.unitApp(cgroup: "/app.slice/app-org.mozilla.firefox@1b2c.service"), "org.mozilla.firefox")
        XCTAssertEqual(IdentityResolver.unitApp(cgroup: "/app.slice/app-flatpak-org.gnome.Maps-77.scope"), "org.gnome.Maps")
        XCTAssertEqual(IdentityResolver.unitApp(cgroup: "/app.slice/app-kde-org.kde\\x2dtools.Viewer-9.scope"), "org.kde-tools.Viewer")
        XCTAssertEqual(IdentityResolver.unitApp(cgroup: "/app.slice/app-org.example.Svc.service/sub"), "org.example.Svc", "the innermost app unit")
        XCTAssertNil(IdentityResolver.unitApp(cgroup: "/user.slice/session-3.scope"))
        XCTAssertNil(IdentityResolver.unitApp(cgroup: "/app.slice/app-noapp-12.scope"), "an ID without a dot is not an app ID")
    }

    func testSnapNames() {
        XCTAssertEqual(IdentityResolver.snapName(cgroup: "/user.slice/snap.firefox.firefox-1a2b.scope"), "firefox")
        XCTAssertEqual(IdentityResolver.snapName(cgroup: "/system.slice/snap.lxd.daemon.service"), "lxd")
        XCTAssertNil(IdentityResolver.snapName(cgroup: "/user.slice/snapd.service"))
    }

    func testSuggestedNamesLoseSeparatorsAndControlsAndStayBounded() {
        XCTAssertEqual(SuggestedName.sanitize("../../etc/passwd", maxBytes: 255), ".._.._etc_passwd")
        XCTAssertEqual(SuggestedName.sanitize("a\u{0}b\u{7}c\u{202E}d\\e", maxBytes: 255), "abcd_e")
        XCTAssertEqual(SuggestedName.sanitize("..", maxBytes: 255), "_")
        XCTAssertEqual(SuggestedName.sanitize("  spaced  ", maxBytes: 255), "spaced")
        XCTAssertEqual(SuggestedName.sanitize("ééé", maxBytes: 5), "éé")
    }
}

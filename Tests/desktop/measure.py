#!/usr/bin/python3
"""How long a real desktop drag takes through dragbrokerd, and where the time goes.

    measure.py [--backend x11|wayland|both] [--drags 20] [--daemon PATH] [--step-ms N]

Starts a private bus, dragbrokerd, a headless desktop (Xvfb + xdotool, or sway + virtual-pointer),
gtk3_source.py offering a 300 KB picture and a short text, and gtk3_target.py taking both; then
drags from one window to the other N times. The apps (--timestamps) and the broker's Monitor()
signals are stamped with CLOCK_MONOTONIC where they happen, and each drag is cut into:

    pointer   mousedown -> mouseup: the scripted motion (steps of --step-ms)
    release   mouseup -> the broker's drop: the toolkit's drop reaching the target, PerformDrop
              (on X11 also the start of the xdotool that releases, about a millisecond)
    transfer  the broker's drop -> the target has read the last byte: Load calls, Provide, the splice
    total     mousedown -> the last byte

and the broker's own share inside transfer: its first load event to its last loaded event.
Prints the median, minimum and maximum of each, in milliseconds."""
import argparse
import hashlib
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(os.path.dirname(HERE))
PYTHON = "/usr/bin/python3"
SOURCE_AT, TARGET_AT = (120, 150), (400, 150)


class Stream:
    """A child's stdout, a line at a time, each with when it happened: the stamp the child put
    first on the line (CLOCK_MONOTONIC, like time.monotonic() here), or else its arrival."""

    def __init__(self, name, process, lines, stamped):
        self.name, self.process, self.stamped = name, process, stamped
        threading.Thread(target=self.read, args=(lines,), daemon=True).start()

    def read(self, lines):
        for raw in self.process.stdout:
            line, at = raw.decode("utf-8", "replace").rstrip("\n"), time.monotonic()
            if self.stamped:
                stamp, _, line = line.partition(" ")
                at = float(stamp)
            lines.put((at, self.name, line))


class Run:
    def __init__(self, backend, scratch, daemon, step_ms):
        self.backend, self.scratch, self.step_ms = backend, scratch, step_ms
        self.lines = queue.Queue()
        self.seen = []
        self.children = []
        base = {"PATH": "/usr/bin:/bin", "NO_AT_BRIDGE": "1"}
        bus = self.spawn("bus", ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address=1"], base, stream=False)
        self.address = bus.stdout.readline().decode().strip()
        state, policy = os.path.join(scratch, "state"), os.path.join(scratch, "policy")
        os.makedirs(state)
        os.makedirs(policy)
        broker = self.spawn("daemon", [daemon, "--address", self.address, "--state-directory", state, "--policy-directory", policy],
                            base, stream=False, stderr=True)
        while b"Serving org.dragbroker.Broker1" not in broker.stderr.readline():
            pass
        if backend == "x11":
            xvfb = self.spawn("xvfb", ["Xvfb", "-displayfd", "1", "-screen", "0", "800x300x24", "-nolisten", "tcp"], base, stream=False)
            self.environment = dict(base, DISPLAY=":" + xvfb.stdout.readline().decode().strip(), GDK_BACKEND="x11")
        else:
            sway = self.spawn("sway", [os.path.join(HERE, "sway-session.sh")], base, stream=False)
            found = dict(sway.stdout.readline().decode().strip().split("=", 1) for _ in range(2))
            runtime = os.path.join(scratch, "runtime")
            os.makedirs(runtime, mode=0o700)
            self.environment = dict(base, WAYLAND_DISPLAY=found["WAYLAND_DISPLAY"], XDG_RUNTIME_DIR=runtime, GDK_BACKEND="wayland")
            build = os.path.join(scratch, "virtual-pointer")
            subprocess.run(["sh", os.path.join(HERE, "build-virtual-pointer.sh"), build], check=True)
            self.pointer = self.spawn("pointer", [os.path.join(build, "virtual-pointer"), "800", "300"], self.environment, stdin=True)
            self.wait_for("pointer", "ready")
        self.spawn("monitor", [PYTHON, os.path.abspath(__file__), "--monitor", self.address], base, stamped=True)
        self.wait_for("monitor", "monitoring")

        picture = os.path.join(scratch, "picture.bin")
        with open(picture, "wb") as file:
            file.write(os.urandom(300_000))
        with open(picture, "rb") as file:
            self.picture_sha = hashlib.sha256(file.read()).hexdigest()
        items = ('[{"name":"picture.png","reps":[{"type":"image/png","file":"%s"}]},'
                 '{"name":"note.txt","reps":[{"type":"text/plain","text":"measured"}]}]' % picture)
        self.spawn("source", [PYTHON, os.path.join(HERE, "gtk3_source.py"), "--timestamps", "--bus", self.address, "--items", items],
                   self.environment, stamped=True)
        self.spawn("target", [PYTHON, os.path.join(HERE, "gtk3_target.py"), "--timestamps", "--bus", self.address,
                              "--accept", "image/png", "--accept", "text/plain"], self.environment, stamped=True)
        self.wait_for("source", "READY")
        self.wait_for("target", "READY")
        time.sleep(0.3)

    def spawn(self, name, command, environment, stream=True, stdin=False, stderr=False, stamped=False):
        process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE if stderr else subprocess.DEVNULL,
                                   stdin=subprocess.PIPE if stdin else subprocess.DEVNULL)
        self.children.append(process)
        if stream:
            Stream(name, process, self.lines, stamped)
        return process

    def wait_for(self, name, prefix, timeout=20):
        deadline = time.monotonic() + timeout
        while True:
            for entry in self.seen:
                if entry[1] == name and entry[2].startswith(prefix):
                    self.seen.remove(entry)
                    self.last_line = entry[2]
                    return entry[0]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{name} never printed {prefix!r}")
            try:
                self.seen.append(self.lines.get(timeout=remaining))
            except queue.Empty:
                pass

    def point(self, command):
        self.pointer.stdin.write((command + "\n").encode())
        self.pointer.stdin.flush()
        self.wait_for("pointer", "ok " + command)

    def drag(self):
        """One drag; returns (mousedown, mouseup) on the monotonic clock."""
        steps = [(SOURCE_AT[0] + (TARGET_AT[0] - SOURCE_AT[0]) * i // 9, SOURCE_AT[1]) for i in range(1, 10)]
        interval = self.step_ms / 1000
        if self.backend == "x11":
            subprocess.run(["xdotool", "mousemove", *map(str, SOURCE_AT)], env=self.environment, check=True)
            time.sleep(0.05)
            # The press and the release each get an xdotool of their own, so that their times are
            # known to within its start, about a millisecond, which counts to the pointer's share.
            script = []
            for x, y in steps:
                script += ["sleep", f"{interval:.3f}", "mousemove", str(x), str(y)]
            down = time.monotonic()
            subprocess.run(["xdotool", "mousedown", "1"], env=self.environment, check=True)
            subprocess.run(["xdotool", *script, "sleep", f"{interval:.3f}"], env=self.environment, check=True)
            up = time.monotonic()
            subprocess.run(["xdotool", "mouseup", "1"], env=self.environment, check=True)
            return down, up
        self.point("abs %d %d" % SOURCE_AT)
        time.sleep(0.05)
        down = time.monotonic()
        self.point("down")
        for x, y in steps:
            time.sleep(interval)
            self.point(f"abs {x} {y}")
        time.sleep(interval)
        up = time.monotonic()
        self.point("up")
        return down, up

    def measure(self, drags):
        rows = []
        for number in range(1, drags + 1):
            down, up = self.drag()
            last_byte = self.wait_for("target", "LOADED 1 ")
            first = self.wait_for("target", "LOADED 0 ")
            if self.last_line != f"LOADED 0 image/png 300000 {self.picture_sha}":
                raise RuntimeError(f"drag {number} delivered the wrong bytes: {self.last_line}")
            dropped = self.wait_for("monitor", "drop ")
            load = self.wait_for("monitor", "load ")
            self.wait_for("monitor", "load ")
            self.wait_for("monitor", "loaded ")
            loaded = self.wait_for("monitor", "loaded ")
            self.wait_for("source", "TRANSFER-FINISHED")
            self.wait_for("target", "CONCLUDED")
            self.wait_for("monitor", "end ")
            last = max(first, last_byte)
            rows.append({"pointer": up - down, "release": dropped - up, "transfer": last - dropped,
                         "total": last - down, "broker": loaded - load})
            print(f"  drag {number:2d}: total {1000 * (last - down):6.1f} ms", file=sys.stderr)
            time.sleep(0.2)
        return rows

    def close(self):
        for process in reversed(self.children):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()


def monitor(address):
    """The broker's own view: its MonitorEvent signals, one line each."""
    import dbus
    from dbus.mainloop.glib import DBusGMainLoop
    from gi.repository import GLib

    DBusGMainLoop(set_as_default=True)
    bus = dbus.bus.BusConnection(address)
    manager = dbus.Interface(bus.get_object("org.dragbroker.Broker1", "/org/dragbroker/Broker1"), "org.dragbroker.Broker1.Manager")
    bus.add_signal_receiver(lambda session, event, detail, *_: print(f"{time.monotonic():.6f}", event, session, detail, flush=True),
                            signal_name="MonitorEvent", dbus_interface="org.dragbroker.Broker1.Manager")
    manager.Monitor()
    print(f"{time.monotonic():.6f} monitoring", flush=True)
    GLib.MainLoop().run()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["x11", "wayland", "both"], default="both")
    parser.add_argument("--drags", type=int, default=20)
    parser.add_argument("--daemon", default=None)
    parser.add_argument("--step-ms", type=int, default=None, help="pointer steps apart; 40 on X11 and 10 on Wayland by default")
    parser.add_argument("--monitor", metavar="ADDRESS", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.monitor:
        return monitor(arguments.monitor)
    daemon = arguments.daemon or next(
        (path for path in (os.path.join(REPOSITORY, build, "debug", "dragbrokerd") for build in (".build-desktop", ".build"))
         if os.path.exists(path)), None)
    if daemon is None:
        sys.exit("no dragbrokerd: build it, or give --daemon")
    backends = ["x11", "wayland"] if arguments.backend == "both" else [arguments.backend]
    for backend in backends:
        step = arguments.step_ms or (40 if backend == "x11" else 10)
        scratch = tempfile.mkdtemp(prefix="dragbroker-measure-")
        run = None
        try:
            print(f"{backend}: {arguments.drags} drags, pointer steps {step} ms apart", file=sys.stderr)
            run = Run(backend, scratch, daemon, step)
            rows = run.measure(arguments.drags)
        finally:
            if run is not None:
                run.close()
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"{backend} ({arguments.drags} drags, 300 KB + 8 B, pointer steps {step} ms apart), ms: median [min-max]")
        for key in ("total", "pointer", "release", "transfer", "broker"):
            values = [1000 * row[key] for row in rows]
            print(f"  {key:9s} {statistics.median(values):7.1f}  [{min(values):.1f}-{max(values):.1f}]")


main()

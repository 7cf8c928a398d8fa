#!/usr/bin/python3
"""A GTK 3 paste target for the dragbroker clipboard protocol.

Written from docs/desktop-drag-protocol.md ("The clipboard", Target) and the
interface XML alone.  Ctrl+V reads the CLIPBOARD's targets; when the offer has
application/vnd.dragbroker.pasteboard.v1 it reads the token, presents it,
asks ConformingItems(--accept), calls Paste, loads the first conforming item
with --accept on the paste's path, reads the pipe to end of file, waits for
that load's LoadFinished, concludes, and writes the bytes to --out.

Output, one line per Ctrl+V (stdout, flushed):
  READY                         once the window is shown
  PASTED <n> bytes              success
  REFUSED <error name> <msg>    a broker call was refused
  NO-ENTRY                      no pasteboard token on the clipboard
  NOTHING-CONFORMS <type>       the entry has nothing the app may see of <type>
  INVALID-TOKEN                 the payload is not 64 characters of [0-9a-f]
  LOAD-FAILED <error> <msg>     LoadFinished reported an error
"""

import argparse
import errno
import fcntl
import os
import re
import signal
import sys

import gi
gi.require_version("Gtk", "3.0")
gi.require_version("Gdk", "3.0")
from gi.repository import Gdk, GLib, Gtk  # noqa: E402

import dbus  # noqa: E402
import dbus.bus  # noqa: E402
from dbus.mainloop.glib import DBusGMainLoop  # noqa: E402

BROKER_NAME = "org.dragbroker.Broker1"
MANAGER_PATH = "/org/dragbroker/Broker1"
MANAGER_IFACE = "org.dragbroker.Broker1.Manager"
SESSION_IFACE = "org.dragbroker.Broker1.Session"
PASTEBOARD_TYPE = "application/vnd.dragbroker.pasteboard.v1"
TOKEN_RE = re.compile(r"[0-9a-f]{64}")


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Paste:
    """One user paste: the state of one Ctrl+V from the token to Conclude."""

    def __init__(self, app):
        self.app = app
        self.paste_path = None
        self.load_id = None
        self.chunks = []
        self.eof = False
        self.finished = None      # (bytes, error, message) from LoadFinished
        self.done = False


class PasteTarget:
    def __init__(self, args):
        self.args = args
        self.current = None       # the Paste in progress, if any
        self.early_finished = {}  # (path, load) -> LoadFinished args seen before the Load reply

        DBusGMainLoop(set_as_default=True)
        if args.bus:
            self.bus = dbus.bus.BusConnection(args.bus)
        else:
            self.bus = dbus.SessionBus()
        # Subscribe to the broker's session signals by interface and sender, before any
        # PresentToken or Paste: they are unicast to the parties only.
        self.bus.add_signal_receiver(
            self.on_session_signal,
            dbus_interface=SESSION_IFACE,
            bus_name=BROKER_NAME,
            path_keyword="path",
            member_keyword="member",
        )
        self.manager = dbus.Interface(
            self.bus.get_object(BROKER_NAME, MANAGER_PATH, introspect=False), MANAGER_IFACE)

        self.clipboard = Gtk.Clipboard.get(Gdk.SELECTION_CLIPBOARD)

        self.window = Gtk.Window(title=args.title)
        self.window.set_default_size(320, 120)
        self.label = Gtk.Label(label="Press Ctrl+V to paste %s" % args.accept)
        self.window.add(self.label)
        # Ctrl+V by its key value: a Gtk.AccelGroup also matches the key's place in the keymap,
        # and misses it under a virtual keyboard's keymap (wtype on sway), which still delivers
        # the key value v with Control held.
        self.window.connect("key-press-event", self.on_key)
        self.window.connect("destroy", Gtk.main_quit)
        self._ready = False
        self.window.connect("map-event", self.on_mapped)
        self.window.show_all()

    def session(self, path):
        return dbus.Interface(self.bus.get_object(BROKER_NAME, path, introspect=False),
                              SESSION_IFACE)

    # -- window ---------------------------------------------------------------------------

    def on_mapped(self, *_):
        if not self._ready:
            self._ready = True
            say("READY")
        return False

    def on_key(self, _window, event):
        if event.keyval in (Gdk.KEY_v, Gdk.KEY_V) and event.state & Gdk.ModifierType.CONTROL_MASK:
            return self.on_paste_accel()
        return False

    def on_paste_accel(self, *_):
        if self.current is not None and not self.current.done:
            return True           # one paste per user action; ignore while one runs
        self.current = Paste(self)
        self.label.set_text("Pasting…")
        self.clipboard.request_targets(self.on_targets)
        return True

    # -- clipboard --------------------------------------------------------------------------

    def on_targets(self, _clipboard, atoms, *_):
        names = [a.name() for a in (atoms or [])]
        if PASTEBOARD_TYPE not in names:
            self.finish("NO-ENTRY")
            return
        self.clipboard.request_contents(Gdk.Atom.intern(PASTEBOARD_TYPE, False), self.on_token)

    def on_token(self, _clipboard, selection, *_):
        data = selection.get_data() if selection is not None and selection.get_length() >= 0 else None
        try:
            token = bytes(data).decode("ascii") if data is not None else ""
        except UnicodeDecodeError:
            token = ""
        if TOKEN_RE.fullmatch(token) is None:
            self.finish("INVALID-TOKEN")
            return
        self.manager.PresentToken(token, signature="s",
                                  reply_handler=self.on_presented,
                                  error_handler=self.on_refused)

    # -- broker -----------------------------------------------------------------------------

    def on_presented(self, entry_path):
        p = self.current
        p.entry = self.session(entry_path)
        p.entry.ConformingItems(self.args.accept, signature="s",
                                reply_handler=self.on_conforming,
                                error_handler=self.on_refused)

    def on_conforming(self, items):
        p = self.current
        if len(items) == 0:
            self.finish("NOTHING-CONFORMS %s" % self.args.accept)
            return
        p.item = int(items[0])
        p.entry.Paste(reply_handler=self.on_pasted, error_handler=self.on_refused)

    def on_pasted(self, paste_path):
        p = self.current
        p.paste_path = str(paste_path)
        p.paste = self.session(p.paste_path)
        p.paste.Load(dbus.UInt32(p.item), self.args.accept, signature="us",
                     reply_handler=self.on_loaded, error_handler=self.on_refused)

    def on_loaded(self, fd, load, kind):
        p = self.current
        p.load_id = int(load)
        raw = fd.take()
        if str(kind) == "file":
            # The source's read-only file or sealed memfd itself: read it from the start.
            try:
                off = 0
                while True:
                    chunk = os.pread(raw, 65536, off)
                    if not chunk:
                        break
                    p.chunks.append(chunk)
                    off += len(chunk)
            finally:
                os.close(raw)
            p.eof = True
        else:
            flags = fcntl.fcntl(raw, fcntl.F_GETFL)
            fcntl.fcntl(raw, fcntl.F_SETFL, flags | os.O_NONBLOCK)
            GLib.io_add_watch(raw, GLib.PRIORITY_DEFAULT,
                              GLib.IO_IN | GLib.IO_HUP | GLib.IO_ERR, self.on_readable, p)
        early = self.early_finished.pop((p.paste_path, p.load_id), None)
        if early is not None:
            p.finished = early
        self.maybe_conclude(p)

    def on_readable(self, fd, _cond, p):
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return True   # more later
                chunk = b""
            if not chunk:
                os.close(fd)
                p.eof = True
                self.maybe_conclude(p)
                return False
            p.chunks.append(chunk)

    def on_session_signal(self, *args, path=None, member=None):
        p = self.current
        path = str(path)
        if member == "LoadFinished":
            load, nbytes, error, message = args
            key = (path, int(load))
            if p is not None and p.paste_path == path and p.load_id == int(load):
                p.finished = (int(nbytes), str(error), str(message))
                self.maybe_conclude(p)
            else:
                self.early_finished[key] = (int(nbytes), str(error), str(message))
        elif member == "Ended":
            _op, error, message = args
            if (p is not None and not p.done and p.paste_path == path and error
                    and p.finished is None):
                self.finish("ENDED %s %s" % (error, message))

    def maybe_conclude(self, p):
        if p.done or not p.eof or p.finished is None:
            return
        data = b"".join(p.chunks)
        _nbytes, error, message = p.finished
        p.paste.Conclude(reply_handler=lambda: None,
                         error_handler=lambda e: sys.stderr.write(
                             "Conclude: %s %s\n" % (e.get_dbus_name(), e.get_dbus_message())))
        if error:
            self.finish("LOAD-FAILED %s %s" % (error, message))
            return
        with open(self.args.out, "wb") as f:
            f.write(data)
        self.finish("PASTED %d bytes" % len(data))

    def on_refused(self, e):
        name = e.get_dbus_name() if isinstance(e, dbus.DBusException) else type(e).__name__
        msg = e.get_dbus_message() if isinstance(e, dbus.DBusException) else str(e)
        self.finish("REFUSED %s %s" % (name, msg))

    def finish(self, line):
        if self.current is not None:
            self.current.done = True
        self.label.set_text(line)
        say(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--title", default="gtk3 paste target")
    ap.add_argument("--bus", help="D-Bus address to use instead of the session bus")
    ap.add_argument("--accept", default="text/plain", help="MIME type or UTI accepted")
    ap.add_argument("--out", required=True, help="file to write the pasted bytes to")
    args = ap.parse_args()

    PasteTarget(args)
    for sig in (signal.SIGINT, signal.SIGTERM):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, Gtk.main_quit)
    Gtk.main()


if __name__ == "__main__":
    main()

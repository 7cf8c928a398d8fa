#!/usr/bin/python3
"""A GTK 3 drag source that speaks the desktop drag protocol (docs/desktop-drag-protocol.md)
with dbus-python. The toolkit drag carries only the session token; the items go to the broker.

    gtk3_source.py --bus ADDRESS --items JSON [--title T] [--x X --y Y] [--allow-move] [--wait-for-go]

JSON is a list of items: {"name": "...", "width": 0, "height": 0, "reps": [{"type": "image/png",
"visibility": "all", "text": "..." | "file": "/path/of/the/bytes"}]}.

Prints, flushed: READY, BEGAN <session path>, TOKEN <token>, PROVIDE <item> <type> <nbytes>,
WILL-END <op>, LOAD-FINISHED <load> <bytes> <error or ->, ENDED <op> <error or ->, TRANSFER-FINISHED,
DRAG-FAILED <GtkDragResult nick>, DRAG-END, CANCELLED, and ERROR <name> <message>."""
import argparse
import json
import os
import signal
import sys
import time

import dbus
import dbus.service
from dbus.mainloop.glib import DBusGMainLoop
import gi

gi.require_version("Gtk", "3.0")
gi.require_version("Gdk", "3.0")
from gi.repository import Gdk, GLib, Gtk  # noqa: E402

BUS, MANAGER = "org.dragbroker.Broker1", "/org/dragbroker/Broker1"
MANAGER_IFACE = "org.dragbroker.Broker1.Manager"
SESSION_IFACE = "org.dragbroker.Broker1.Session"
PROVIDER_IFACE = "org.dragbroker.Provider1"
PROVIDER_PATH = "/org/dragbroker/Provider1/gtk3"
TOKEN_TYPE = "application/vnd.dragbroker.token.v1"
DROP_GRACE_MS = 100


STAMPED = False


def say(*words):
    # With --timestamps each line starts with CLOCK_MONOTONIC, taken as the event happens,
    # so measure.py can time a drag across processes without their scheduling in the way.
    if STAMPED:
        words = (f"{time.monotonic():.6f}",) + words
    print(" ".join(str(w) for w in words), flush=True)


def error_words(error):
    return error.get_dbus_name(), error.get_dbus_message()


class Provider(dbus.service.Object):
    """Serves the bytes of a representation once the broker asks, after the drop."""

    def __init__(self, bus, payloads):
        super().__init__(bus, PROVIDER_PATH)
        self.payloads = payloads

    @dbus.service.method(PROVIDER_IFACE, in_signature="ousuh", out_signature="")
    def Provide(self, session, item, type_, load, data):
        fd = data.take()
        try:
            payload = self.payloads.get((int(item), str(type_)))
            if payload is None:
                raise dbus.DBusException(f"No representation {type_} for item {int(item)}",
                                         name="org.dragbroker.Broker1.Error.NotFound")
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
        finally:
            # The reply ends the data, so every byte is written before it, and none after.
            os.close(fd)
        say("PROVIDE", int(item), type_, len(payload))


class Source:
    def __init__(self, arguments):
        self.arguments = arguments
        self.items, self.payloads = self.read_items(json.loads(arguments.items))
        DBusGMainLoop(set_as_default=True)
        self.bus = dbus.bus.BusConnection(arguments.bus) if arguments.bus else dbus.SessionBus()
        self.manager = dbus.Interface(self.bus.get_object(BUS, MANAGER), MANAGER_IFACE)
        self.provider = Provider(self.bus, self.payloads)
        self.session = None
        self.token = None
        self.ended = self.will_end = False
        self.bus.add_signal_receiver(self.on_session_signal, dbus_interface=SESSION_IFACE,
                                     path_keyword="path", member_keyword="member")
        self.window = self.make_window()

    @staticmethod
    def read_items(spec):
        items, payloads = [], {}
        for index, item in enumerate(spec):
            representations = []
            for rep in item["reps"]:
                if "file" in rep:
                    with open(rep["file"], "rb") as file:
                        payloads[(index, rep["type"])] = file.read()
                else:
                    payloads[(index, rep["type"])] = rep.get("text", "").encode()
                representations.append((rep["type"], rep.get("visibility", "all"), "data"))
            items.append(dbus.Struct((item.get("name", ""), float(item.get("width", 0)), float(item.get("height", 0)),
                                      dbus.Array(representations, signature="(sss)")), signature="sdda(sss)"))
        return dbus.Array(items, signature="(sdda(sss))"), payloads

    def make_window(self):
        window = Gtk.Window(title=self.arguments.title)
        window.set_decorated(False)
        window.set_default_size(self.arguments.width, self.arguments.height)
        window.move(self.arguments.x, self.arguments.y)
        box = Gtk.EventBox()
        box.add(Gtk.Label(label="Drag me"))
        actions = Gdk.DragAction.COPY | (Gdk.DragAction.MOVE if self.arguments.allow_move else Gdk.DragAction(0))
        box.drag_source_set(Gdk.ModifierType.BUTTON1_MASK, [Gtk.TargetEntry.new(TOKEN_TYPE, 0, 0)], actions)
        box.connect("drag-begin", self.on_drag_begin)
        box.connect("drag-data-get", self.on_drag_data_get)
        box.connect("drag-failed", self.on_drag_failed)
        box.connect("drag-end", self.on_drag_end)
        window.add(box)
        window.connect("destroy", Gtk.main_quit)
        window.connect("map-event", lambda *_: say("READY"))
        window.show_all()
        return window

    def on_drag_begin(self, widget, context):
        options = dbus.Dictionary({"AllowsMove": dbus.Boolean(self.arguments.allow_move)}, signature="sv")
        self.ended = self.will_end = False
        try:
            self.session, self.token = self.manager.BeginSession(self.items, options, dbus.ObjectPath(PROVIDER_PATH))
        except dbus.DBusException as error:
            self.session = self.token = None
            say("ERROR", *error_words(error))
            return
        say("BEGAN", self.session)
        # Any X client can read the token from XdndSelection anyway; printing it lets a test
        # check that it dies with the session.
        say("TOKEN", self.token)

    def on_drag_data_get(self, widget, context, selection, info, time):
        if self.token is not None:
            selection.set(Gdk.Atom.intern(TOKEN_TYPE, False), 8, self.token.encode("ascii"))

    def on_drag_failed(self, widget, context, result):
        say("DRAG-FAILED", result.value_nick)
        self.cancel()
        return False

    def on_drag_end(self, widget, context):
        say("DRAG-END")
        # The broker, not the toolkit, knows whether a drop happened: GTK 3 reports every X11
        # drag not refused by XdndFinished as succeeded, and every Wayland drag as not. A drop
        # sends WillEnd before the target finishes the toolkit's drop; the grace covers a
        # WillEnd still on its way when the toolkit's end arrives.
        if self.session is not None and not self.will_end and not self.ended:
            session = self.session

            def cancel_unless_dropped():
                if self.session == session:
                    self.cancel()
                return False
            GLib.timeout_add(DROP_GRACE_MS, cancel_unless_dropped)

    def cancel(self):
        """Released over nothing, or the drag ended without a drop the broker saw."""
        if self.session is None or self.ended or self.will_end:
            return
        session, self.ended = self.session, True
        try:
            dbus.Interface(self.bus.get_object(BUS, session), SESSION_IFACE).Cancel()
            say("CANCELLED")
        except dbus.DBusException as error:
            say("ERROR", *error_words(error))

    def on_session_signal(self, *arguments, path=None, member=None):
        if path != self.session:
            return
        if member == "WillEnd":
            self.will_end = True
            say("WILL-END", arguments[0])
        elif member == "LoadFinished":
            say("LOAD-FINISHED", int(arguments[0]), int(arguments[1]), arguments[2] or "-")
        elif member == "Ended":
            self.ended = True
            say("ENDED", arguments[0], arguments[1] or "-")
        elif member == "TransferFinished":
            say("TRANSFER-FINISHED")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bus", help="the bus address; the session bus when absent")
    parser.add_argument("--items", required=True)
    parser.add_argument("--title", default="gtk3-source")
    parser.add_argument("--x", type=int, default=20)
    parser.add_argument("--y", type=int, default=50)
    parser.add_argument("--width", type=int, default=200)
    parser.add_argument("--height", type=int, default=200)
    parser.add_argument("--allow-move", action="store_true")
    parser.add_argument("--timestamps", action="store_true", help="start each line with the monotonic clock")
    parser.add_argument("--wait-for-go", action="store_true",
                        help="read a line from stdin before the first bus call, so a launcher can place the process in its app scope")
    arguments = parser.parse_args()
    global STAMPED
    STAMPED = arguments.timestamps
    if arguments.wait_for_go:
        sys.stdin.readline()
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, Gtk.main_quit)
    Source(arguments)
    Gtk.main()


main()

#!/usr/bin/python3
"""A GTK 3 drag source that speaks the desktop drag protocol (docs/desktop-drag-protocol.md)
with dbus-python. The toolkit drag carries only the session token; the items go to the broker.

    gtk3_source.py --bus ADDRESS --items JSON [--title T] [--x X --y Y] [--allow-move] [--wait-for-go]

JSON is a list of items: {"name": "...", "width": 0, "height": 0, "reps": [{"type": "image/png",
"visibility": "all", "text": "..." | "file": "/path/of/the/bytes"}]}.

Prints, flushed: READY, BEGAN <session path>, TOKEN <token>, PROVIDE <item> <type> <nbytes>,
WILL-END <op>, LOAD-FINISHED <load> <bytes> <error or ->, ENDED <op> <error or ->, TRANSFER-FINISHED,
DRAG-FAILED <GtkDragResult nick>, DRAG-END, CANCELLED, and ERROR <name> <message>."""
import json
import signal

import dbus
from dbus.mainloop.glib import DBusGMainLoop
import gi

gi.require_version("Gtk", "3.0")
gi.require_version("Gdk", "3.0")
from gi.repository import Gdk, GLib, Gtk  # noqa: E402

import broker_protocol  # noqa: E402
from broker_protocol import BUS, SESSION_IFACE, MANAGER, MANAGER_IFACE, TOKEN_TYPE, Provider, say  # noqa: E402

PROVIDER_PATH = "/org/dragbroker/Provider1/gtk3"
DROP_GRACE_MS = 100


def error_words(error):
    return error.get_dbus_name(), error.get_dbus_message()


class Source(broker_protocol.Origin):
    def __init__(self, arguments):
        self.arguments = arguments
        self.items, self.payloads = broker_protocol.read_items(json.loads(arguments.items))
        DBusGMainLoop(set_as_default=True)
        self.bus = broker_protocol.connect(arguments.bus)
        self.manager = dbus.Interface(self.bus.get_object(BUS, MANAGER), MANAGER_IFACE)
        self.provider = Provider(self.bus, PROVIDER_PATH, self.payloads)
        self.session = None
        self.token = None
        self.ended = self.will_end = False
        self.bus.add_signal_receiver(self.on_session_signal, dbus_interface=SESSION_IFACE,
                                     path_keyword="path", member_keyword="member")
        self.window = self.make_window()

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
        self.provider.began(self.session)
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


def main():
    arguments = broker_protocol.arguments("gtk3-source", 20, "source", stamped=True)
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, Gtk.main_quit)
    Source(arguments)
    Gtk.main()


main()

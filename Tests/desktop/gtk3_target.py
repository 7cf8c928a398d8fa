#!/usr/bin/python3
"""A GTK 3 drop target that speaks the desktop drag protocol (docs/desktop-drag-protocol.md)
with dbus-python: it reads the token from the toolkit's offer and asks the broker everything else.

    gtk3_target.py --bus ADDRESS --accept TYPE [--accept TYPE ...] [--title T] [--x X --y Y] [--wait-for-go]

Prints, flushed: READY, PRESENTED <session path>, ITEMS <item:type,...>, STATUS <broker's answer>,
EXIT, DROPPED <op>, LOADED <item> <type> <nbytes> <sha256>, LOAD-FINISHED <load> <bytes> <error or ->,
CONCLUDED, REFUSED <error name> <message>, ENDED <op> <error or ->, and ERROR <name> <message>."""
import hashlib
import os
import signal

import dbus
from dbus.mainloop.glib import DBusGMainLoop
import gi

gi.require_version("Gtk", "3.0")
gi.require_version("Gdk", "3.0")
from gi.repository import Gdk, GLib, Gtk  # noqa: E402

import broker_protocol  # noqa: E402
from broker_protocol import BUS, MANAGER, MANAGER_IFACE, SESSION_IFACE, TOKEN_SYNTAX, TOKEN_TYPE, say  # noqa: E402

# GTK 3 sends drag-leave right before drag-drop: an Exit sent at once would withdraw the
# proposal the drop needs, so it waits this long and is dropped if the drop comes first.
EXIT_DELAY_MS = 200
ACTIONS = {"copy": Gdk.DragAction.COPY, "move": Gdk.DragAction.MOVE}


class Target(broker_protocol.Destination):
    def __init__(self, arguments):
        self.accepted = arguments.accept
        DBusGMainLoop(set_as_default=True)
        self.bus = broker_protocol.connect(arguments.bus)
        self.manager = dbus.Interface(self.bus.get_object(BUS, MANAGER), MANAGER_IFACE)
        self.bus.add_signal_receiver(self.on_session_signal, dbus_interface=SESSION_IFACE,
                                     path_keyword="path", member_keyword="member")
        self.forget_drag()
        self.window = self.make_window(arguments)

    def forget_drag(self):
        self.forget_visit()
        self.context = None          # the toolkit drag whose token was asked for
        self.exit_timer = 0

    def make_window(self, arguments):
        window = Gtk.Window(title=arguments.title)
        window.set_decorated(False)
        window.set_default_size(arguments.width, arguments.height)
        window.move(arguments.x, arguments.y)
        area = Gtk.EventBox()
        area.add(Gtk.Label(label="Drop " + ", ".join(self.accepted)))
        # No default handling: the broker, not GTK, decides the status of every motion.
        area.drag_dest_set(0, [Gtk.TargetEntry.new(TOKEN_TYPE, 0, 0)], Gdk.DragAction.COPY | Gdk.DragAction.MOVE)
        area.connect("drag-motion", self.on_motion)
        area.connect("drag-data-received", self.on_data_received)
        area.connect("drag-leave", self.on_leave)
        area.connect("drag-drop", self.on_drop)
        window.add(area)
        window.connect("destroy", Gtk.main_quit)
        window.connect("map-event", lambda *_: say("READY"))
        window.show_all()
        return window

    @staticmethod
    def offers_token(context):
        return any(target.name() == TOKEN_TYPE for target in context.list_targets())

    @staticmethod
    def proposal_for(context):
        return "move" if context.get_suggested_action() == Gdk.DragAction.MOVE else "copy"

    def status(self, context, time):
        Gdk.drag_status(context, ACTIONS.get(self.answer, 0), time)

    # Motion

    def on_motion(self, widget, context, x, y, time):
        if not self.offers_token(context):
            return False
        self.cancel_exit()
        if context != self.context:
            # A new toolkit drag, or the same drag back after a leave: the token comes first.
            # While it is on its way the drop shows as refused.
            self.context = context
            self.entered = False
            widget.drag_get_data(context, Gdk.Atom.intern(TOKEN_TYPE, False), time)
            Gdk.drag_status(context, 0, time)
            return True
        if self.session is not None:
            self.propose(self.proposal_for(context))
        self.status(context, time)
        return True

    def on_data_received(self, widget, context, x, y, selection, info, time):
        data = selection.get_data() or b""
        if not TOKEN_SYNTAX.fullmatch(data):
            say("ERROR", "invalid-token", f"{len(data)} bytes that are not a session token")
            Gdk.drag_status(context, 0, time)
            return
        token = data.decode("ascii")
        if token != self.token and not self.present(token) or self.session is None:
            Gdk.drag_status(context, 0, time)
            return
        self.propose(self.proposal_for(context))
        self.status(context, time)

    # Leave

    def on_leave(self, widget, context, time):
        if self.session is not None and self.entered and not self.exit_timer:
            self.exit_timer = GLib.timeout_add(EXIT_DELAY_MS, self.exit)
        self.context = None

    def cancel_exit(self):
        if self.exit_timer:
            GLib.source_remove(self.exit_timer)
            self.exit_timer = 0

    def exit(self):
        self.exit_timer = 0
        self.withdraw()
        return False

    # Drop

    def on_drop(self, widget, context, x, y, time):
        self.cancel_exit()
        if not self.offers_token(context):
            return False
        if self.session is None or not self.entered:
            say("REFUSED", "-", "the drop came before the broker answered")
            Gtk.drag_finish(context, False, False, time)
            return True
        try:
            operation = str(self.session.PerformDrop())
        except dbus.DBusException as error:
            say("REFUSED", error.get_dbus_name(), error.get_dbus_message())
            Gtk.drag_finish(context, False, False, time)
            return True
        say("DROPPED", operation)
        for item, type_ in self.wanted:
            self.load(item, type_)
        try:
            self.session.Conclude()
            say("CONCLUDED")
        except dbus.DBusException as error:
            say("ERROR", error.get_dbus_name(), error.get_dbus_message())
        Gtk.drag_finish(context, True, operation == "move", time)
        self.forget_drag()
        return True

    def load(self, item, type_):
        try:
            handle, load, kind = self.session.Load(dbus.UInt32(item), type_)
        except dbus.DBusException as error:
            say("ERROR", error.get_dbus_name(), error.get_dbus_message())
            return
        fd = handle.take()
        digest, size = hashlib.sha256(), 0
        try:
            while chunk := os.read(fd, 1 << 16):
                digest.update(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        say("LOADED", item, type_, size, digest.hexdigest())

    def on_session_signal(self, *arguments, path=None, member=None):
        if member == "LoadFinished":
            say("LOAD-FINISHED", int(arguments[0]), int(arguments[1]), arguments[2] or "-")
        elif member == "Ended":
            say("ENDED", arguments[0], arguments[1] or "-")
            if path == self.session_path:
                self.cancel_exit()
                self.forget_drag()


def main():
    arguments = broker_protocol.arguments("gtk3-target", 300, "target", stamped=True)
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, Gtk.main_quit)
    Target(arguments)
    Gtk.main()


main()

#!/usr/bin/python3
"""A GTK 3 drop target that knows nothing of the broker: it takes text/plain and text/uri-list
with GTK's default handling, as most apps do.

    plain_target.py [--title T] [--x X --y Y]

Prints, flushed: READY, OFFER <the drag's types, comma-separated> on the first motion of each
drag, and RECEIVED <type> <nbytes> <text> for whatever a drop gives it."""
import argparse
import signal

import gi

gi.require_version("Gtk", "3.0")
gi.require_version("Gdk", "3.0")
from gi.repository import Gdk, GLib, Gtk  # noqa: E402

ACCEPTED = ["text/uri-list", "text/plain;charset=utf-8", "text/plain", "UTF8_STRING"]


def say(*words):
    print(" ".join(str(w) for w in words), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--title", default="plain-target")
    parser.add_argument("--x", type=int, default=580)
    parser.add_argument("--y", type=int, default=50)
    parser.add_argument("--width", type=int, default=200)
    parser.add_argument("--height", type=int, default=200)
    arguments = parser.parse_args()

    window = Gtk.Window(title=arguments.title)
    window.set_decorated(False)
    window.set_default_size(arguments.width, arguments.height)
    window.move(arguments.x, arguments.y)
    area = Gtk.EventBox()
    area.add(Gtk.Label(label="Drop text"))
    area.drag_dest_set(Gtk.DestDefaults.ALL, [Gtk.TargetEntry.new(t, 0, i) for i, t in enumerate(ACCEPTED)],
                       Gdk.DragAction.COPY)
    # Otherwise GTK answers a drag offering none of its types without telling the app at all.
    area.drag_dest_set_track_motion(True)
    seen = set()

    def on_motion(widget, context, x, y, time):
        if context not in seen:
            seen.add(context)
            say("OFFER", ",".join(target.name() for target in context.list_targets()))
        return False

    def on_received(widget, context, x, y, selection, info, time):
        data = selection.get_data() or b""
        say("RECEIVED", selection.get_data_type().name(), len(data), data.decode("utf-8", "replace"))

    area.connect("drag-motion", on_motion)
    area.connect("drag-data-received", on_received)
    window.add(area)
    window.connect("destroy", Gtk.main_quit)
    window.connect("map-event", lambda *_: say("READY"))
    window.show_all()
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, Gtk.main_quit)
    Gtk.main()


main()

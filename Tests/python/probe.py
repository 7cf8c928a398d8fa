#!/usr/bin/python3
"""A raw D-Bus client driven line by line on stdin, for tests that need calls the client
library does not make (Properties, ObjectManager, manager methods by hand), from inside a
sandbox as well as outside. It connects to $DRAGBROKER_BUS_ADDRESS, prints "READY <unique
name>", then answers each command with one line: "OK <result>" or "ERR <error name> <message>".
Results are JSON with sorted keys, so tests compare them exactly."""
import json
import os
import sys

import dbus
from dbus.mainloop.glib import DBusGMainLoop
from gi.repository import GLib

BUS, MANAGER = "org.dragbroker.Broker1", "/org/dragbroker/Broker1"
MANAGER_IFACE = "org.dragbroker.Broker1.Manager"
SESSION_IFACE = "org.dragbroker.Broker1.Session"
PROPERTIES = "org.freedesktop.DBus.Properties"
OBJECT_MANAGER = "org.freedesktop.DBus.ObjectManager"


def plain(value):
    """dbus-python's types as JSON's."""
    if isinstance(value, (dbus.Dictionary, dict)):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (dbus.Array, dbus.Struct, list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dbus.Boolean):
        return bool(value)
    if isinstance(value, (dbus.String, dbus.ObjectPath, dbus.Signature)):
        return str(value)
    if isinstance(value, (dbus.Double,)):
        return float(value)
    if isinstance(value, (dbus.Byte, dbus.Int16, dbus.UInt16, dbus.Int32, dbus.UInt32, dbus.Int64, dbus.UInt64)):
        return int(value)
    return value


def main():
    bus = dbus.bus.BusConnection(os.environ["DRAGBROKER_BUS_ADDRESS"], mainloop=DBusGMainLoop())
    signals = []

    def on_signal(*args, **where):
        # Only what the broker sends: the bus driver's own signals say nothing of sessions.
        if where["sender"] != "org.freedesktop.DBus":
            signals.append([where["interface"], where["member"], where["path"], plain(list(args))])

    bus.add_signal_receiver(on_signal, sender_keyword="sender", path_keyword="path",
                            interface_keyword="interface", member_keyword="member")

    def call(path, interface, member, *args, signature=None):
        return bus.call_blocking(BUS, path, interface, member, signature, args, timeout=20)

    def answer(words):
        command, args = words[0], words[1:]
        if command == "whoami":
            return plain(call(MANAGER, MANAGER_IFACE, "WhoAmI"))
        if command == "count":
            return plain(call(MANAGER, PROPERTIES, "Get", MANAGER_IFACE, "SessionCount", signature="ss"))
        if command == "list":
            return [[str(s[0]), str(s[1]), str(s[2]), str(s[3]), int(s[4])] for s in call(MANAGER, MANAGER_IFACE, "ListSessions")]
        if command == "describe":
            return plain(call(MANAGER, MANAGER_IFACE, "DescribeSession", args[0], signature="s"))
        if command == "monitor":
            call(MANAGER, MANAGER_IFACE, "Monitor")
            return None
        if command == "begin":
            # One text/plain item per visibility named; no provider is served, so never loaded.
            items = [("probe.txt", 0.0, 0.0, [(f"text/x-{v}", v, "data") for v in args[1:]])]
            options = {"RestrictedToApp": dbus.Boolean(args[0] == "restricted")}
            path, token = call(MANAGER, MANAGER_IFACE, "BeginSession", items, options, "/org/dragbroker/Provider1/probe",
                               signature="a(sdda(sss))a{sv}o")
            return [str(path), str(token)]
        if command == "present":
            return str(call(MANAGER, MANAGER_IFACE, "PresentToken", args[0], signature="s"))
        if command == "get":
            return plain(call(args[0], PROPERTIES, "Get", SESSION_IFACE, args[1], signature="ss"))
        if command == "getall":
            return plain(call(args[0], PROPERTIES, "GetAll", SESSION_IFACE, signature="s"))
        if command == "set":
            call(args[0], PROPERTIES, "Set", SESSION_IFACE, args[1], dbus.String(args[2], variant_level=1), signature="ssv")
            return None
        if command == "managed":
            return plain(call(args[0] if args else MANAGER, OBJECT_MANAGER, "GetManagedObjects"))
        if command == "children":
            xml = str(call(args[0], "org.freedesktop.DBus.Introspectable", "Introspect"))
            return [line.split('"')[1] for line in xml.splitlines() if line.strip().startswith("<node name=")]
        if command == "call":
            # A session method with string or unsigned arguments: "call PATH MEMBER SIGNATURE ARG...".
            path, member, signature = args[0], args[1], (args[2] if len(args) > 2 else "")
            values = [dbus.UInt32(int(a)) if t == "u" else dbus.UInt64(int(a)) if t == "t" else a
                      for t, a in zip(signature, args[3:])]
            if signature == "a(sdda(sss))":
                values = [[("x", 0.0, 0.0, [("text/plain", "all", "data")])]]
            return plain(call(path, SESSION_IFACE, member, *values, signature=signature or None))
        if command == "signals":
            # Whatever the broker sent this connection so far, after letting it arrive.
            context = GLib.MainContext.default()
            deadline = GLib.get_monotonic_time() + int(float(args[0]) * 1_000_000)
            while GLib.get_monotonic_time() < deadline:
                context.iteration(False) or GLib.usleep(10_000)
            seen = list(signals)
            signals.clear()
            return seen
        raise ValueError(f"unknown command {command}")

    print(f"READY {bus.get_unique_name()}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            result = answer(words)
            print("OK" if result is None else "OK " + json.dumps(result, sort_keys=True, ensure_ascii=False), flush=True)
        except dbus.exceptions.DBusException as error:
            print(f"ERR {error.get_dbus_name()} {error.get_dbus_message()}", flush=True)


if __name__ == "__main__":
    main()

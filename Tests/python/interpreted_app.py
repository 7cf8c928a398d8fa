#!/usr/bin/python3
"""One interpreted app: every unsandboxed Python program runs as /usr/bin/python3, so only
its systemd scope can tell the daemon which app it is. Waits for a first line on stdin
(the test moves it into its scope meanwhile), connects, prints its app ID, then obeys
"begin" (a session restricted to its own app), "present TOKEN" and "additems SESSION-PATH",
a line each."""
import sys

import dbus

BUS, MANAGER, MANAGER_IFACE = "org.dragbroker.Broker1", "/org/dragbroker/Broker1", "org.dragbroker.Broker1.Manager"


def main():
    sys.stdin.readline()
    bus = dbus.bus.BusConnection(sys.argv[1])
    manager = dbus.Interface(bus.get_object(BUS, MANAGER), MANAGER_IFACE)
    identity = manager.WhoAmI()
    print(f"app {identity['AppID']} from {identity['Source']}", flush=True)
    for line in sys.stdin:
        command, *arguments = line.split()
        try:
            if command == "begin":
                items = dbus.Array([("note.txt", 0.0, 0.0, [("text/plain", "all", "data")])], signature="(sdda(sss))")
                options = dbus.Dictionary({"RestrictedToApp": dbus.Boolean(True)}, signature="sv")
                _, token = manager.BeginSession(items, options, dbus.ObjectPath("/org/dragbroker/Provider1/py"))
                print(f"token {token}", flush=True)
            elif command == "present":
                print(f"presented {manager.PresentToken(arguments[0])}", flush=True)
            elif command == "additems":
                session = dbus.Interface(bus.get_object(BUS, arguments[0]), "org.dragbroker.Broker1.Session")
                session.AddItems(dbus.Array([("more.txt", 0.0, 0.0, [("text/plain", "all", "data")])], signature="(sdda(sss))"))
                print("added", flush=True)
        except dbus.DBusException as error:
            print(f"error {error.get_dbus_name()} {error.get_dbus_message()}", flush=True)


main()

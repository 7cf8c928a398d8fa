#!/usr/bin/python3
"""A complete drag driven from Python with dbus-python, using only the published
interface XML: a source process that begins a drag and serves its provider, and a
destination process that presents the token, drops and loads. Prints what each saw."""
import os
import sys

BUS, MANAGER = "org.dragbroker.Broker1", "/org/dragbroker/Broker1"
MANAGER_IFACE = "org.dragbroker.Broker1.Manager"
SESSION_IFACE = "org.dragbroker.Broker1.Session"
PROVIDER_PATH = "/org/dragbroker/Provider1/py"
TYPE = "text/plain;charset=utf-8"
PAYLOAD = "Grüße from Python".encode()


def destination(address, token):
    import dbus
    bus = dbus.bus.BusConnection(address)
    session_path = dbus.Interface(bus.get_object(BUS, MANAGER), MANAGER_IFACE).PresentToken(token)
    session = dbus.Interface(bus.get_object(BUS, session_path), SESSION_IFACE)
    for name, width, height, types in session.GetItems():
        print(f"destination: item {name} {int(width)}x{int(height)} types {[str(t) for t in types]}")
    print(f"destination: enter copy -> {session.Enter('copy')}")
    print(f"destination: drop -> {session.PerformDrop()}")
    fd, load, kind = session.Load(dbus.UInt32(0), TYPE)
    fd = fd.take()
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    print(f"destination: {kind} load {int(load)} got {data.decode()!r}")
    session.Conclude()
    print("destination: concluded")


def source(address, token_pipe):
    import dbus
    import dbus.service
    from dbus.mainloop.glib import DBusGMainLoop
    from gi.repository import GLib

    DBusGMainLoop(set_as_default=True)
    bus = dbus.bus.BusConnection(address)
    loop = GLib.MainLoop()

    class Provider(dbus.service.Object):
        @dbus.service.method("org.dragbroker.Provider1", in_signature="ousuh", out_signature="", sender_keyword="sender")
        def Provide(self, session, item, type_, load, data, sender=None):
            fd = data.take()
            # Any peer can call an exported object: only the broker is served.
            if sender != bus.get_name_owner(BUS):
                os.close(fd)
                raise dbus.DBusException("Only dragbrokerd may request data from this provider",
                                         name="org.dragbroker.Broker1.Error.AccessDenied")
            print(f"source: provide item {int(item)} as {type_}")
            os.write(fd, PAYLOAD)
            os.close(fd)

    def on_signal(*args, member=None):
        print(f"source: {member} {' '.join(str(a) for a in args)}".rstrip())
        if member == "TransferFinished":
            loop.quit()

    provider = Provider(bus, PROVIDER_PATH)
    manager = dbus.Interface(bus.get_object(BUS, MANAGER), MANAGER_IFACE)
    items = dbus.Array([dbus.Struct(("greeting.txt", 640.0, 480.0, dbus.Array([(TYPE, "all", "data")], signature="(sss)")),
                                    signature="sdda(sss)")], signature="(sdda(sss))")
    path, token = manager.BeginSession(items, dbus.Dictionary({}, signature="sv"), dbus.ObjectPath(PROVIDER_PATH))
    bus.add_signal_receiver(on_signal, dbus_interface=SESSION_IFACE, path=path, member_keyword="member")
    print(f"source: began {path}")
    sys.stdout.flush()
    os.write(token_pipe, (token + "\n").encode())
    os.close(token_pipe)
    GLib.timeout_add_seconds(20, loop.quit)
    loop.run()
    del provider


def main():
    address = sys.argv[1]
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        source(address, write_end)
        sys.stdout.flush()
        os._exit(0)
    os.close(write_end)
    token = os.read(read_end, 1024).decode().strip()
    destination(address, token)
    sys.stdout.flush()
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


main()

#!/usr/bin/python3
"""A source written with PyGObject's GDBus, the way GTK apps serve D-Bus: its Provide handler
writes the bytes and replies, while the call's message, and so the write end in its fd list,
stays alive, as GDBus keeps it until the invocation is freed and as Qt's delayed replies do.
The load must end with the reply all the same. A dbus-python destination in a second process
drops and loads. Usage: gio_provider.py BUS_ADDRESS PROVIDER_XML [BYTES]"""
import os
import sys

BUS, MANAGER = "org.dragbroker.Broker1", "/org/dragbroker/Broker1"
MANAGER_IFACE = "org.dragbroker.Broker1.Manager"
SESSION_IFACE = "org.dragbroker.Broker1.Session"
PROVIDER_PATH = "/org/dragbroker/Provider1/gio"
TYPE = "text/plain;charset=utf-8"


def payload(size):
    pattern = b"GDBus keeps the call's descriptors. "
    return (pattern * (size // len(pattern) + 1))[:size]


def destination(address, token, size):
    import dbus
    bus = dbus.bus.BusConnection(address)
    session_path = dbus.Interface(bus.get_object(BUS, MANAGER), MANAGER_IFACE).PresentToken(token)
    session = dbus.Interface(bus.get_object(BUS, session_path), SESSION_IFACE)
    print(f"destination: enter copy -> {session.Enter('copy')}")
    print(f"destination: drop -> {session.PerformDrop()}")
    fd, load, kind = session.Load(dbus.UInt32(0), TYPE)
    fd = fd.take()
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    print(f"destination: {kind} load {int(load)} got {len(data)} bytes, exact: {data == payload(size)}")
    session.Conclude()
    print("destination: concluded")


def source(address, provider_xml, size, token_pipe):
    from gi.repository import Gio, GLib

    connection = Gio.DBusConnection.new_for_address_sync(
        address, Gio.DBusConnectionFlags.AUTHENTICATION_CLIENT | Gio.DBusConnectionFlags.MESSAGE_BUS_CONNECTION, None, None)
    interface = Gio.DBusNodeInfo.new_for_xml(open(provider_xml).read()).interfaces[0]
    loop = GLib.MainLoop()
    kept = []

    broker = connection.call_sync("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetNameOwner",
                                  GLib.Variant("(s)", ("org.dragbroker.Broker1",)), None, Gio.DBusCallFlags.NONE, -1, None).unpack()[0]

    def on_call(connection, sender, path, interface_name, method, parameters, invocation):
        # Any peer can call an exported object: only the broker is served.
        if sender != broker:
            invocation.return_dbus_error("org.dragbroker.Broker1.Error.AccessDenied",
                                         "Only dragbrokerd may request data from this provider")
            return
        message = invocation.get_message()
        # get() duplicates; the original stays in the message's fd list, which `kept` holds.
        fd = message.get_unix_fd_list().get(parameters.unpack()[4])
        os.write(fd, payload(size))
        os.close(fd)
        kept.append(message)
        print(f"source: provided {size} bytes, write end still held")
        sys.stdout.flush()
        invocation.return_value(None)

    connection.register_object(PROVIDER_PATH, interface, on_call, None, None)

    def on_signal(connection, sender, path, interface_name, member, parameters):
        print(f"source: {member} {' '.join(str(a) for a in parameters.unpack())}".rstrip())
        sys.stdout.flush()
        if member == "TransferFinished":
            loop.quit()

    items = GLib.Variant("(a(sdda(sss))a{sv}o)", (
        [("greeting.txt", 0.0, 0.0, [(TYPE, "all", "data")])], {}, PROVIDER_PATH))
    reply = connection.call_sync(BUS, MANAGER, MANAGER_IFACE, "BeginSession", items, GLib.VariantType("(os)"),
                                 Gio.DBusCallFlags.NONE, -1, None)
    path, token = reply.unpack()
    connection.signal_subscribe(None, SESSION_IFACE, None, path, None, Gio.DBusSignalFlags.NONE, on_signal)
    print(f"source: began {path}")
    sys.stdout.flush()
    os.write(token_pipe, (token + "\n").encode())
    os.close(token_pipe)
    GLib.timeout_add_seconds(20, loop.quit)
    loop.run()


def main():
    address, provider_xml = sys.argv[1], sys.argv[2]
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 5000
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        source(address, provider_xml, size, write_end)
        sys.stdout.flush()
        os._exit(0)
    os.close(write_end)
    token = os.read(read_end, 1024).decode().strip()
    destination(address, token, size)
    sys.stdout.flush()
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


main()

"""What the Python test apps share, toolkit aside: the protocol's names, one line of output
per step, the source's Provider1 object and its items. Everything here follows
docs/desktop-drag-protocol.md and the interface XML; the toolkit part of each app is its own."""
import argparse
import os
import re
import sys
import time

import dbus
import dbus.service

BUS, MANAGER = "org.dragbroker.Broker1", "/org/dragbroker/Broker1"
MANAGER_IFACE = "org.dragbroker.Broker1.Manager"
SESSION_IFACE = "org.dragbroker.Broker1.Session"
PROVIDER_IFACE = "org.dragbroker.Provider1"
TOKEN_TYPE = "application/vnd.dragbroker.token.v1"
TOKEN_SYNTAX = re.compile(rb"[0-9a-f]{64}")

# With timestamps each line starts with CLOCK_MONOTONIC, taken as the event happens, so
# measure.py can time a drag across processes without their scheduling in the way.
timestamps = False


def say(*words):
    if timestamps:
        words = (f"{time.monotonic():.6f}",) + words
    print(" ".join(str(w) for w in words), flush=True)


def connect(address):
    """The bus at `address`, else the session bus; the main loop must be set as default first."""
    return dbus.bus.BusConnection(address) if address else dbus.SessionBus()


def read_items(spec):
    """BeginSession's items (a(sdda(sss))) and the bytes of each representation, from a list
    of {"name", "width", "height", "reps": [{"type", "visibility", "text" | "file"}]}."""
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


class Provider(dbus.service.Object):
    """Serves the bytes of a representation once the broker asks, after the drop. Any peer on
    the bus can call an exported object, so only the broker's calls, for sessions this app
    began, are served."""

    def __init__(self, bus, path, payloads):
        super().__init__(bus, path)
        self.payloads = payloads
        self.sessions = set()

    def began(self, session):
        self.sessions.add(str(session))

    @dbus.service.method(PROVIDER_IFACE, in_signature="ousuh", out_signature="", sender_keyword="sender")
    def Provide(self, session, item, type_, load, data, sender=None):
        fd = data.take()
        try:
            if sender != self.connection.get_name_owner(BUS) or str(session) not in self.sessions:
                raise dbus.DBusException("Only dragbrokerd may request data from this provider",
                                         name="org.dragbroker.Broker1.Error.AccessDenied")
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


def acceptable_items(session, accepted):
    """(item, type) to load: for each accepted type, in the app's order, the items the broker
    says conform to it. Load takes that same type: the broker serves the item's closest listed
    type, the first listed among equally close ones."""
    wanted, taken = [], set()
    for type_ in accepted:
        for item in session.ConformingItems(type_):
            if int(item) not in taken:
                wanted.append((int(item), type_))
                taken.add(int(item))
    return wanted


class Destination:
    """A target's calls to the broker for the drag over it, the toolkit aside: present the
    token, find what the app takes, propose, withdraw. A target class mixes this in and
    provides `bus`, `manager` and `accepted`; its toolkit decides when each call happens."""

    def forget_visit(self):
        self.token = None
        self.session_path = None
        self.session = None
        self.wanted = []
        self.entered = False
        self.proposal = None
        self.answer = "cancel"

    def present(self, token):
        self.token = token
        try:
            self.session_path = self.manager.PresentToken(token)
            self.session = dbus.Interface(self.bus.get_object(BUS, self.session_path), SESSION_IFACE)
            say("PRESENTED", self.session_path)
            self.wanted = acceptable_items(self.session, self.accepted)
        except dbus.DBusException as error:
            say("REFUSED", error.get_dbus_name(), error.get_dbus_message())
            self.session = None
            return False
        say("ITEMS", ",".join(f"{item}:{type_}" for item, type_ in self.wanted) or "-")
        return True

    def propose(self, proposal):
        # Nothing to take proposes cancel; the broker answers forbidden when the
        # administrator's policy is why, and the status shows its answer either way.
        if not self.wanted:
            proposal = "cancel"
        if self.entered and proposal == self.proposal:
            return
        try:
            answer = self.session.Update(proposal) if self.entered else self.session.Enter(proposal)
        except dbus.DBusException as error:
            say("REFUSED", error.get_dbus_name(), error.get_dbus_message())
            answer = "cancel"
        self.entered, self.proposal, self.answer = True, proposal, str(answer)
        say("STATUS", self.answer)

    def withdraw(self):
        """Exit, once the pointer left for good."""
        if self.session is not None and self.entered:
            self.entered = False
            self.proposal = None
            try:
                self.session.Exit()
                say("EXIT")
            except dbus.DBusException as error:
                # NotFound when the source cancelled meanwhile: nothing left to withdraw.
                say("ERROR", error.get_dbus_name(), error.get_dbus_message())


def arguments(title, x, role, stamped=False):
    """The command line every app here takes; `role` is "source" (--items) or "target" (--accept)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--bus", help="the bus address; the session bus when absent")
    if role == "source":
        parser.add_argument("--items", required=True)
        parser.add_argument("--allow-move", action="store_true")
    else:
        parser.add_argument("--accept", action="append", required=True, help="a MIME type, wildcard or UTI this app takes")
    parser.add_argument("--title", default=title)
    parser.add_argument("--x", type=int, default=x)
    parser.add_argument("--y", type=int, default=50)
    parser.add_argument("--width", type=int, default=200)
    parser.add_argument("--height", type=int, default=200)
    if stamped:
        parser.add_argument("--timestamps", action="store_true", help="start each line with the monotonic clock")
    parser.add_argument("--wait-for-go", action="store_true",
                        help="read a line from stdin before the first bus call, so a launcher can place the process in its app scope")
    parsed = parser.parse_args()
    if stamped:
        set_timestamps(parsed.timestamps)
    if parsed.wait_for_go:
        sys.stdin.readline()
    return parsed


def set_timestamps(enabled):
    global timestamps
    timestamps = enabled


class Origin:
    """A source's calls to the broker and what it hears back, the toolkit aside. A source class
    mixes this in and provides `bus` and `session`, the path BeginSession returned."""

    def cancel(self):
        """Released over nothing, or the drag ended without a drop the broker saw."""
        if self.session is None or self.ended or self.will_end:
            return
        session, self.ended = self.session, True
        try:
            dbus.Interface(self.bus.get_object(BUS, session), SESSION_IFACE).Cancel()
            say("CANCELLED")
        except dbus.DBusException as error:
            say("ERROR", error.get_dbus_name(), error.get_dbus_message())

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

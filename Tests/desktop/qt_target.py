#!/usr/bin/python3
"""A PyQt5 drop target that speaks the desktop drag protocol (docs/desktop-drag-protocol.md)
with dbus-python on Qt's main loop: it reads the token from the toolkit's offer and asks the
broker everything else.

    qt_target.py --bus ADDRESS --accept TYPE [--accept TYPE ...] [--title T] [--x X --y Y] [--wait-for-go]

Prints, flushed: READY, PRESENTED <session path>, ITEMS <item:type,...>, STATUS <broker's answer>,
EXIT, DROPPED <op>, LOADED <item> <type> <nbytes> <sha256>, LOAD-FINISHED <load> <bytes> <error or ->,
CONCLUDED, REFUSED <error name> <message>, ENDED <op> <error or ->, and ERROR <name> <message>."""
import hashlib
import os

import dbus
from PyQt5.QtCore import QSocketNotifier, Qt, QTimer
from PyQt5.QtWidgets import QLabel, QVBoxLayout

import broker_protocol
import qt_loop
from broker_protocol import BUS, MANAGER, MANAGER_IFACE, SESSION_IFACE, TOKEN_SYNTAX, TOKEN_TYPE, say

# An Exit waits this long after a leave and is dropped if a drop or a new enter comes first.
EXIT_DELAY_MS = 200
ACTIONS = {"copy": Qt.CopyAction, "move": Qt.MoveAction}


class Load:
    """One Load: its pipe read as it becomes readable, its LoadFinished whenever it comes."""

    def __init__(self, item, type_, load_id, fd, on_done):
        self.item, self.type, self.id, self.fd = item, type_, load_id, fd
        self.digest, self.size = hashlib.sha256(), 0
        self.eof = self.finished = False
        self.on_done = on_done
        os.set_blocking(fd, False)
        self.notifier = QSocketNotifier(fd, QSocketNotifier.Read)
        self.notifier.activated.connect(self.readable)

    def readable(self):
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                break
            self.digest.update(chunk)
            self.size += len(chunk)
        self.notifier.setEnabled(False)
        os.close(self.fd)
        self.eof = True
        say("LOADED", self.item, self.type, self.size, self.digest.hexdigest())
        self.on_done()

    def finish(self):
        self.finished = True
        self.on_done()


class Target(qt_loop.Window, broker_protocol.Destination):
    def __init__(self, arguments):
        super().__init__(arguments)
        self.accepted = arguments.accept
        self.bus = broker_protocol.connect(arguments.bus)
        self.manager = dbus.Interface(self.bus.get_object(BUS, MANAGER), MANAGER_IFACE)
        self.bus.add_signal_receiver(self.on_session_signal, dbus_interface=SESSION_IFACE,
                                     path_keyword="path", member_keyword="member")
        self.exit_timer = QTimer(self, singleShot=True, interval=EXIT_DELAY_MS)
        self.exit_timer.timeout.connect(self.withdraw)
        self.loads = {}
        self.concluding = None
        self.forget_visit()
        self.setAcceptDrops(True)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Drop " + ", ".join(self.accepted)))
        self.show()

    @staticmethod
    def proposal_for(event):
        return "move" if event.proposedAction() == Qt.MoveAction else "copy"

    def apply(self, event):
        """The broker's answer is the drop status: Qt takes it only inside the enter and move handlers."""
        if self.answer in ACTIONS:
            event.setDropAction(ACTIONS[self.answer])
            event.accept()
        else:
            event.ignore()

    # Enter and motion: every broker call blocks, so that its answer is this event's status.

    def dragEnterEvent(self, event):
        if not event.mimeData().hasFormat(TOKEN_TYPE):
            event.ignore()
            return
        self.exit_timer.stop()
        # Read once per enter: on X11 every QMimeData.data is a selection round trip.
        data = bytes(event.mimeData().data(TOKEN_TYPE))
        if not TOKEN_SYNTAX.fullmatch(data):
            say("ERROR", "invalid-token", f"{len(data)} bytes that are not a session token")
            event.ignore()
            return
        token = data.decode("ascii")
        if token != self.token and not self.present(token):
            event.ignore()
            return
        self.entered = False
        self.propose(self.proposal_for(event))
        self.apply(event)

    def dragMoveEvent(self, event):
        if self.session is None:
            event.ignore()
            return
        self.propose(self.proposal_for(event))
        self.apply(event)

    # Leave

    def dragLeaveEvent(self, event):
        if self.session is not None and self.entered:
            self.exit_timer.start()

    # Drop: Qt has no deferred finish, so the drop is accepted or ignored before this returns,
    # with the broker's operation; the bytes are read afterwards.

    def dropEvent(self, event):
        self.exit_timer.stop()
        if self.session is None or not self.entered:
            say("REFUSED", "-", "the drop came before the broker answered")
            event.ignore()
            return
        try:
            operation = str(self.session.PerformDrop())
        except dbus.DBusException as error:
            say("REFUSED", error.get_dbus_name(), error.get_dbus_message())
            event.ignore()
            return
        say("DROPPED", operation)
        event.setDropAction(ACTIONS[operation])
        event.accept()
        self.concluding = (self.session, self.session_path)
        for item, type_ in self.wanted:
            try:
                handle, load_id, kind = self.session.Load(dbus.UInt32(item), type_)
            except dbus.DBusException as error:
                say("ERROR", error.get_dbus_name(), error.get_dbus_message())
                continue
            self.loads[int(load_id)] = Load(item, type_, int(load_id), handle.take(), self.conclude_when_done)
        self.forget_visit()
        self.conclude_when_done()

    def conclude_when_done(self):
        """Conclude once every load has both reached end of file and had its LoadFinished:
        they come in either order, and only LoadFinished tells a failure from an empty representation."""
        if self.concluding is None or any(not (load.eof and load.finished) for load in self.loads.values()):
            return
        session, _ = self.concluding
        self.concluding = None
        self.loads = {}
        try:
            session.Conclude()
            say("CONCLUDED")
        except dbus.DBusException as error:
            say("ERROR", error.get_dbus_name(), error.get_dbus_message())

    def on_session_signal(self, *arguments, path=None, member=None):
        if member == "LoadFinished":
            say("LOAD-FINISHED", int(arguments[0]), int(arguments[1]), arguments[2] or "-")
            load = self.loads.get(int(arguments[0]))
            if load is not None and self.concluding is not None and path == self.concluding[1]:
                load.finish()
        elif member == "Ended":
            say("ENDED", arguments[0], arguments[1] or "-")
            if path == self.session_path:
                self.exit_timer.stop()
                self.forget_visit()


def main():
    arguments = broker_protocol.arguments("qt-target", 300, "target")
    qt_loop.run(lambda: Target(arguments))


main()

#!/usr/bin/python3
"""A PyQt5 drag source that speaks the desktop drag protocol (docs/desktop-drag-protocol.md).
PyQt's QtDBus cannot marshal BeginSession's items, so the bus is dbus-python's, dispatched by
Qt's main loop (dbus.mainloop.pyqt5), with the Provider1 object on the same connection. The
toolkit drag carries only the session token; the items go to the broker.

    qt_source.py --bus ADDRESS --items JSON [--title T] [--x X --y Y] [--allow-move] [--wait-for-go]

JSON is a list of items: {"name": "...", "width": 0, "height": 0, "reps": [{"type": "image/png",
"visibility": "all", "text": "..." | "file": "/path/of/the/bytes"}]}.

Prints, flushed: READY, BEGAN <session path>, TOKEN <token>, EXEC <copy|move|ignore>,
PROVIDE <item> <type> <nbytes>, WILL-END <op>, LOAD-FINISHED <load> <bytes> <error or ->,
ENDED <op> <error or ->, TRANSFER-FINISHED, CANCELLED, and ERROR <name> <message>."""
import json

import dbus
from PyQt5.QtCore import QByteArray, QMimeData, Qt, QTimer
from PyQt5.QtGui import QDrag
from PyQt5.QtWidgets import QApplication, QLabel, QVBoxLayout

import broker_protocol
import qt_loop
from broker_protocol import BUS, MANAGER, MANAGER_IFACE, SESSION_IFACE, TOKEN_TYPE, Provider, say

PROVIDER_PATH = "/org/dragbroker/Provider1/qt"
# On X11 QDrag.exec returns when XdndDrop is sent, before the target has called PerformDrop:
# a source that is not told IgnoreAction waits this long for WillEnd before it cancels.
DROP_GRACE_MS = 500
RESULTS = {Qt.CopyAction: "copy", Qt.MoveAction: "move", Qt.IgnoreAction: "ignore"}


class Source(qt_loop.Window, broker_protocol.Origin):
    def __init__(self, arguments):
        super().__init__(arguments)
        self.arguments = arguments
        self.items, self.payloads = broker_protocol.read_items(json.loads(arguments.items))
        self.bus = broker_protocol.connect(arguments.bus)
        self.manager = dbus.Interface(self.bus.get_object(BUS, MANAGER), MANAGER_IFACE)
        self.provider = Provider(self.bus, PROVIDER_PATH, self.payloads)
        self.session = None
        self.ended = self.will_end = False
        self.press = None
        self.bus.add_signal_receiver(self.on_session_signal, dbus_interface=SESSION_IFACE,
                                     path_keyword="path", member_keyword="member")
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Drag me"))
        self.show()

    def mousePressEvent(self, event):
        if event.button() == Qt.LeftButton:
            self.press = event.pos()

    def mouseMoveEvent(self, event):
        if self.press is None or not event.buttons() & Qt.LeftButton:
            return
        if (event.pos() - self.press).manhattanLength() < QApplication.startDragDistance():
            return
        self.press = None
        self.drag()

    def drag(self):
        options = dbus.Dictionary({"AllowsMove": dbus.Boolean(self.arguments.allow_move)}, signature="sv")
        self.ended = self.will_end = False
        try:
            self.session, token = self.manager.BeginSession(self.items, options, dbus.ObjectPath(PROVIDER_PATH))
        except dbus.DBusException as error:
            self.session = None
            say("ERROR", error.get_dbus_name(), error.get_dbus_message())
            return
        self.provider.began(self.session)
        say("BEGAN", self.session)
        say("TOKEN", token)
        mime = QMimeData()
        mime.setData(TOKEN_TYPE, QByteArray(str(token).encode("ascii")))
        drag = QDrag(self)
        drag.setMimeData(mime)
        actions = Qt.CopyAction | (Qt.MoveAction if self.arguments.allow_move else Qt.IgnoreAction)
        # A nested event loop: the bus is dispatched inside it.
        result = drag.exec_(actions, Qt.CopyAction)
        say("EXEC", RESULTS.get(result, str(int(result))))
        session = self.session
        if result == Qt.IgnoreAction:
            # No target accepted the last status: no drop was sent, so no PerformDrop can follow.
            self.cancel()
        else:
            # A target accepted; the broker, not the toolkit, says whether a drop happened (a
            # target that ignores the protocol and accepts anything also makes exec say copy).
            QTimer.singleShot(DROP_GRACE_MS, lambda: self.session == session and self.cancel())

def main():
    arguments = broker_protocol.arguments("qt-source", 20, "source")
    qt_loop.run(lambda: Source(arguments))


main()

"""Qt's main loop for the PyQt apps here, with dbus-python dispatched by it: QDrag.exec runs a
nested loop, and the provider's calls must be answered inside it."""
import signal
import sys

from dbus.mainloop.pyqt5 import DBusQtMainLoop
from PyQt5.QtCore import Qt, QTimer
from PyQt5.QtWidgets import QApplication, QWidget

from broker_protocol import say


def run(make_window):
    application = QApplication(sys.argv[:1])
    DBusQtMainLoop(set_as_default=True)
    signal.signal(signal.SIGTERM, lambda *_: application.quit())
    # Python runs signal handlers only between bytecodes: a timer lets it look now and then.
    ticker = QTimer(interval=200)
    ticker.timeout.connect(lambda: None)
    ticker.start()
    window = make_window()
    application.exec_()
    del window


class Window(QWidget):
    """A frameless window that says READY once it has painted, which is when it is on screen."""

    def __init__(self, arguments):
        super().__init__()
        self.shown = False
        self.setWindowTitle(arguments.title)
        self.setWindowFlags(Qt.FramelessWindowHint)
        self.setGeometry(arguments.x, arguments.y, arguments.width, arguments.height)

    def paintEvent(self, event):
        super().paintEvent(event)
        if not self.shown:
            self.shown = True
            say("READY")

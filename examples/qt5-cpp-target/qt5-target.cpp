/* A Qt 5 drop target for dragbroker drags, written from docs/desktop-drag-protocol.md and the
 * interface XML alone, on the proxies qdbusxml2cpp generates from that XML.
 *
 *   qt5-target [--bus ADDRESS] [--title TITLE] [--x X --y Y] --accept TYPE [--accept TYPE ...]
 *
 * TYPE is a MIME type (image/png), a wildcard (image/ followed by a star) or a UTI (public.image). The broker is
 * on ADDRESS, else on $DRAGBROKER_BUS_ADDRESS when set, else on the session bus. Every line on
 * stdout is flushed:
 *
 *   READY                                  the window is shown
 *   PRESENTED PATH                         the session the token stands for
 *   ITEMS ITEM:TYPE,...                    what the app will load, or -
 *   STATUS copy|move|forbidden|cancel      a drop status taken from the broker's answer
 *   EXIT                                   the pointer left and did not come back
 *   DROPPED copy|move                      PerformDrop's answer
 *   LOADED ITEM TYPE NBYTES SHA256         one item's pipe read to its end
 *   LOAD-FINISHED LOAD BYTES ERROR|-       the broker's word on one load
 *   CONCLUDED
 *   REFUSED ERROR MESSAGE                  the broker refused a call; ERROR is its D-Bus name
 *
 * Qt takes a drop status only inside dragEnterEvent and dragMoveEvent, so the broker's calls
 * there block (a few milliseconds): with asynchronous calls the answer would show only at the
 * next motion, and a release soon after entering would be lost. The bytes arrive through
 * QSocketNotifier, after dropEvent has returned. */
#include <QApplication>
#include <QCommandLineParser>
#include <QCryptographicHash>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QHash>
#include <QSet>
#include <QLabel>
#include <QMimeData>
#include <QSocketNotifier>
#include <QTimer>
#include <QVBoxLayout>
#include <QWidget>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "manager_proxy.h"
#include "session_proxy.h"

static const char *const BrokerName = "org.dragbroker.Broker1";
static const char *const ManagerPath = "/org/dragbroker/Broker1";
static const char *const TokenType = "application/vnd.dragbroker.token.v1";
/* An Exit waits this long after a leave, and is dropped if a drop or a new enter comes first. */
static const int ExitDelayMs = 200;

static void say(const QString &line) {
    fputs(qPrintable(line + QLatin1Char('\n')), stdout);
    fflush(stdout);
}

static bool isToken(const QByteArray &data) {
    if (data.size() != 64) return false;
    for (char c : data)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    return true;
}

/* One Load: the pipe read as it becomes readable, and the broker's LoadFinished, in either order. */
struct Load {
    uint item = 0;
    QString type;
    int fd = -1;
    QSocketNotifier *notifier = nullptr;
    QCryptographicHash digest{QCryptographicHash::Sha256};
    qulonglong size = 0;
    bool eof = false, finished = false;
};

class Target : public QWidget {
public:
    Target(const QDBusConnection &bus, const QStringList &accepted)
        : bus(bus), accepted(accepted), manager(BrokerName, ManagerPath, bus) {
        exitTimer.setSingleShot(true);
        exitTimer.setInterval(ExitDelayMs);
        QObject::connect(&exitTimer, &QTimer::timeout, this, [this] { exit(); });
        setWindowFlags(Qt::FramelessWindowHint);
        setAcceptDrops(true);
        auto *layout = new QVBoxLayout(this);
        layout->addWidget(new QLabel(QStringLiteral("Drop ") + accepted.join(QStringLiteral(", "))));
    }

protected:
    void paintEvent(QPaintEvent *event) override {
        QWidget::paintEvent(event);
        if (!shown) {
            shown = true;
            say(QStringLiteral("READY"));
        }
    }

    void dragEnterEvent(QDragEnterEvent *event) override {
        if (!event->mimeData()->hasFormat(TokenType)) return event->ignore();
        exitTimer.stop();
        // Once per enter: on X11 every QMimeData::data is a round trip to the source.
        const QByteArray data = event->mimeData()->data(TokenType);
        if (!isToken(data)) {
            say(QStringLiteral("ERROR invalid-token %1 bytes that are not a session token").arg(data.size()));
            return event->ignore();
        }
        if (data != token && !present(data)) return event->ignore();
        entered = false;
        propose(proposalFor(event));
        apply(event);
    }

    void dragMoveEvent(QDragMoveEvent *event) override {
        if (!session) return event->ignore();
        propose(proposalFor(event));
        apply(event);
    }

    void dragLeaveEvent(QDragLeaveEvent *) override {
        if (session && entered) exitTimer.start();
    }

    /* Qt has no deferred finish: the drop is accepted, with the broker's operation, or ignored
     * before this returns; the bytes are read afterwards. */
    void dropEvent(QDropEvent *event) override {
        exitTimer.stop();
        if (!session || !entered) {
            say(QStringLiteral("REFUSED - the drop came before the broker answered"));
            return event->ignore();
        }
        QDBusPendingReply<QString> dropped = session->PerformDrop();
        dropped.waitForFinished();
        if (dropped.isError()) {
            refused(dropped.error());
            return event->ignore();
        }
        const QString operation = dropped.value();
        say(QStringLiteral("DROPPED ") + operation);
        event->setDropAction(operation == QLatin1String("move") ? Qt::MoveAction : Qt::CopyAction);
        event->accept();
        concluding = session;
        for (const auto &want : wanted) {
            QDBusPendingReply<QDBusUnixFileDescriptor, uint, QString> reply = session->Load(want.first, want.second);
            reply.waitForFinished();
            if (reply.isError()) {
                failed(reply.error());
                continue;
            }
            startLoad(reply.argumentAt<1>(), want.first, want.second, reply.argumentAt<0>());
        }
        forgetDrag();
        concludeWhenDone();
    }

private:
    QDBusConnection bus;
    QStringList accepted;
    DragbrokerManager manager;
    QTimer exitTimer;
    bool shown = false;

    QByteArray token;
    DragbrokerSession *session = nullptr;
    QList<QPair<uint, QString>> wanted;
    bool entered = false;
    QString proposal, answer = QStringLiteral("cancel");

    DragbrokerSession *concluding = nullptr;
    QHash<uint, Load *> loads;

    static QString proposalFor(QDropEvent *event) {
        return event->proposedAction() == Qt::MoveAction ? QStringLiteral("move") : QStringLiteral("copy");
    }

    static void refused(const QDBusError &error) {
        say(QStringLiteral("REFUSED %1 %2").arg(error.name(), error.message()));
    }

    static void failed(const QDBusError &error) {
        say(QStringLiteral("ERROR %1 %2").arg(error.name(), error.message()));
    }

    void apply(QDragMoveEvent *event) {
        if (answer == QLatin1String("copy") || answer == QLatin1String("move")) {
            event->setDropAction(answer == QLatin1String("move") ? Qt::MoveAction : Qt::CopyAction);
            event->accept();
        } else {
            event->ignore();
        }
    }

    void forgetDrag() {
        token.clear();
        session = nullptr;  // a child of this widget, deleted once the session ends
        wanted.clear();
        entered = false;
        proposal.clear();
        answer = QStringLiteral("cancel");
    }

    bool present(const QByteArray &newToken) {
        token = newToken;
        QDBusPendingReply<QDBusObjectPath> path = manager.PresentToken(QString::fromLatin1(newToken));
        path.waitForFinished();
        if (path.isError()) {
            refused(path.error());
            session = nullptr;
            return false;
        }
        session = new DragbrokerSession(BrokerName, path.value().path(), bus, this);
        say(QStringLiteral("PRESENTED ") + path.value().path());
        auto *watched = session;
        QObject::connect(session, &DragbrokerSession::LoadFinished, this,
                         [this, watched](uint load, qulonglong bytes, const QString &error, const QString &) {
                             say(QStringLiteral("LOAD-FINISHED %1 %2 %3").arg(load).arg(bytes).arg(error.isEmpty() ? QStringLiteral("-") : error));
                             if (watched == concluding && loads.contains(load)) {
                                 loads[load]->finished = true;
                                 concludeWhenDone();
                             }
                         });
        QObject::connect(session, &DragbrokerSession::Ended, this,
                         [this, watched](const QString &operation, const QString &error, const QString &) {
                             say(QStringLiteral("ENDED %1 %2").arg(operation, error.isEmpty() ? QStringLiteral("-") : error));
                             if (watched == session) {
                                 exitTimer.stop();
                                 forgetDrag();
                             }
                             if (watched != concluding) watched->deleteLater();
                         });
        wanted.clear();
        QSet<uint> taken;
        for (const QString &type : accepted) {
            QDBusPendingReply<QList<uint>> items = session->ConformingItems(type);
            items.waitForFinished();
            if (items.isError()) {
                refused(items.error());
                continue;
            }
            for (uint item : items.value()) {
                if (taken.contains(item)) continue;
                taken.insert(item);
                wanted.append({item, type});  // Load takes the same type: the broker serves the closest listed one
            }
        }
        QStringList shown;
        for (const auto &want : wanted) shown << QStringLiteral("%1:%2").arg(want.first).arg(want.second);
        say(QStringLiteral("ITEMS ") + (shown.isEmpty() ? QStringLiteral("-") : shown.join(QLatin1Char(','))));
        return true;
    }

    void propose(QString next) {
        // Nothing to take proposes cancel; the broker answers forbidden when policy is why.
        if (wanted.isEmpty()) next = QStringLiteral("cancel");
        if (entered && next == proposal) return;
        QDBusPendingReply<QString> reply = entered ? session->Update(next) : session->Enter(next);
        reply.waitForFinished();
        if (reply.isError()) {
            refused(reply.error());
            answer = QStringLiteral("cancel");
        } else {
            answer = reply.value();
        }
        entered = true;
        proposal = next;
        say(QStringLiteral("STATUS ") + answer);
    }

    void exit() {
        if (!session || !entered) return;
        entered = false;
        proposal.clear();
        QDBusPendingReply<> reply = session->Exit();
        reply.waitForFinished();
        // After the source cancelled, NotFound: nothing left to withdraw.
        if (reply.isError())
            failed(reply.error());
        else
            say(QStringLiteral("EXIT"));
    }

    void startLoad(uint id, uint item, const QString &type, const QDBusUnixFileDescriptor &descriptor) {
        auto *load = new Load;
        load->item = item;
        load->type = type;
        load->fd = fcntl(descriptor.fileDescriptor(), F_DUPFD_CLOEXEC, 0);
        fcntl(load->fd, F_SETFL, fcntl(load->fd, F_GETFL) | O_NONBLOCK);
        load->notifier = new QSocketNotifier(load->fd, QSocketNotifier::Read, this);
        QObject::connect(load->notifier, &QSocketNotifier::activated, this, [this, load] { readable(load); });
        loads.insert(id, load);
    }

    void readable(Load *load) {
        char buffer[65536];
        for (;;) {
            ssize_t n = ::read(load->fd, buffer, sizeof buffer);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) return;  // EAGAIN: more later
            if (n == 0) break;
            load->digest.addData(buffer, int(n));
            load->size += qulonglong(n);
        }
        load->notifier->setEnabled(false);
        ::close(load->fd);
        load->eof = true;
        say(QStringLiteral("LOADED %1 %2 %3 %4").arg(load->item).arg(load->type).arg(load->size)
                .arg(QString::fromLatin1(load->digest.result().toHex())));
        concludeWhenDone();
    }

    /* Conclude once every load reached end of file and had its LoadFinished: only LoadFinished
     * tells a failure from an empty representation. */
    void concludeWhenDone() {
        if (!concluding) return;
        for (Load *load : loads)
            if (!load->eof || !load->finished) return;
        DragbrokerSession *done = concluding;
        concluding = nullptr;
        for (Load *load : loads) {
            load->notifier->deleteLater();
            delete load;
        }
        loads.clear();
        QDBusPendingReply<> reply = done->Conclude();
        reply.waitForFinished();
        if (reply.isError())
            failed(reply.error());
        else
            say(QStringLiteral("CONCLUDED"));
    }
};

int main(int argc, char **argv) {
    QApplication application(argc, argv);
    QCommandLineParser parser;
    parser.addOptions({{"bus", "The broker's bus address.", "address"},
                       {"title", "The window title.", "title", "cpp-target"},
                       {"accept", "A MIME type, wildcard or UTI this app takes.", "type"},
                       {"x", "Left edge.", "x", "300"},
                       {"y", "Top edge.", "y", "50"}});
    parser.process(application);
    if (parser.values("accept").isEmpty()) {
        fputs("qt5-target: give at least one --accept TYPE\n", stderr);
        return 2;
    }
    registerDragbrokerTypes();
    QString address = parser.value("bus");
    if (address.isEmpty()) address = qEnvironmentVariable("DRAGBROKER_BUS_ADDRESS");
    QDBusConnection bus = address.isEmpty() ? QDBusConnection::sessionBus()
                                            : QDBusConnection::connectToBus(address, QStringLiteral("dragbroker"));
    if (!bus.isConnected()) {
        fprintf(stderr, "qt5-target: cannot reach the bus: %s\n", qPrintable(bus.lastError().message()));
        return 1;
    }
    Target target(bus, parser.values("accept"));
    target.setWindowTitle(parser.value("title"));
    target.setGeometry(parser.value("x").toInt(), parser.value("y").toInt(), 200, 200);
    target.show();
    return application.exec();
}

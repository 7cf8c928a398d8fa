/* The C++ types that the interface XML's org.qtproject.QtDBus.QtTypeName annotations name,
 * with their D-Bus marshalling. qdbusxml2cpp's proxies include this file (its -i option), so
 * every struct signature of the Manager and Session interfaces has a type here, whether or not
 * this app calls the member that carries it. */
#pragma once

#include <QDBusArgument>
#include <QDBusMetaType>
#include <QDBusObjectPath>
#include <QList>
#include <QString>
#include <QStringList>

/* (sss): a representation a source offers: type, visibility, kind. */
struct DragRepresentation {
    QString type, visibility, kind;
};
/* (sdda(sss)): an item a source offers. */
struct DragItem {
    QString suggestedName;
    double preferredWidth = 0, preferredHeight = 0;
    QList<DragRepresentation> representations;
};
typedef QList<DragItem> DragItemList;

/* (sddas): an item as one destination sees it. */
struct VisibleItem {
    QString suggestedName;
    double preferredWidth = 0, preferredHeight = 0;
    QStringList typeIdentifiers;
};
typedef QList<VisibleItem> VisibleItemList;

/* (tt): bytes moved, bytes expected. */
struct SessionProgress {
    qulonglong bytes = 0, expected = 0;
};

/* (sossut): ListSessions's row. */
struct SessionSummary {
    QString id;
    QDBusObjectPath path;
    QString sourceApp, state;
    uint itemCount = 0;
    qulonglong began = 0;
};
typedef QList<SessionSummary> SessionSummaryList;

/* (usstt): a load in DescribeSession. */
struct LoadSummary {
    uint id = 0;
    QString type, outcome;
    qulonglong bytes = 0, expected = 0;
};
/* (ssssssba(sdda(sss))a(usstt)): DescribeSession's answer. */
struct SessionDetails {
    QString id, sourceApp, state, operation, destinationApp, current;
    bool restricted = false;
    DragItemList items;
    QList<LoadSummary> loads;
};

/* (uuuu) and a(suuut): GetUsage's answer. */
struct UsageTotals {
    uint sessions = 0, loads = 0, threadsBusy = 0, threadsTotal = 0;
};
struct UsageBucket {
    QString name;
    uint sessions = 0, loads = 0, threadsBusy = 0;
    qulonglong refusals = 0;
};
typedef QList<UsageBucket> UsageBucketList;

#define DRAGBROKER_STREAM(Type, ...)                                                        \
    inline QDBusArgument &operator<<(QDBusArgument &a, const Type &v) {                      \
        a.beginStructure(); a << __VA_ARGS__; a.endStructure(); return a;                    \
    }
#define DRAGBROKER_UNSTREAM(Type, ...)                                                      \
    inline const QDBusArgument &operator>>(const QDBusArgument &a, Type &v) {                \
        a.beginStructure(); a >> __VA_ARGS__; a.endStructure(); return a;                    \
    }

DRAGBROKER_STREAM(DragRepresentation, v.type << v.visibility << v.kind)
DRAGBROKER_UNSTREAM(DragRepresentation, v.type >> v.visibility >> v.kind)
DRAGBROKER_STREAM(DragItem, v.suggestedName << v.preferredWidth << v.preferredHeight << v.representations)
DRAGBROKER_UNSTREAM(DragItem, v.suggestedName >> v.preferredWidth >> v.preferredHeight >> v.representations)
DRAGBROKER_STREAM(VisibleItem, v.suggestedName << v.preferredWidth << v.preferredHeight << v.typeIdentifiers)
DRAGBROKER_UNSTREAM(VisibleItem, v.suggestedName >> v.preferredWidth >> v.preferredHeight >> v.typeIdentifiers)
DRAGBROKER_STREAM(SessionProgress, v.bytes << v.expected)
DRAGBROKER_UNSTREAM(SessionProgress, v.bytes >> v.expected)
DRAGBROKER_STREAM(SessionSummary, v.id << v.path << v.sourceApp << v.state << v.itemCount << v.began)
DRAGBROKER_UNSTREAM(SessionSummary, v.id >> v.path >> v.sourceApp >> v.state >> v.itemCount >> v.began)
DRAGBROKER_STREAM(LoadSummary, v.id << v.type << v.outcome << v.bytes << v.expected)
DRAGBROKER_UNSTREAM(LoadSummary, v.id >> v.type >> v.outcome >> v.bytes >> v.expected)
DRAGBROKER_STREAM(SessionDetails, v.id << v.sourceApp << v.state << v.operation << v.destinationApp << v.current
                  << v.restricted << v.items << v.loads)
DRAGBROKER_UNSTREAM(SessionDetails, v.id >> v.sourceApp >> v.state >> v.operation >> v.destinationApp >> v.current
                    >> v.restricted >> v.items >> v.loads)
DRAGBROKER_STREAM(UsageTotals, v.sessions << v.loads << v.threadsBusy << v.threadsTotal)
DRAGBROKER_UNSTREAM(UsageTotals, v.sessions >> v.loads >> v.threadsBusy >> v.threadsTotal)
DRAGBROKER_STREAM(UsageBucket, v.name << v.sessions << v.loads << v.threadsBusy << v.refusals)
DRAGBROKER_UNSTREAM(UsageBucket, v.name >> v.sessions >> v.loads >> v.threadsBusy >> v.refusals)

Q_DECLARE_METATYPE(DragRepresentation)
Q_DECLARE_METATYPE(DragItem)
Q_DECLARE_METATYPE(VisibleItem)
Q_DECLARE_METATYPE(SessionProgress)
Q_DECLARE_METATYPE(SessionSummary)
Q_DECLARE_METATYPE(LoadSummary)
Q_DECLARE_METATYPE(SessionDetails)
Q_DECLARE_METATYPE(UsageTotals)
Q_DECLARE_METATYPE(UsageBucket)

/* Call once before the first bus call. */
inline void registerDragbrokerTypes() {
    qDBusRegisterMetaType<DragRepresentation>();
    qDBusRegisterMetaType<DragItem>();
    qDBusRegisterMetaType<DragItemList>();
    qDBusRegisterMetaType<VisibleItem>();
    qDBusRegisterMetaType<VisibleItemList>();
    qDBusRegisterMetaType<SessionProgress>();
    qDBusRegisterMetaType<SessionSummary>();
    qDBusRegisterMetaType<SessionSummaryList>();
    qDBusRegisterMetaType<LoadSummary>();
    qDBusRegisterMetaType<SessionDetails>();
    qDBusRegisterMetaType<UsageTotals>();
    qDBusRegisterMetaType<UsageBucket>();
    qDBusRegisterMetaType<UsageBucketList>();
    qDBusRegisterMetaType<QList<uint>>();
}

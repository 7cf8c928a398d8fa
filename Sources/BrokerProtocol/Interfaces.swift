import BusKit

/// The broker's interfaces, each declared once: a table per interface, from which the sd-bus
/// vtable, the published XML in `Interfaces/` (`make interfaces` writes it, and a test checks
/// it) and the client's calls derive. A new member is a case and its row here, its handler or
/// getter in the face, and its line in the README.
public enum BrokerInterfaces {
    public static let manager = InterfaceDescription(ManagerMember.self)
    public static let session = InterfaceDescription(SessionMember.self)
    public static let provider = InterfaceDescription(ProviderMember.self)

    /// Each interface's published XML, by interface name: the files in `Interfaces/`.
    public static let publishedXML: [(name: String, xml: String)] = [
        (ManagerMember.interfaceName, ManagerMember.introspectionXML),
        (SessionMember.interfaceName, SessionMember.introspectionXML),
        (ProviderMember.interfaceName, ProviderMember.introspectionXML),
    ]

    /// Every error name the API uses, in the fixed order bindings may number them by.
    static let errorsAnnotation = [InterfaceTableAnnotation(
        "org.dragbroker.Broker1.Errors", BrokerErrorCode.allCases.map(\.busName).joined(separator: " "))]
}

private typealias A = InterfaceDescription.Argument

public enum ManagerMember: String, InterfaceTable {
    case beginSession = "BeginSession"
    case presentToken = "PresentToken"
    case listSessions = "ListSessions"
    case cancelLoad = "CancelLoad"
    case describeSession = "DescribeSession"
    case cancelSession = "CancelSession"
    case monitor = "Monitor"
    case whoAmI = "WhoAmI"
    case getPolicy = "GetPolicy"
    case reloadPolicy = "ReloadPolicy"
    case getUsage = "GetUsage"
    case copy = "Copy"
    case version = "Version"
    case sessionCount = "SessionCount"
    case monitorEvent = "MonitorEvent"

    public static let interfaceName = BrokerNames.managerInterface
    public static let annotations = BrokerInterfaces.errorsAnnotation
    public static let documentation = """
      org.dragbroker.Broker1.Manager, at /org/dragbroker/Broker1 on the bus name org.dragbroker.Broker1.
      The object also serves org.freedesktop.DBus.ObjectManager: live sessions are its children.
      Errors: the annotation org.dragbroker.Broker1.Errors on each interface lists every error name
      the API uses, separated by single spaces, in a fixed order that only ever grows at the end, so a
      binding may number them in that order (examples/c-client/dragbroker-errors.c does, for GLib).
      The org.gtk.GDBus.C.* and org.qtproject.QtDBus.* annotations let gdbus-codegen and qdbusxml2cpp
      generate bindings from these files as they are; a running party's introspection omits them.
      A caller's identity comes from its connection's kernel credentials, never from arguments.
    """

    public var row: InterfaceTableRow {
        switch self {
        case .beginSession:
            .method(in: [A("items", "a" + ItemDescriptor.signature), A("options", "a{sv}"), A("provider", "o")], out: [A("session", "o"), A("token", "s")], annotations: [.qtType(in: 0, "DragItemList"), .qtType(in: 1, "QVariantMap")], doc: """
                BeginSession: a source begins a drag. items: (suggested name, preferred width, preferred height,
                representations (type identifier: a MIME type or a known UTI; visibility "app"|"team"|"all"),
                best first; kind "data" (streamed through a pipe) or "file" (a read-only file or sealed memfd
                handed over as is)). options: RestrictedToApp (b), AllowsMove (b); any other key is refused.
                provider: the object path on the caller's own connection that serves org.dragbroker.Provider1.
                Returns the session's path and its secret token (hex).
                """)
        case .presentToken:
            .method(in: [A("token", "s")], out: [A("session", "o")], doc: """
                PresentToken: a destination presents a drag's or a pasteboard entry's token and joins the session
                as a destination; presenting it again changes nothing. A restricted session does not exist for
                other apps: NotFound, as for an unknown token.
                """)
        case .listSessions:
            .method(out: [A("sessions", "a" + SessionSummary.signature)], annotations: [.qtType(out: 0, "SessionSummaryList")], doc: """
                ListSessions: (id, path, source app, state, item count, created at in µs since the epoch) of the
                sessions the caller may inspect: its own app's, and for an administrator (root or the daemon's
                user, not sandboxed) every session not restricted to another app. ListSessions, SessionCount,
                DescribeSession, Monitor and the manager's children in introspection and ObjectManager
                all follow this one rule.
                """)
        case .cancelLoad:
            .method(in: [A("session", "s"), A("load", "u")], doc: """
                CancelLoad: an administrator (root or the daemon's user, not sandboxed) cancels a load; both
                ends hear org.dragbroker.Broker1.Error.Cancelled.
                """)
        case .describeSession:
            .method(in: [A("session", "s")], out: [A("details", SessionDetails.signature)], annotations: [.qtType(out: 0, "SessionDetails")], doc: """
                DescribeSession: the full view: id, state, operation, source app and team, destination app,
                restricted, items (every representation, app- and team-only included), loads in flight (id,
                type, destination app, bytes, expected). Only for sessions ListSessions shows the caller;
                any other is NotFound, as one that never existed.
                """)
        case .cancelSession:
            .method(in: [A("session", "s")], doc: "CancelSession: an administrator ends a session ListSessions shows it; every party hears Cancelled.")
        case .monitor:
            .method(doc: """
                Monitor: subscribe to MonitorEvent for every session the caller may inspect (as ListSessions
                decides), until it disconnects. Not from a sandbox; at most 16 monitors.
                """)
        case .whoAmI:
            .method(out: [A("identity", "a{sv}")], annotations: [.qtType(out: 0, "QVariantMap")], doc: """
                WhoAmI: how the broker identifies the caller: AppID, Team, Managed, Source
                (flatpak|snap|systemd-unit|registry|executable), Sandboxed, Executable, PID, UID.
                """)
        case .getPolicy:
            .method(out: [A("policy", "s")], doc: "GetPolicy: the effective administrator policy, each entry annotated with its file and line.")
        case .reloadPolicy:
            .method(doc: """
                ReloadPolicy: re-read the policy files; root or the daemon's own user, not sandboxed. A bad file
                is refused with InvalidArgument naming file:line, and the current policy stays.
                """)
        case .getUsage:
            .method(out: [A("totals", UsageReport.totalsSignature), A("buckets", "a" + UsageReport.bucketSignature)], annotations: [.qtType(out: 0, "UsageTotals"), .qtType(out: 1, "UsageBucketList")], doc: """
                GetUsage: what the daemon holds now, for root or the daemon's own user, not sandboxed. totals: live
                sessions, loads in flight, descriptor threads made, descriptor threads busy (each in a call on a
                client's descriptor that its file system has not answered). buckets: per app, and per user for the
                unsandboxed apps of one user together ("the unsandboxed apps of uid N"): live sessions begun, loads
                in flight (as destination or source), descriptor threads busy, microseconds the oldest has waited.
                """)
        case .copy:
            .method(in: [A("items", "a" + ItemDescriptor.signature), A("options", "a{sv}"), A("provider", "o")], out: [A("entry", "o"), A("token", "s")], annotations: [.qtType(in: 0, "DragItemList"), .qtType(in: 1, "QVariantMap")], doc: """
                Copy: a source puts items on the pasteboard, as BeginSession puts them in a drag: the same items,
                visibility and provider, and nothing is asked of the provider until a paste loads. options:
                RestrictedToApp (b): only the source's app may paste it; ExpirationSec (u): seconds until the
                entry expires (absent: the policy's ExpirationSec=; more than its MaxExpirationSec= is cut to
                that); any other key is refused. Returns the entry's path (a session in state "copied") and its
                secret token (hex), which the source puts on the window system's clipboard. The entry lives until
                the source calls Cancel on it (its toolkit lost the clipboard), it expires (Ended with Timeout),
                or the source leaves the bus.
                """)
        case .version:
            .property("s", .constant)
        case .sessionCount:
            .property("u", .emitsInvalidation, doc: """
                SessionCount: how many sessions ListSessions shows the caller, so it differs per caller;
                a change is announced as invalidated, never with a value.
                """)
        case .monitorEvent:
            .signal([A("session", "s"), A("event", "s"), A("detail", "s"), A("bytes", "t"), A("expected", "t")], doc: """
                MonitorEvent: unicast to monitors. event: begin, enter, update, exit, drop, load, progress,
                loaded, end, and for the clipboard copy (an entry was put on the pasteboard) and paste (a paste
                of one began); bytes and expected for progress and loaded.
                """)
        }
    }
}

public enum SessionMember: String, InterfaceTable {
    case getItems = "GetItems"
    case conformingItems = "ConformingItems"
    case addItems = "AddItems"
    case enter = "Enter"
    case update = "Update"
    case exit = "Exit"
    case performDrop = "PerformDrop"
    case load = "Load"
    case cancelLoad = "CancelLoad"
    case setExpectedSize = "SetExpectedSize"
    case conclude = "Conclude"
    case cancel = "Cancel"
    case paste = "Paste"
    case clearOffers = "ClearOffers"
    case id = "Id"
    case sourceApp = "SourceApp"
    case state = "State"
    case itemCount = "ItemCount"
    case operation = "Operation"
    case progress = "Progress"
    case willEnd = "WillEnd"
    case ended = "Ended"
    case transferFinished = "TransferFinished"
    case loadProgress = "LoadProgress"
    case loadFinished = "LoadFinished"
    case pasted = "Pasted"

    public static let interfaceName = BrokerNames.sessionInterface
    public static let annotations = BrokerInterfaces.errorsAnnotation
    public static let documentation = """
      org.dragbroker.Broker1.Session, at /org/dragbroker/Broker1/session/<id>, one object per live session.
      Only its parties, the source and destinations that presented the token, may call it or use its
      org.freedesktop.DBus.Properties (Get, GetAll, Set); anyone else gets
      org.dragbroker.Broker1.Error.AccessDenied, the same for every method and whatever the session's
      state. To a caller that is no party and may not inspect the session (see ListSessions) it does
      not exist: NotFound, as for a session that never existed. Its signals, PropertiesChanged and
      ObjectManager's InterfacesAdded/InterfacesRemoved included, are unicast to the session's parties.
      Item indices are as the caller sees them: a representation the caller may not see, or that the
      administrator's flow rules deny it, does not exist for it, and neither does an item with none left.
      The annotations org.dragbroker.Broker1.Errors, org.gtk.GDBus.C.* and org.qtproject.QtDBus.*
      are explained in org.dragbroker.Broker1.Manager.xml.
    """

    public var row: InterfaceTableRow {
        switch self {
        case .getItems:
            .method(out: [A("items", "a" + VisibleItem.signature)], annotations: [.qtType(out: 0, "VisibleItemList")], doc: "GetItems: (suggested name, preferred width, preferred height, type identifiers visible to the caller). Never data.")
        case .conformingItems:
            .method(in: [A("type", "s")], out: [A("items", "au")], annotations: [.qtType(out: 0, "QList<uint>")], doc: """
                ConformingItems: indices of items with a visible representation that matches type: a MIME type
                (text/plain matches text/plain;charset=utf-8 and text/x-python), a wildcard (image/*) or a UTI
                (public.image). Load of the same type serves such an item.
                """)
        case .addItems:
            .method(in: [A("items", "a" + ItemDescriptor.signature)], annotations: [.qtType(in: 0, "DragItemList")], doc: """
                AddItems: flocking, as on iOS, happens in the source's app: the source, or a connection of
                the source's app that presented the token; never another app; only while dragging.
                """)
        case .enter:
            .method(in: [A("proposal", "s")], out: [A("operation", "s")], doc: """
                Enter/Update: proposal and answer are "cancel", "forbidden", "copy" or "move". A move is
                answered as copy unless the destination is the source's app and the source allows moves.
                "cancel", and a copy or move of nothing, are answered "forbidden" when the administrator's
                flow rules refused the caller something it could otherwise see, else "cancel". Update
                needs the caller's own Enter, not followed by its own Exit.
                """)
        case .update:
            .method(in: [A("proposal", "s")], out: [A("operation", "s")])
        case .exit:
            .method()
        case .performDrop:
            .method(out: [A("operation", "s")], doc: """
                PerformDrop: needs the caller's own Enter, not followed by its own Exit, with a proposal
                answered copy or move (another destination's calls change nothing for it); the caller
                alone may load from now on.
                """)
        case .load:
            .method(in: [A("item", "u"), A("type", "s")], out: [A("data", "h"), A("load", "u"), A("kind", "s")], annotations: [.unixFD], doc: """
                Load: type is matched as in ConformingItems; the item's closest listed type is served (the
                exact type, then the same type with more parameters, then a subtype; the first listed among
                equally close ones). Answers a descriptor, the load's ID and its kind. For "data", the read end of a pipe: read to
                end of file, then LoadFinished(load, bytes, error, message) says whether every byte arrived.
                For "file", the source's read-only file or sealed memfd itself, or AccessDenied naming the
                rule when the file is larger than a LargerThan= flow rule allows.
                """)
        case .cancelLoad:
            .method(in: [A("load", "u")], doc: """
                CancelLoad: the load's destination or the session's source stops a load; the other end
                hears org.dragbroker.Broker1.Error.Cancelled in LoadFinished.
                """)
        case .setExpectedSize:
            .method(in: [A("load", "u"), A("size", "t")], doc: "SetExpectedSize: the source announces a data load's size, for progress.")
        case .conclude:
            .method(doc: "Conclude: the drop destination is done; loads in flight finish, no new ones start.")
        case .cancel:
            .method(doc: "Cancel: the source cancels the drag, or withdraws its pasteboard entry.")
        case .paste:
            .method(out: [A("paste", "o")], doc: """
                Paste: the user's explicit act on a pasteboard entry (state "copied"), as PerformDrop is on a drag:
                a party that presented the entry's token gets a new session of its own, in state "pasted", with
                the items it may see, in which it alone may Load, CancelLoad and Conclude as after a drop. Each
                Paste is its own session and its own record; one entry may be pasted many times. A paste of
                nothing the caller may see is NotFound, and AccessDenied when the administrator's flow rules
                refused it everything it could otherwise see.
                """)
        case .clearOffers:
            .method(out: [A("types", "as")], doc: """
                ClearOffers: for the source of a pasteboard entry, the types of its first item that it may also
                offer on the window system's clipboard in the clear, for apps that do not speak the protocol:
                those with visibility "all" that the administrator's flow rules let reach an unknown unmanaged
                app through the paste channel, as listed; none when the policy says ClearOffers=no. A clipboard
                carries one item: later items go only through the broker. Nothing offered in the clear is
                recorded: the broker never sees those pastes.
                """)
        case .id:
            .property("s", .constant)
        case .sourceApp:
            .property("s", .constant)
        case .state:
            .property("s", .emitsChange)
        case .itemCount:
            .property("u", .emitsChange)
        case .operation:
            .property("s", .emitsChange)
        case .progress:
            .property("(tt)", .emitsChange, annotations: [.qtType("SessionProgress")])
        case .willEnd:
            .signal([A("operation", "s")], doc: "To the source, at the drop.")
        case .ended:
            .signal([A("operation", "s"), A("error", "s"), A("message", "s")], doc: """
                To every party, once; error is empty when the destination concluded, else an error name
                and message: Cancelled, Disconnected, or Timeout when the drag was not dropped within
                DragTimeoutSec= or a drop was not concluded within ConcludeTimeoutSec= of its last load.
                Loads in flight at Conclude go on: Ended can come before TransferFinished.
                """)
        case .transferFinished:
            .signal(doc: "To the source, when the session was concluded and every load is done, after Ended.")
        case .loadProgress:
            .signal([A("load", "u"), A("bytes", "t"), A("expected", "t")], doc: "To both ends of a load, at most every 50 ms while bytes move, the first no sooner than 50 ms after the load began (a load that ends sooner has only LoadFinished), and at once when the source announces the size; expected is 0 when unknown.")
        case .loadFinished:
            .signal([A("load", "u"), A("bytes", "t"), A("error", "s"), A("message", "s")], doc: """
                To both ends of a load; error is empty when every byte was delivered, else why it ended
                (Cancelled, Timeout with which deadline fired, Disconnected, ProviderFailed, AccessDenied).
                """)
        case .pasted:
            .signal([A("paste", "o"), A("app", "s")], doc: """
                To the source of a pasteboard entry, when an app pastes it: the paste's path and the app's ID. It
                comes before any Provide for that paste, whose session argument is the paste's path.
                """)
        }
    }
}

public enum ProviderMember: String, InterfaceTable {
    case provide = "Provide"
    case provideFile = "ProvideFile"

    public static let interfaceName = BrokerNames.providerInterface
    public static let annotations = BrokerInterfaces.errorsAnnotation
    public static let documentation = """
      org.dragbroker.Provider1: exported by a source on its own connection, at the path it gave to
      BeginSession or Copy. dragbrokerd calls it only after a drop or a paste, once per load. But any
      peer on the bus can call an exported object: serve a call only when its sender is the unique name
      that owns org.dragbroker.Broker1 and its session is one this app began, or a paste of its entry
      that the Pasted signal announced, and answer anything else with
      org.dragbroker.Broker1.Error.AccessDenied.
      The annotations org.dragbroker.Broker1.Errors, org.gtk.GDBus.C.* and org.qtproject.QtDBus.*
      are explained in org.dragbroker.Broker1.Manager.xml.
    """

    public var row: InterfaceTableRow {
        switch self {
        case .provide:
            .method(in: [A("session", "o"), A("item", "u"), A("type", "s"), A("load", "u"), A("data", "h")], annotations: [.unixFD], doc: """
                Provide: write the representation's bytes into data, then reply (the reply may also come
                later, from another thread). The reply ends the data: the destination gets what the pipe
                holds then, even while a copy of data is still open (as GDBus's fd list and Qt's delayed
                replies keep one), so write nothing after replying. Closing data without replying does not
                end the load. An error reply fails the load with
                org.dragbroker.Broker1.Error.ProviderFailed (Cancelled if its name is
                org.dragbroker.Broker1.Error.Cancelled). type is the representation's type as the session lists
                it (the canonical MIME type BeginSession made of it), whatever the destination asked with.
                data is blocking: a pipe holds about 1 MiB, so an app with a user interface writes larger
                data from a thread, and replies after the last byte. Called only for representations of
                kind "data".
                """)
        case .provideFile:
            .method(in: [A("session", "o"), A("item", "u"), A("type", "s"), A("load", "u")], out: [A("file", "h")], annotations: [.unixFD], doc: """
                ProvideFile: reply with a regular file opened read-only, or a memfd sealed against writing,
                growing and shrinking. Anything else fails the load with ProviderFailed. Called only for
                representations of kind "file".
                """)
        }
    }
}


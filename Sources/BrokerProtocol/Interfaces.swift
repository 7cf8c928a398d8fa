import BusKit

/// The broker's interfaces as member tables. Keep in step with `Interfaces/*.xml`.
public enum BrokerInterfaces {
    typealias A = InterfaceDescription.Argument

    public static let manager = InterfaceDescription(
        name: BrokerNames.managerInterface,
        methods: [
            .init("BeginSession",
                  in: [A("items", "a" + ItemDescriptor.signature), A("options", "a{sv}"), A("provider", "o")],
                  out: [A("session", "o"), A("token", "s")]),
            .init("PresentToken", in: [A("token", "s")], out: [A("session", "o")]),
            .init("ListSessions", out: [A("sessions", "a" + SessionSummary.signature)]),
            .init("CancelLoad", in: [A("session", "s"), A("load", "u")]),
            .init("DescribeSession", in: [A("session", "s")], out: [A("details", SessionDetails.signature)]),
            .init("CancelSession", in: [A("session", "s")]),
            .init("Monitor"),
            .init("WhoAmI", out: [A("identity", "a{sv}")]),
            .init("GetPolicy", out: [A("policy", "s")]),
            .init("ReloadPolicy"),
            .init("GetUsage", out: [A("totals", UsageReport.totalsSignature), A("buckets", "a" + UsageReport.bucketSignature)]),
        ],
        properties: [
            .init("Version", "s", .constant),
            .init("SessionCount", "u", .emitsInvalidation),
        ],
        signals: [
            .init("MonitorEvent", [A("session", "s"), A("event", "s"), A("detail", "s"), A("bytes", "t"), A("expected", "t")]),
        ])

    public static let session = InterfaceDescription(
        name: BrokerNames.sessionInterface,
        methods: [
            .init("GetItems", out: [A("items", "a" + VisibleItem.signature)]),
            .init("ConformingItems", in: [A("type", "s")], out: [A("items", "au")]),
            .init("AddItems", in: [A("items", "a" + ItemDescriptor.signature)]),
            .init("Enter", in: [A("proposal", "s")], out: [A("operation", "s")]),
            .init("Update", in: [A("proposal", "s")], out: [A("operation", "s")]),
            .init("Exit"),
            .init("PerformDrop", out: [A("operation", "s")]),
            .init("Load", in: [A("item", "u"), A("type", "s")], out: [A("data", "h"), A("load", "u"), A("kind", "s")]),
            .init("CancelLoad", in: [A("load", "u")]),
            .init("SetExpectedSize", in: [A("load", "u"), A("size", "t")]),
            .init("Conclude"),
            .init("Cancel"),
        ],
        properties: [
            .init("Id", "s", .constant),
            .init("SourceApp", "s", .constant),
            .init("State", "s", .emitsChange),
            .init("ItemCount", "u", .emitsChange),
            .init("Operation", "s", .emitsChange),
            .init("Progress", "(tt)", .emitsChange),
        ],
        signals: [
            .init("WillEnd", [A("operation", "s")]),
            .init("Ended", [A("operation", "s"), A("error", "s"), A("message", "s")]),
            .init("TransferFinished"),
            .init("LoadProgress", [A("load", "u"), A("bytes", "t"), A("expected", "t")]),
            .init("LoadFinished", [A("load", "u"), A("bytes", "t"), A("error", "s"), A("message", "s")]),
        ])

    public static let provider = InterfaceDescription(
        name: BrokerNames.providerInterface,
        methods: [
            .init("Provide", in: [A("session", "o"), A("item", "u"), A("type", "s"), A("load", "u"), A("data", "h")]),
            .init("ProvideFile", in: [A("session", "o"), A("item", "u"), A("type", "s"), A("load", "u")], out: [A("file", "h")]),
        ])
}

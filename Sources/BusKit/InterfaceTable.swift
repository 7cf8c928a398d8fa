/// One D-Bus interface declared once, after systemd's `SD_BUS_VTABLE` arrays: an enum whose
/// cases are the members, in order, and whose `row` says what each is. The sd-bus vtable
/// (`InterfaceDescription(table)`), the published introspection XML (`introspectionXML`) and the
/// handlers' binding (`InterfaceImplementation(table) { member in … }`, an exhaustive switch, so
/// a member without a handler does not compile) all derive from it.
public protocol InterfaceTable: CaseIterable, Hashable, Sendable, RawRepresentable where RawValue == String {
    static var interfaceName: String { get }
    /// The comment that heads the published XML file.
    static var documentation: String { get }
    /// Annotations on the interface itself, in order.
    static var annotations: [InterfaceTableAnnotation] { get }
    var row: InterfaceTableRow { get }
}

extension InterfaceTable {
    /// The member's D-Bus name.
    public var name: String { rawValue }

    /// The input signature of a method, or the signature of a signal or a property.
    public var signature: String {
        switch row.kind {
        case .method(let input, _): input.map(\.signature).joined()
        case .property(let signature, _): signature
        case .signal(let arguments): arguments.map(\.signature).joined()
        }
    }
}

public struct InterfaceTableAnnotation: Sendable, Equatable {
    public let name: String
    public let value: String
    public init(_ name: String, _ value: String) {
        self.name = name
        self.value = value
    }

    /// qdbusxml2cpp's C++ type for a method's `n`th input or output argument.
    public static func qtType(in n: Int, _ type: String) -> Self { .init("org.qtproject.QtDBus.QtTypeName.In\(n)", type) }
    public static func qtType(out n: Int, _ type: String) -> Self { .init("org.qtproject.QtDBus.QtTypeName.Out\(n)", type) }
    /// qdbusxml2cpp's C++ type for a property.
    public static func qtType(_ type: String) -> Self { .init("org.qtproject.QtDBus.QtTypeName", type) }
    /// gdbus-codegen passes descriptors only where a method says so.
    public static let unixFD = Self("org.gtk.GDBus.C.UnixFD", "true")
}

/// One member: what it is, the annotations binding generators need, and its documentation.
public struct InterfaceTableRow: Sendable {
    public typealias Argument = InterfaceDescription.Argument
    public enum Kind: Sendable {
        case method(in: [Argument], out: [Argument])
        case property(signature: String, change: InterfaceDescription.Property.Change)
        case signal([Argument])
    }

    public let kind: Kind
    public let annotations: [InterfaceTableAnnotation]
    public let doc: String?

    public static func method(in input: [Argument] = [], out output: [Argument] = [],
                              annotations: [InterfaceTableAnnotation] = [], doc: String? = nil) -> Self {
        Self(kind: .method(in: input, out: output), annotations: annotations, doc: doc)
    }

    public static func property(_ signature: String, _ change: InterfaceDescription.Property.Change,
                                annotations: [InterfaceTableAnnotation] = [], doc: String? = nil) -> Self {
        Self(kind: .property(signature: signature, change: change), annotations: annotations, doc: doc)
    }

    public static func signal(_ arguments: [Argument] = [], doc: String? = nil) -> Self {
        Self(kind: .signal(arguments), annotations: [], doc: doc)
    }
}

extension InterfaceDescription {
    /// The member table sd-bus's vtable is built from, in the table's order.
    public init<Table: InterfaceTable>(_ table: Table.Type) {
        var methods: [Method] = [], properties: [Property] = [], signals: [Signal] = []
        for member in Table.allCases {
            switch member.row.kind {
            case .method(let input, let output): methods.append(Method(member.name, in: input, out: output))
            case .property(let signature, let change): properties.append(Property(member.name, signature, change))
            case .signal(let arguments): signals.append(Signal(member.name, arguments))
            }
        }
        self.init(name: Table.interfaceName, methods: methods, properties: properties, signals: signals)
    }
}

/// What serves one member: a method's handler, a property's getter, or nothing for a signal.
public enum MemberBinding {
    case method(InterfaceImplementation.MethodHandler)
    case property(InterfaceImplementation.PropertyGetter)
    case signal
}

extension InterfaceImplementation {
    /// Handlers for every member of `table`, from one exhaustive switch: `bind` must name each.
    public init<Table: InterfaceTable>(_ table: Table.Type, _ bind: (Table) -> MemberBinding) {
        self.init()
        for member in Table.allCases {
            switch (member.row.kind, bind(member)) {
            case (.method, .method(let handler)): methods[member.name] = handler
            case (.property, .property(let getter)): properties[member.name] = getter
            case (.signal, .signal): break
            default: preconditionFailure("\(Table.interfaceName).\(member.name) is bound as another kind of member")
            }
        }
    }
}

extension InterfaceTable {
    /// The published introspection XML: what a running party's introspection says (sd-bus's
    /// form, member for member), plus the annotations binding generators need and each member's
    /// documentation as a comment.
    public static var introspectionXML: String {
        var lines = [
            #"<!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN""#,
            #""https://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">"#,
            "<!--", documentation, "-->", "<node>",
            #" <interface name="\#(interfaceName)">"#,
        ]
        lines += annotations.map { "  " + element($0) }
        for member in allCases {
            let row = member.row
            if let doc = row.doc {
                lines.append("  <!-- " + doc.split(separator: "\n", omittingEmptySubsequences: false).joined(separator: "\n       ") + " -->")
            }
            switch row.kind {
            case .method(let input, let output):
                lines.append(#"  <method name="\#(member.name)">"#)
                lines += input.map { #"   <arg type="\#($0.signature)" name="\#($0.name)" direction="in"/>"# }
                lines += output.map { #"   <arg type="\#($0.signature)" name="\#($0.name)" direction="out"/>"# }
                lines += row.annotations.map { "   " + element($0) }
                lines.append("  </method>")
            case .property(let signature, let change):
                lines.append(#"  <property name="\#(member.name)" type="\#(signature)" access="read">"#)
                switch change {
                case .constant: lines.append("   " + element(.init("org.freedesktop.DBus.Property.EmitsChangedSignal", "const")))
                case .emitsInvalidation: lines.append("   " + element(.init("org.freedesktop.DBus.Property.EmitsChangedSignal", "invalidates")))
                case .emitsChange: break
                }
                lines += row.annotations.map { "   " + element($0) }
                lines.append("  </property>")
            case .signal(let arguments):
                lines.append(#"  <signal name="\#(member.name)">"#)
                lines += arguments.map { #"   <arg type="\#($0.signature)" name="\#($0.name)"/>"# }
                lines.append("  </signal>")
            }
        }
        lines += [" </interface>", "</node>"]
        return lines.joined(separator: "\n") + "\n"
    }

    private static func element(_ annotation: InterfaceTableAnnotation) -> String {
        #"<annotation name="\#(annotation.name)" value="\#(escaped(annotation.value))"/>"#
    }

    private static func escaped(_ value: String) -> String {
        value.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }
}

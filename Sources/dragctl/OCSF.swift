// `dragctl log --format=ocsf`: the transfer log as Open Cybersecurity Schema Framework 1.6.0 events, one per record, so a
// SIEM that reads OCSF takes dragbroker's audit trail without a parser of its own.
import Foundation
import TransferLog

/// Each record of the transfer log as one OCSF 1.6.0 event.
///
/// - A transfer (a load) is a **File Hosting Activity** (class 6006, category 6 Application Activity) with the activity
///   **Copy**: the broker, like a file-sharing service, handed one representation of the source app's data to the
///   destination app, and the source kept its own. The class names the two parties (`src_endpoint`, `dst_endpoint`),
///   the actor and the data (`file`, with its size in bytes), which is all a transfer is. Datastore Activity fits data
///   read from a database, and Application Activity is abstract (it has no class UID).
/// - A session's end is a File Hosting Activity too, whose activity is what the drop did with the items as a whole:
///   **Copy**, **Move** (the source is told to delete its original), or **Other** for a session that moved nothing
///   (`cancel`, `forbidden`). A session still open has not ended and is left out.
/// - A refusal, and a transfer that a policy rule cut short (outcome `denied`), is a decision, not an activity: a
///   **Data Security Finding** (class 2006, category 2 Findings) with the activity Create, the `security_control`
///   profile's action Denied and disposition Blocked, and the rule that decided in `data_security.policy`.
///
/// The source is where the bytes came from and the destination where they went, as flow rules' `From=` and `To=` and
/// the journal name them; the actor is the app that took the data (asked for the load, performed the drop or paste),
/// or, with none, the source; the refused app in a refusal. Fields OCSF has no place for go to `unmapped`.
enum OCSF {
    static let schemaVersion = "1.6.0"

    /// dragctl's own version, which is the broker's: the two ship together.
    static var productVersion: String { Dragctl.configuration.version }

    typealias Event = [String: Any]

    /// Compact, keys sorted, slashes left as they are: one line a SIEM reads as it is.
    static func line(_ event: Event) throws -> String {
        String(decoding: try JSONSerialization.data(withJSONObject: event, options: [.sortedKeys, .withoutEscapingSlashes]),
               as: UTF8.self)
    }

    // MARK: The classes and enums used, with the captions the schema gives them

    enum EventClass: Int {
        case dataSecurityFinding = 2006
        case fileHostingActivity = 6006

        var categoryUID: Int { rawValue / 1000 }
        var name: String { self == .dataSecurityFinding ? "Data Security Finding" : "File Hosting Activity" }
        var categoryName: String { self == .dataSecurityFinding ? "Findings" : "Application Activity" }
    }

    struct Activity {
        let id: Int
        let name: String

        static let create = Activity(id: 1, name: "Create")
        static let copy = Activity(id: 6, name: "Copy")
        static let move = Activity(id: 7, name: "Move")
        static func other(_ name: String) -> Activity { Activity(id: 99, name: name) }
    }

    /// OCSF's severity from syslog's priority: info is Informational, notice Low.
    static func severity(priority: Int) -> (id: Int, name: String) {
        priority >= 6 ? (1, "Informational") : (2, "Low")
    }

    // MARK: Records to events

    static func event(for load: LoadRecord) -> Event {
        let started = milliseconds(load.startedAt), ended = milliseconds(load.endedAt)
        var file = data(load.typeIdentifier)
        file["size"] = load.bytes
        var event: Event = [
            "actor": actor(app: load.destinationApp),
            "src_endpoint": endpoint(app: load.sourceApp),
            "dst_endpoint": endpoint(app: load.destinationApp),
            "file": file,
            "start_time": started,
            "end_time": ended,
            "duration": ended - started,
            "unmapped": unmapped(["channel": load.channel, "source_team": load.sourceTeam,
                                  "destination_team": load.destinationTeam, "load": load.loadID]),
        ]
        let uid = "load-" + (load.id.map(String.init) ?? "\(load.sessionID)-\(load.loadID ?? 0)")
        guard load.outcome != "denied" else {
            event.merge(finding(uid: uid, title: "Stopped a transfer of \(load.typeIdentifier) by policy", detail: load.summary,
                                errorName: load.errorName, rule: nil, at: load.endedAt)) { $1 }
            return header(.dataSecurityFinding, .create, event, time: load.endedAt, priority: load.priority,
                          message: load.summary, uid: uid, session: load.sessionID, profiles: ["security_control"])
        }
        event.merge(outcome(load.outcome, errorName: load.errorName)) { $1 }
        return header(.fileHostingActivity, .copy, event, time: load.endedAt, priority: load.priority,
                      message: load.summary, uid: uid, session: load.sessionID)
    }

    /// Nil for a session still open: it has no end to report yet.
    static func event(for session: SessionRecord) -> Event? {
        guard session.outcome != SessionRecord.open else { return nil }
        let started = milliseconds(session.startedAt), ended = milliseconds(session.endedAt)
        let activity: Activity = switch session.operation {
        case "copy": .copy
        case "move": .move
        default: .other(session.operation)
        }
        var event: Event = [
            "actor": actor(app: session.destinationApp ?? session.sourceApp),
            "src_endpoint": endpoint(app: session.sourceApp),
            "file": ["name": session.sessionID, "uid": session.sessionID, "type_id": 99,
                     "type": ["drag": "drag session", "copy": "pasteboard entry", "paste": "paste"][session.kind] ?? session.kind] as Event,
            "start_time": started,
            "end_time": ended,
            "duration": ended - started,
            "unmapped": unmapped(["kind": session.kind, "channel": session.channel, "items": session.itemCount]),
        ]
        if let destination = session.destinationApp { event["dst_endpoint"] = endpoint(app: destination) }
        event.merge(outcome(session.outcome, errorName: session.errorName)) { $1 }
        return header(.fileHostingActivity, activity, event, time: session.endedAt, priority: session.priority,
                      message: session.summary, uid: "session-\(session.sessionID)", session: session.sessionID)
    }

    static func event(for refusal: RefusalRecord) -> Event {
        let uid = "refusal-" + (refusal.id.map(String.init) ?? "\(MicrosecondTimestamp.microseconds(refusal.at))")
        var actor = actor(app: refusal.app)
        // pid 0 is a refusal the daemon could not tie to a process, or a sum of suppressed ones.
        if refusal.pid > 0 {
            actor["process"] = ["pid": refusal.pid, "user": ["uid": String(refusal.uid)]] as Event
        }
        var event: Event = ["actor": actor, "unmapped": unmapped(["action": refusal.action])]
        if let subject = refusal.subject { event["file"] = data(subject) }
        event.merge(finding(uid: uid, title: "Refused \(refusal.action)", detail: refusal.message, errorName: refusal.errorName,
                            rule: refusal.rule, at: refusal.at)) { $1 }
        return header(.dataSecurityFinding, .create, event, time: refusal.at, priority: refusal.priority, message: refusal.summary,
                      uid: uid, session: refusal.sessionID, profiles: ["security_control"])
    }

    // MARK: Parts

    private static func header(_ eventClass: EventClass, _ activity: Activity, _ body: Event, time: Date, priority: Int,
                               message: String, uid: String, session: String?, profiles: [String] = []) -> Event {
        let severity = severity(priority: priority)
        var metadata: Event = [
            "version": schemaVersion,
            "product": ["name": "dragbroker", "vendor_name": "dragbroker", "version": productVersion] as Event,
            "uid": uid,
            "log_name": "transfers",
            "log_provider": "dragbrokerd",
        ]
        if let session { metadata["correlation_uid"] = session }
        if !profiles.isEmpty { metadata["profiles"] = profiles }
        var event = body
        event.merge([
            "class_uid": eventClass.rawValue,
            "class_name": eventClass.name,
            "category_uid": eventClass.categoryUID,
            "category_name": eventClass.categoryName,
            "activity_id": activity.id,
            "activity_name": activity.name,
            "type_uid": eventClass.rawValue * 100 + activity.id,
            "type_name": "\(eventClass.name): \(activity.id == 99 ? "Other" : activity.name)",
            "severity_id": severity.id,
            "severity": severity.name,
            "time": milliseconds(time),
            "message": message,
            "metadata": metadata,
        ]) { $1 }
        return event
    }

    /// What a Data Security Finding adds: the finding, the decision (security_control), and the rule.
    private static func finding(uid: String, title: String, detail: String, errorName: String?, rule: String?, at: Date) -> Event {
        var dataSecurity: Event = [
            "detection_system_id": 10,
            "detection_system": "Application-Level DLP",
            "data_lifecycle_state_id": 2,
            "data_lifecycle_state": "Data in-Transit",
        ]
        if let rule { dataSecurity["policy"] = ["name": rule, "uid": rule, "is_applied": true] as Event }
        var finding: Event = ["uid": uid, "title": title, "desc": detail, "created_time": milliseconds(at)]
        if let errorName { finding["types"] = [errorName] }
        var event: Event = [
            "finding_info": finding,
            "data_security": dataSecurity,
            // The finding's own workflow state, which a reviewer moves on; every refusal starts New.
            "status_id": 1,
            "status": "New",
            "status_detail": detail,
            "action_id": 2,
            "action": "Denied",
            "disposition_id": 2,
            "disposition": "Blocked",
            // A rule is the administrator asking to hear of it; a call out of turn is a client's bug.
            "is_alert": rule != nil,
        ]
        if let errorName { event["status_code"] = errorName }
        return event
    }

    private static func outcome(_ outcome: String, errorName: String?) -> Event {
        var event: Event = outcome == "completed" ? ["status_id": 1, "status": "Success"] : ["status_id": 2, "status": "Failure"]
        event["status_detail"] = outcome
        if let errorName { event["status_code"] = errorName }
        return event
    }

    /// App IDs are identifiers (a Flatpak ID, a registered ID, or an executable's path), so they go in the `uid`s.
    private static func actor(app: String) -> Event { ["app_uid": app] }

    private static func endpoint(app: String) -> Event { ["uid": app] }

    /// A representation has no file name in the log: its type identifier names it, and is its MIME type when it is one.
    private static func data(_ typeIdentifier: String) -> Event {
        var file: Event = ["name": typeIdentifier, "type_id": 0]
        if typeIdentifier.wholeMatch(of: /[^\s\/,]+\/[^\s\/,]+/) != nil { file["mime_type"] = typeIdentifier }
        return file
    }

    private static func unmapped(_ fields: [String: Any?]) -> Event {
        fields.compactMapValues { $0 }
    }

    static func milliseconds(_ date: Date) -> Int64 {
        MicrosecondTimestamp.microseconds(date) / 1000
    }
}

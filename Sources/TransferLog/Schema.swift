import GRDB

/// The schema's history. Migrations are append-only: a shipped migration is
/// never edited, because existing logs have already recorded it as applied.
enum Schema {
    static let migrator: DatabaseMigrator = {
        var migrator = DatabaseMigrator()

        migrator.registerMigration("v1-sessions-and-loads") { db in
            // No CHECK on operation/outcome: an unexpected value is better
            // logged than rejected, since a rejected row is lost history.
            try db.create(table: "session") { t in
                t.primaryKey("sessionID", .text)
                t.column("sourceApp", .text).notNull()
                t.column("destinationApp", .text)
                t.column("itemCount", .integer).notNull()
                t.column("operation", .text).notNull()
                t.column("outcome", .text).notNull()
                t.column("errorName", .text)
                t.column("startedAt", .integer).notNull().indexed()
                t.column("endedAt", .integer).notNull()
            }
            // No foreign key to session: loads are logged while their session
            // is still running, before the session row exists.
            try db.create(table: "load") { t in
                t.autoIncrementedPrimaryKey("id")
                t.column("sessionID", .text).notNull().indexed()
                t.column("sourceApp", .text).notNull()
                t.column("destinationApp", .text).notNull()
                t.column("typeIdentifier", .text).notNull()
                t.column("bytes", .integer).notNull()
                t.column("startedAt", .integer).notNull().indexed()
                t.column("endedAt", .integer).notNull()
                t.column("outcome", .text).notNull()
                t.column("errorName", .text)
            }
        }

        migrator.registerMigration("v2-refusals") { db in
            // Every refusal the broker answers, beside the transfers: who, what, why.
            try db.create(table: "refusal") { t in
                t.autoIncrementedPrimaryKey("id")
                t.column("at", .integer).notNull().indexed()
                t.column("app", .text).notNull()
                t.column("uid", .integer).notNull()
                t.column("pid", .integer).notNull()
                t.column("action", .text).notNull()
                t.column("sessionID", .text)
                t.column("subject", .text)
                t.column("errorName", .text).notNull()
                t.column("message", .text).notNull()
                t.column("rule", .text)
            }
        }

        migrator.registerMigration("v3-load-teams") { db in
            // Teams decide visibility and policy, so the audit keeps them beside the apps.
            try db.alter(table: "load") { t in
                t.add(column: "sourceTeam", .text)
                t.add(column: "destinationTeam", .text)
            }
        }

        return migrator
    }()
}

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

        migrator.registerMigration("v4-write-ahead") { db in
            // A load is recorded when it starts (outcome "open") and completed in place when it
            // ends, so a crash in between leaves it on record. Rows from before have no loadID;
            // SQLite treats their NULLs as distinct, so they never collide with each other.
            try db.alter(table: "load") { t in
                t.add(column: "loadID", .integer)
            }
            try db.create(index: "load_on_sessionID_loadID", on: "load", columns: ["sessionID", "loadID"], unique: true)
            // The new index answers every lookup by session, and each index costs every load's
            // start a page write that the load waits for. Open rows are looked for only once,
            // at start after a crash: a scan, not an index.
            try db.drop(index: "load_on_sessionID")
            // Records the daemon could not keep: how many, between when, and why. A log with a
            // gap says so, rather than looking complete.
            try db.create(table: "gap") { t in
                t.autoIncrementedPrimaryKey("id")
                t.column("recordedAt", .integer).notNull()
                t.column("firstLostAt", .integer).notNull()
                t.column("lastLostAt", .integer).notNull().indexed()
                t.column("lost", .integer).notNull()
                t.column("reason", .text).notNull()
            }
        }

        migrator.registerMigration("v5-log-state") { db in
            // What the log must remember after its rows are gone: the highest session number
            // retention deleted, so the next daemon never numbers below it.
            try db.create(table: "logState") { t in
                t.primaryKey("key", .text)
                t.column("value", .integer).notNull()
            }
        }

        migrator.registerMigration("v6-session-kinds") { db in
            // The clipboard goes through the broker too: a session is a drag, a pasteboard entry
            // ("copy") or one paste of it. Every session before was a drag.
            try db.alter(table: "session") { t in
                t.add(column: "kind", .text).notNull().defaults(to: "drag")
            }
        }

        return migrator
    }()
}

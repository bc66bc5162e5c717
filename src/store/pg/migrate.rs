//! The PostgreSQL schema: `migrations/postgres/NNNN_*.sql`, mirroring the SQLite migrations one
//! for one, applied in order under a session advisory lock (replicas starting together migrate
//! once); the version is the row count of `forge_schema_migrations`.

use postgres::Client;

use crate::store::StoreError;

/// The PostgreSQL migrations, in the same order and with the same names as `MIGRATIONS`.
pub const PG_MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init.sql", include_str!("../../../migrations/postgres/0001_init.sql")),
    ("0002_reuse.sql", include_str!("../../../migrations/postgres/0002_reuse.sql")),
    ("0003_semantic.sql", include_str!("../../../migrations/postgres/0003_semantic.sql")),
    ("0004_kv_blocks.sql", include_str!("../../../migrations/postgres/0004_kv_blocks.sql")),
    ("0005_model_files.sql", include_str!("../../../migrations/postgres/0005_model_files.sql")),
    ("0006_equivalent.sql", include_str!("../../../migrations/postgres/0006_equivalent.sql")),
    ("0007_partial_blocks.sql", include_str!("../../../migrations/postgres/0007_partial_blocks.sql")),
    ("0008_blend.sql", include_str!("../../../migrations/postgres/0008_blend.sql")),
    ("0009_prompt_token_ids.sql", include_str!("../../../migrations/postgres/0009_prompt_token_ids.sql")),
];

/// Key of the session advisory lock held while migrating.
const MIGRATE_LOCK: i64 = 0x666f_7267_6501;

/// Applies the pending migrations (each in its own transaction) while holding [`MIGRATE_LOCK`].
pub(super) fn migrate(c: &mut Client) -> Result<(), StoreError> {
    c.execute("SELECT pg_advisory_lock($1)", &[&MIGRATE_LOCK])?;
    let result = (|| {
        c.batch_execute("CREATE TABLE IF NOT EXISTS forge_schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")?;
        let version: i64 = c.query_one("SELECT COUNT(*) FROM forge_schema_migrations", &[])?.get(0);
        if version as usize > PG_MIGRATIONS.len() {
            return Err(StoreError::Invalid(format!(
                "the database's schema version {version} is newer than this build knows ({}); use a newer forge-cache",
                PG_MIGRATIONS.len()
            )));
        }
        for (i, (name, sql)) in PG_MIGRATIONS.iter().enumerate().skip(version as usize) {
            let wrap = |e: postgres::Error| StoreError::Invalid(format!("PostgreSQL migration {name} failed: {e}"));
            let mut tx = c.transaction().map_err(wrap)?;
            tx.batch_execute(sql).map_err(wrap)?;
            tx.execute("INSERT INTO forge_schema_migrations (version, name) VALUES ($1, $2)", &[&((i + 1) as i64), name]).map_err(wrap)?;
            tx.commit().map_err(wrap)?;
        }
        Ok(())
    })();
    c.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATE_LOCK])?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_migrations_mirror_the_sqlite_ones() {
        let names = |m: &[(&str, &str)]| m.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>();
        assert_eq!(names(PG_MIGRATIONS), names(crate::store::MIGRATIONS));
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
        let mut files: Vec<String> =
            std::fs::read_dir(&dir).expect("dir").map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).filter(|n| n.ends_with(".sql")).collect();
        files.sort();
        assert_eq!(files, names(PG_MIGRATIONS));
    }
}

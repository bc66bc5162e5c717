//! The knowledge store: one SQLite file (rusqlite, bundled SQLite, WAL) holding every request
//! (`inferences`), the facts its answers left behind (`facts`, `fact_relationships`,
//! `reasoning_chains`), and tables later tiers fill (`kv_lineage`, `semantic_fragments`).
//! The schema lives in `migrations/NNNN_*.sql`, applied in order at open and tracked with
//! `PRAGMA user_version`; `docs/schema.md` documents it. sqlite-vec is registered for every
//! connection this process opens.
//!
//! * `inferences` — recording requests, exact-cache lookups, REFRESH superseding
//! * `claims` — splitting answers into claims, normalizing text for dedup and question lookup
//! * `facts` — fact extraction, PutFact, InvalidateFacts, search, the FACT tier's lookup
//! * `stats` — hit rates, tokens and time saved, latency percentiles
//! * `query` — read-only connections and the guarded ad-hoc query runner (`forge-cache sql`)
//! * `semantic` — prompt and fact embeddings (sqlite-vec), neighbours, verification outcomes
//! * `model_files` — a model file's SHA-256, computed once per (size, mtime, header) fingerprint
//!
//! Every read and write takes the tenant: nothing crosses tenants.
//!
//! [`Store`] is the one interface the rest of the service uses: the embedded [`SqliteStore`]
//! (the default) or the shared [`PgStore`] (PostgreSQL + pgvector, `--db postgres://...`, for
//! replicas), chosen by [`Store::open_db`]. Both run the same schema (`migrations/` and
//! `migrations/postgres/`, one file per step on each side) with the same methods.

pub mod claims;
pub mod facts;
pub mod inferences;
pub mod model_files;
pub mod pg;
pub mod query;
pub mod semantic;
pub mod stats;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};
use sha2::{Digest, Sha256};

pub use facts::{Fact, InvalidateRequest, LearnReport, PutFactReport};
pub use inferences::{CachedAnswer, NewInference};
pub use pg::{is_postgres_url, PgStore};
pub use query::QueryResult;
pub use stats::{KvStats, Stats, StatsFilter, TierStats};
/// The shared vocabulary ([`crate::vocab`]), re-exported where the store's callers used to find it.
pub use crate::vocab::{CacheMode, ServedFrom};

/// The current UTC time as the store writes timestamps (sortable ISO-8601 text, milliseconds).
macro_rules! now_sql {
    () => {
        "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
    };
}
pub(crate) use now_sql;

/// Little-endian f32 bytes: sqlite-vec's vector format (and `response_logprobs`).
pub(crate) fn blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A stored stop reason read back; an unknown word is a malformed row, not a panic.
pub(crate) fn parse_stop_reason(s: &str) -> Result<crate::vocab::StopReason, StoreError> {
    crate::vocab::StopReason::parse(s).ok_or_else(|| StoreError::Malformed(format!("stop_reason {s:?}")))
}

/// The migrations, in order; `user_version` = how many have been applied. A test checks that
/// every file in `migrations/` is listed here.
pub const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init.sql", include_str!("../../migrations/0001_init.sql")),
    ("0002_reuse.sql", include_str!("../../migrations/0002_reuse.sql")),
    ("0003_semantic.sql", include_str!("../../migrations/0003_semantic.sql")),
    ("0004_kv_blocks.sql", include_str!("../../migrations/0004_kv_blocks.sql")),
    ("0005_model_files.sql", include_str!("../../migrations/0005_model_files.sql")),
    ("0006_equivalent.sql", include_str!("../../migrations/0006_equivalent.sql")),
    ("0007_partial_blocks.sql", include_str!("../../migrations/0007_partial_blocks.sql")),
    ("0008_blend.sql", include_str!("../../migrations/0008_blend.sql")),
    ("0009_prompt_token_ids.sql", include_str!("../../migrations/0009_prompt_token_ids.sql")),
];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{}: cannot open the database: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{}: not a usable SQLite database ({source}); the file was left untouched", path.display())]
    Corrupt {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "{}: the database is damaged (SQLite's {check}: {report}); nothing was changed. Restore a backup, or copy out what \
         is readable with `sqlite3 {} .recover`; a huge store can skip this check (--db-check off)",
        path.display(),
        path.display()
    )]
    Damaged { path: PathBuf, check: &'static str, report: String },
    #[error("{}: schema version {found} is newer than this build knows ({known}); use a newer forge-cache", path.display())]
    TooNew { path: PathBuf, found: i64, known: usize },
    #[error("migration {name} failed: {source}")]
    Migration {
        name: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("registering sqlite-vec failed with SQLite code {0}")]
    SqliteVec(i32),
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored value is malformed: {0}")]
    Malformed(String),
    #[error("fact {0} does not exist for this tenant")]
    NoSuchFact(i64),
    #[error("{0}")]
    Invalid(String),
    #[error("refused: {0}")]
    Refused(String),
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] postgres::Error),
    /// The database cannot be reached now (connection lost or refused); the next call tries to
    /// connect again. Requests fail with UNAVAILABLE / 503.
    #[error("the knowledge store is unavailable: {0}")]
    Unavailable(String),
    #[error("the query ran longer than {0:?} and was stopped (a longer limit: --timeout SECONDS, 0 for none)")]
    TimedOut(Duration),
}

/// Registers sqlite-vec as an auto-extension (once per process): every connection opened
/// afterwards has `vec_version()`, `vec_distance_cosine()`, `vec0` tables, ...
pub fn register_sqlite_vec() -> Result<(), StoreError> {
    static RC: OnceLock<i32> = OnceLock::new();
    let rc = *RC.get_or_init(|| {
        // SAFETY: `sqlite3_vec_init` is sqlite-vec's C entry point with the signature SQLite
        // expects of an extension init function (db, pzErrMsg, pApi); sqlite-vec's crate
        // declares it without arguments, so the pointer is cast to the type
        // `sqlite3_auto_extension` takes, as sqlite-vec documents. It is compiled against the
        // same (bundled) SQLite that rusqlite links, and registering an auto-extension has no
        // other precondition.
        unsafe {
            rusqlite::ffi::sqlite3_auto_extension(Some(std::mem::transmute::<
                *const (),
                unsafe extern "C" fn(
                    *mut rusqlite::ffi::sqlite3,
                    *mut *mut std::os::raw::c_char,
                    *const rusqlite::ffi::sqlite3_api_routines,
                ) -> std::os::raw::c_int,
            >(sqlite_vec::sqlite3_vec_init as *const ())))
        }
    });
    if rc == rusqlite::ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(StoreError::SqliteVec(rc))
    }
}

/// sha256 of `bytes` as lower-case hex: the store's hash for prompts, questions, cache keys and
/// model files.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 (hex) of a file's content, read in 1 MiB pieces.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// How much of an existing database [`Store::open_with`] checks before it changes anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DbCheck {
    /// `integrity_check` for files up to [`FULL_CHECK_MAX_BYTES`], `quick_check` above.
    #[default]
    Auto,
    /// `PRAGMA quick_check`: every page and record (O(size)), not index contents.
    Quick,
    /// `PRAGMA integrity_check`: also that every index matches its table.
    Full,
    /// No check (a store so large its check would delay the start; damage then shows as errors).
    Off,
}

impl DbCheck {
    pub fn parse(s: &str) -> Option<DbCheck> {
        Some(match s {
            "auto" => DbCheck::Auto,
            "quick" => DbCheck::Quick,
            "full" => DbCheck::Full,
            "off" => DbCheck::Off,
            _ => return None,
        })
    }
}

/// Largest database [`DbCheck::Auto`] runs the full `integrity_check` on.
pub const FULL_CHECK_MAX_BYTES: u64 = 64 << 20;

/// Runs `check` on `conn` (a database of `bytes` bytes at `path`): `Err(Damaged)` with SQLite's
/// first findings when it reports anything but "ok". Only reads.
pub fn check_database(conn: &Connection, path: &Path, bytes: u64, check: DbCheck) -> Result<(), StoreError> {
    let pragma = match check {
        DbCheck::Off => return Ok(()),
        DbCheck::Full => "integrity_check",
        DbCheck::Auto if bytes <= FULL_CHECK_MAX_BYTES => "integrity_check",
        DbCheck::Auto | DbCheck::Quick => "quick_check",
    };
    let damaged = |report: String| StoreError::Damaged { path: path.to_path_buf(), check: pragma, report };
    // At most 5 findings: enough to say what is wrong.
    let mut st = conn.prepare(&format!("PRAGMA {pragma}(5)")).map_err(|e| damaged(e.to_string()))?;
    let rows = st.query_map([], |r| r.get::<_, String>(0)).map_err(|e| damaged(e.to_string()))?;
    let found: Vec<String> = rows.collect::<Result<_, _>>().map_err(|e| damaged(e.to_string()))?;
    if found.len() == 1 && found[0] == "ok" {
        return Ok(());
    }
    Err(damaged(found.join("; ")))
}

/// The read-write store of a service. Cheap to share behind an `Arc`; calls block (run them
/// off the async executor).
pub struct SqliteStore {
    conn: Mutex<Connection>,
    path: PathBuf,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("path", &self.path).finish()
    }
}

impl SqliteStore {
    /// [`SqliteStore::open_with`] with the default check ([`DbCheck::Auto`]).
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, DbCheck::Auto)
    }

    /// Opens (creating if missing) the database at `path`, checks that it is a readable SQLite
    /// file and, when it existed, runs `check` on it before changing anything in it, then
    /// switches it to WAL and applies pending migrations. A file that is not a database, or a
    /// damaged one, is an error and is not modified.
    pub fn open_with(path: impl AsRef<Path>, check: DbCheck) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        register_sqlite_vec()?;
        let existing = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(&path, flags).map_err(|source| StoreError::Open { path: path.clone(), source })?;
        // The first statement reads the header and schema: a non-database fails here, before any write.
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0))
            .map_err(|source| StoreError::Corrupt { path: path.clone(), source })?;
        conn.busy_timeout(Duration::from_secs(5))?;
        if existing > 0 {
            // Closing the last connection would checkpoint a WAL left by a crash into the file:
            // not into a damaged one.
            conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
            check_database(&conn, &path, existing, check)?;
            conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false)?;
        }
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Invalid(format!("{}: journal mode is {mode}, WAL could not be set", path.display())));
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Foreign keys stay off while migrations rebuild tables (SQLite's documented procedure);
        // `migrate` checks every reference before committing.
        conn.pragma_update(None, "foreign_keys", "OFF")?;
        migrate(&mut conn, &path)?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        Ok(SqliteStore { conn: Mutex::new(conn), path })
    }

    /// The connection. A panic while it was held cannot leave a transaction open (rusqlite rolls
    /// back on drop), so a poisoned lock is taken over.
    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The connection, with `synchronous = FULL` until the guard drops: a transaction committed
    /// through it is on disk when the commit returns (WAL fsynced), so a power loss cannot take
    /// back what a user was told was written (PutFact, InvalidateFacts). The store's own writes
    /// (request records, learned facts, KV rows) stay at `NORMAL`: durable across a crash of the
    /// process, possibly not the last ones across a power loss (docs/schema.md).
    pub(crate) fn durable_conn(&self) -> Result<DurableConn<'_>, StoreError> {
        let conn = self.conn();
        conn.pragma_update(None, "synchronous", "FULL")?;
        Ok(DurableConn(conn))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version (`PRAGMA user_version`).
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(self.conn().query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }
}

/// The knowledge store of a service: one interface over both backends. Every method blocks
/// (run it off the async executor) and takes the tenant where data is per tenant.
#[derive(Debug)]
pub enum Store {
    /// The embedded default: one SQLite file.
    Sqlite(std::sync::Arc<SqliteStore>),
    /// Shared by replicas: PostgreSQL + pgvector.
    Postgres(PgStore),
}

/// Calls the same method on whichever backend the store is.
macro_rules! dispatch {
    ($(#[$m:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty) => {
        $(#[$m])*
        pub fn $name(&self $(, $arg: $ty)*) -> $ret {
            match self {
                Store::Sqlite(s) => s.$name($($arg),*),
                Store::Postgres(p) => p.$name($($arg),*),
            }
        }
    };
}

impl Store {
    /// Opens a SQLite file with the default check (see [`SqliteStore::open`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        Ok(Store::Sqlite(std::sync::Arc::new(SqliteStore::open(path)?)))
    }

    /// `--db`: a `postgres://` / `postgresql://` URL opens the shared store, anything else is a
    /// SQLite file (checked with [`DbCheck::Auto`]).
    pub fn open_db(db: &Path) -> Result<Store, StoreError> {
        Store::open_with(db, DbCheck::Auto)
    }

    /// `--db` with `--db-check`: a SQLite file is checked as `check` says before anything in it
    /// changes ([`SqliteStore::open_with`]). A PostgreSQL URL ignores `check`: SQLite's
    /// `integrity_check` / `quick_check` have no PostgreSQL counterpart to run at start-up (the
    /// server keeps its own pages consistent: WAL, checksums when the cluster has them, and
    /// `amcheck` is a DBA's tool), so the shared store is opened (and migrated) as is.
    pub fn open_with(db: impl AsRef<Path>, check: DbCheck) -> Result<Store, StoreError> {
        let db = db.as_ref();
        match db.to_str() {
            Some(url) if is_postgres_url(url) => Ok(Store::Postgres(PgStore::open(url)?)),
            _ => Ok(Store::Sqlite(std::sync::Arc::new(SqliteStore::open_with(db, check)?))),
        }
    }

    /// The SQLite store, when that is the backend (the KV disk tier lives beside it).
    pub fn sqlite(&self) -> Option<&std::sync::Arc<SqliteStore>> {
        match self {
            Store::Sqlite(s) => Some(s),
            Store::Postgres(_) => None,
        }
    }

    /// Where the data lives: the file, or the URL without its password.
    pub fn location(&self) -> String {
        match self {
            Store::Sqlite(s) => s.path().display().to_string(),
            Store::Postgres(p) => p.url(),
        }
    }

    dispatch!(fn schema_version(&self) -> Result<i64, StoreError>);
    dispatch!(fn record_inference(&self, r: &NewInference<'_>) -> Result<i64, StoreError>);
    dispatch!(fn find_exact(&self, tenant: &str, key: &str) -> Result<Option<CachedAnswer>, StoreError>);
    dispatch!(fn learn(&self, tenant: &str, inference_id: i64, question: Option<&str>, prompt_hash: &str, answer: &str) -> Result<LearnReport, StoreError>);
    dispatch!(fn put_fact(&self, tenant: &str, content: &str, question: Option<&str>, confidence: f64) -> Result<PutFactReport, StoreError>);
    dispatch!(fn invalidate_facts(&self, tenant: &str, req: &InvalidateRequest<'_>) -> Result<Vec<i64>, StoreError>);
    dispatch!(fn search_facts(&self, tenant: &str, query: &str, limit: usize, include_degraded: bool) -> Result<Vec<Fact>, StoreError>);
    dispatch!(fn fact_answer(&self, tenant: &str, question: &str) -> Result<Option<Fact>, StoreError>);
    dispatch!(fn index_prompt(&self, tenant: &str, scope: &str, inference_id: i64, embedding: &[f32]) -> Result<(), StoreError>);
    dispatch!(fn index_fact(&self, tenant: &str, fact_id: i64, embedding: &[f32]) -> Result<(), StoreError>);
    dispatch!(fn nearest_answers(&self, scope: &str, embedding: &[f32], k: usize, min_similarity: f64) -> Result<Vec<semantic::Neighbour>, StoreError>);
    dispatch!(fn record_outcome(&self, tenant: &str, model_id: &str, inference_id: i64, o: &semantic::Outcome, draft: usize, accepted: usize) -> Result<(), StoreError>);
    dispatch!(fn outcomes(&self, tenant: &str, model_id: &str) -> Result<Vec<semantic::Outcome>, StoreError>);
    dispatch!(fn unindexed_facts(&self, tenant: &str, limit: usize) -> Result<Vec<(i64, String)>, StoreError>);
    dispatch!(fn tenants_with_unindexed_facts(&self) -> Result<Vec<String>, StoreError>);
    dispatch!(fn lowest_wrong_similarity(&self, source_inference_id: i64) -> Result<Option<f64>, StoreError>);
    dispatch!(fn draft_outcomes(&self, tenant: &str, model_id: &str) -> Result<Vec<(f64, u64, u64)>, StoreError>);
    dispatch!(fn record_equivalence(&self, tenant: &str, model_id: &str, inference_id: i64, o: &semantic::EquivalenceObservation) -> Result<(), StoreError>);
    dispatch!(fn equivalence_observations(&self, tenant: &str, model_id: &str) -> Result<Vec<semantic::EquivalenceObservation>, StoreError>);
    dispatch!(fn model_identity(&self, path: &Path) -> Result<model_files::ModelIdentity, StoreError>);
    dispatch!(fn tenant_stats(&self, tenant: &str, since_seconds: Option<u64>) -> Result<Stats, StoreError>);
}

/// A read-only view of a store for `forge-cache stats` and `sql`: a SQLite file through a
/// read-only connection, or PostgreSQL in READ ONLY transactions.
pub enum ReadOnlyStore {
    Sqlite(Connection),
    Postgres(PgStore),
}

impl ReadOnlyStore {
    /// `--db` as in [`Store::open_db`]; never creates or migrates anything.
    pub fn open(db: &Path) -> Result<ReadOnlyStore, StoreError> {
        match db.to_str() {
            Some(url) if is_postgres_url(url) => Ok(ReadOnlyStore::Postgres(PgStore::open_read_only(url)?)),
            _ => Ok(ReadOnlyStore::Sqlite(query::open_read_only(db)?)),
        }
    }

    pub fn stats(&self, filter: &StatsFilter) -> Result<Vec<Stats>, StoreError> {
        match self {
            ReadOnlyStore::Sqlite(c) => stats::compute(c, filter),
            ReadOnlyStore::Postgres(p) => p.stats(filter),
        }
    }

    /// The raw evidence of semantic reuse (the statistics on it are `cache::trust::semantic_stats`).
    pub fn semantic_evidence(&self, tenant: Option<&str>) -> Result<semantic::SemanticEvidence, StoreError> {
        match self {
            ReadOnlyStore::Sqlite(c) => semantic::evidence(c, tenant),
            ReadOnlyStore::Postgres(pg) => pg.semantic_evidence(tenant),
        }
    }

    pub fn run_read_only(&self, sql: &str, max_rows: usize) -> Result<QueryResult, StoreError> {
        match self {
            ReadOnlyStore::Sqlite(c) => query::run_read_only(c, sql, max_rows),
            ReadOnlyStore::Postgres(p) => p.run_read_only(sql, max_rows, None),
        }
    }

    /// [`ReadOnlyStore::run_read_only`] stopped after `limit` (`None`: no limit) with
    /// [`StoreError::TimedOut`]: SQLite's progress handler, PostgreSQL's `statement_timeout`.
    pub fn run_read_only_within(&mut self, sql: &str, max_rows: usize, limit: Option<Duration>) -> Result<QueryResult, StoreError> {
        match self {
            ReadOnlyStore::Sqlite(c) => query::run_read_only_within(c, sql, max_rows, limit),
            ReadOnlyStore::Postgres(p) => p.run_read_only(sql, max_rows, limit),
        }
    }
}

/// The store's connection at `synchronous = FULL`, back to `NORMAL` when dropped.
pub(crate) struct DurableConn<'a>(MutexGuard<'a, Connection>);

impl std::ops::Deref for DurableConn<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.0
    }
}

impl std::ops::DerefMut for DurableConn<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.0
    }
}

impl Drop for DurableConn<'_> {
    fn drop(&mut self) {
        // Only fails inside a transaction, and every transaction ended before the guard drops.
        let _ = self.0.pragma_update(None, "synchronous", "NORMAL");
    }
}

fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version < 0 || version as usize > MIGRATIONS.len() {
        return Err(StoreError::TooNew { path: path.to_path_buf(), found: version, known: MIGRATIONS.len() });
    }
    for (i, (name, sql)) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let wrap = |source| StoreError::Migration { name, source };
        let tx = conn.transaction().map_err(wrap)?;
        tx.execute_batch(sql).map_err(wrap)?;
        let broken: i64 = tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| r.get(0)).map_err(wrap)?;
        if broken > 0 {
            return Err(StoreError::Invalid(format!("migration {name} would leave {broken} broken references; nothing was changed")));
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64).map_err(wrap)?;
        tx.commit().map_err(wrap)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_file_is_listed_in_order() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("migrations dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        files.sort();
        let listed: Vec<&str> = MIGRATIONS.iter().map(|(n, _)| *n).collect();
        assert_eq!(files, listed);
        for (i, name) in listed.iter().enumerate() {
            assert!(name.starts_with(&format!("{:04}_", i + 1)), "{name} is out of sequence");
        }
    }

    #[test]
    fn open_migrates_once_and_loads_sqlite_vec() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.db");
        let store = SqliteStore::open(&path).expect("open");
        assert_eq!(store.schema_version().expect("version"), MIGRATIONS.len() as i64);
        let v: String = store.conn().query_row("SELECT vec_version()", [], |r| r.get(0)).expect("sqlite-vec");
        assert!(v.starts_with('v'), "{v}");
        drop(store);
        let store = SqliteStore::open(&path).expect("reopen");
        assert_eq!(store.schema_version().expect("version"), MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_refused_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.db");
        let junk: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        std::fs::write(&path, &junk).expect("write");
        let err = SqliteStore::open(&path).expect_err("must fail");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("left untouched"), "{err}");
        assert_eq!(std::fs::read(&path).expect("read"), junk);
    }

    #[test]
    fn a_version_1_store_keeps_its_rows_through_the_inferences_rebuild() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v1.db");
        {
            let conn = Connection::open(&path).expect("create");
            conn.execute_batch(MIGRATIONS[0].1).expect("v1 schema");
            conn.pragma_update(None, "user_version", 1).expect("version");
            conn.execute_batch(
                "INSERT INTO inferences (tenant, prompt, prompt_hash, model, model_id, params, cache_mode, served_from,
                     prompt_tokens, completion_tokens, tokens_computed, tokens_reused, stop_reason, response,
                     response_tokens, latency_ms, backend)
                 VALUES ('t', 'p', 'h', 'm', 'id', '{}', 'auto', 'MODEL', 3, 1, 4, 0, 'stop', 'Paris.', '[1]', 2.0, 'cpu');
                 INSERT INTO facts (tenant, content, content_norm, confidence, source_type, provenance_inference_id)
                 VALUES ('t', 'Paris.', 'paris', 0.9, 'inference', 1);",
            )
            .expect("v1 rows");
        }
        let store = SqliteStore::open(&path).expect("migrate");
        assert_eq!(store.schema_version().expect("version"), MIGRATIONS.len() as i64);
        let conn = store.conn();
        let (response, kv): (String, i64) =
            conn.query_row("SELECT response, kv_tokens_reused FROM inferences WHERE id = 1", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("row");
        assert_eq!((response.as_str(), kv), ("Paris.", 0));
        let broken: i64 = conn.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| r.get(0)).expect("fk check");
        assert_eq!(broken, 0);
        let fk: i64 = conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0)).expect("pragma");
        assert_eq!(fk, 1, "foreign keys are back on after migrating");
        conn.execute_batch("SELECT * FROM v_hit_rates; SELECT * FROM v_recent_inferences;").expect("views rebuilt");
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("new.db");
        Connection::open(&path).expect("create").pragma_update(None, "user_version", 99).expect("set");
        assert!(matches!(SqliteStore::open(&path), Err(StoreError::TooNew { found: 99, .. })));
    }
}

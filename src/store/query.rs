//! Read-only access to a store file from outside the service (`forge-cache stats`, `forge-cache
//! sql`), safe while the service writes (WAL). Three locks keep ad-hoc SQL from writing: the
//! connection is opened read-only with `query_only` on; an authorizer allows nothing but reading
//! (SELECT, reads of columns, functions, recursive CTEs, and a list of read-only PRAGMAs), so
//! INSERT / UPDATE / DELETE / DROP / CREATE / ATTACH / DETACH / VACUUM / writing PRAGMAs fail
//! at prepare time; and a statement SQLite does not call read-only is refused.

use std::path::Path;
use std::time::Duration;

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};

use super::{register_sqlite_vec, StoreError};

/// PRAGMAs that only read (with or without an argument such as a table name).
const READ_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "user_version",
    "schema_version",
    "journal_mode",
    "page_count",
    "page_size",
    "freelist_count",
    "compile_options",
    "function_list",
    "module_list",
    "pragma_list",
];

/// Statement kinds named in the refusal message.
const WRITE_KEYWORDS: &[&str] = &[
    "INSERT", "UPDATE", "DELETE", "REPLACE", "DROP", "CREATE", "ALTER", "ATTACH", "DETACH", "VACUUM", "REINDEX", "ANALYZE", "BEGIN",
    "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE",
];

fn authorize(ctx: AuthContext<'_>) -> Authorization {
    match ctx.action {
        AuthAction::Select | AuthAction::Read { .. } | AuthAction::Recursive => Authorization::Allow,
        AuthAction::Function { function_name } if !function_name.eq_ignore_ascii_case("load_extension") => Authorization::Allow,
        AuthAction::Pragma { pragma_name, pragma_value } => {
            let name = pragma_name.to_ascii_lowercase();
            let reads = READ_PRAGMAS.contains(&name.as_str());
            // `PRAGMA user_version = 5` would write; `PRAGMA table_info(facts)` only reads.
            let assigns = pragma_value.is_some() && !name.contains("_info") && !name.contains("_list");
            if reads && !assigns {
                Authorization::Allow
            } else {
                Authorization::Deny
            }
        }
        _ => Authorization::Deny,
    }
}

/// `path` as an SQLite URI filename (`file:` + the path, percent-encoded) with `query`.
fn uri(path: &Path, query: &str) -> String {
    let mut out = String::from("file:");
    for &b in path.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || b"/._-~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.push('?');
    out.push_str(query);
    out
}

/// Opens `path` read-only (never creating it) with the read-only authorizer installed, leaving
/// no file beside it. While a service has the database open its `-wal` and `-shm` files exist
/// and this connection reads through them (a consistent snapshot); otherwise the file is
/// complete on its own and is opened `immutable` (no locks, no `-wal` / `-shm` created, which
/// a read-only connection could not remove again).
pub fn open_read_only(path: &Path) -> Result<Connection, StoreError> {
    register_sqlite_vec()?;
    if !path.is_file() {
        return Err(StoreError::Invalid(format!("{} does not exist (start `forge-cache serve --db {}` first)", path.display(), path.display())));
    }
    let mut wal = path.as_os_str().to_os_string();
    wal.push("-wal");
    let in_use = Path::new(&wal).exists();
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let name = uri(path, if in_use { "mode=ro" } else { "mode=ro&immutable=1" });
    let mut conn = Connection::open_with_flags(name, flags).map_err(|source| StoreError::Open { path: path.to_path_buf(), source })?;
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0))
        .map_err(|source| StoreError::Corrupt { path: path.to_path_buf(), source })?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.pragma_update(None, "query_only", true)?;
    conn.authorizer(Some(authorize))?;
    Ok(conn)
}

/// Column names and rows (as JSON values; blobs as `"<blob N bytes>"`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QueryResult {
    /// Column names, in order.
    pub columns: Vec<String>,
    /// One value per column for each row.
    pub rows: Vec<Vec<serde_json::Value>>,
    /// More rows existed than `max_rows`.
    pub truncated: bool,
}

/// The first keyword of `sql`, upper-cased, after whitespace and comments.
fn first_keyword(sql: &str) -> String {
    let mut s = sql.trim_start();
    loop {
        if let Some(rest) = s.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest.split_once("*/").map_or("", |(_, r)| r).trim_start();
        } else {
            break;
        }
    }
    s.chars().take_while(|c| c.is_ascii_alphabetic()).collect::<String>().to_ascii_uppercase()
}

pub(crate) fn refused(what: &str) -> StoreError {
    StoreError::Refused(format!("forge-cache sql only reads the database: {what} (change data through the service's API)"))
}

/// [`run_read_only`] stopped after `limit` (`None`: no limit) with [`StoreError::TimedOut`],
/// through SQLite's progress handler (checked every few thousand virtual-machine steps, so an
/// unbounded recursive CTE stops too).
pub fn run_read_only_within(conn: &mut Connection, sql: &str, max_rows: usize, limit: Option<Duration>) -> Result<QueryResult, StoreError> {
    let Some(limit) = limit else { return run_read_only(conn, sql, max_rows) };
    let deadline = std::time::Instant::now() + limit;
    conn.progress_handler(10_000, Some(move || std::time::Instant::now() >= deadline))?;
    let result = run_read_only(conn, sql, max_rows);
    conn.progress_handler(0, None::<fn() -> bool>)?;
    match result {
        Err(StoreError::Sqlite(rusqlite::Error::SqliteFailure(f, _))) if f.code == rusqlite::ErrorCode::OperationInterrupted => {
            Err(StoreError::TimedOut(limit))
        }
        other => other,
    }
}

/// `sql` without surrounding space and closing semicolons, refused when empty or when its first
/// keyword names a statement that writes or ends a transaction (both backends check this first).
pub(crate) fn checked_statement(sql: &str) -> Result<&str, StoreError> {
    let sql = sql.trim().trim_end_matches(|c: char| c == ';' || c.is_whitespace());
    if sql.is_empty() {
        return Err(StoreError::Invalid("the query is empty".into()));
    }
    let kw = first_keyword(sql);
    if WRITE_KEYWORDS.contains(&kw.as_str()) {
        return Err(refused(&format!("{kw} statements are refused")));
    }
    Ok(sql)
}

/// Runs one read-only statement on a connection from [`open_read_only`].
pub fn run_read_only(conn: &Connection, sql: &str, max_rows: usize) -> Result<QueryResult, StoreError> {
    let sql = checked_statement(sql)?;
    let mut stmt = conn.prepare(sql).map_err(|e| match e {
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::AuthorizationForStatementDenied => {
            refused("the statement would change the database or its connection")
        }
        rusqlite::Error::MultipleStatement => StoreError::Invalid("one statement at a time".into()),
        other => StoreError::Sqlite(other),
    })?;
    if !stmt.readonly() {
        return Err(refused("the statement is not read-only"));
    }
    let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
    let n = columns.len();
    let mut rows = Vec::new();
    let mut truncated = false;
    let mut q = stmt.query([])?;
    while let Some(row) = q.next()? {
        if rows.len() == max_rows {
            truncated = true;
            break;
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(match row.get_ref(i)? {
                ValueRef::Null => serde_json::Value::Null,
                ValueRef::Integer(v) => v.into(),
                ValueRef::Real(v) => serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, serde_json::Value::Number),
                ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
                ValueRef::Blob(b) => format!("<blob {} bytes>", b.len()).into(),
            });
        }
        rows.push(out);
    }
    Ok(QueryResult { columns, rows, truncated })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    fn db() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.db");
        SqliteStore::open(&path).expect("create");
        (dir, path)
    }

    #[test]
    fn reads_work() {
        let (_d, path) = db();
        let conn = open_read_only(&path).expect("open");
        let r = run_read_only(&conn, "SELECT 1 AS one, 'a' AS s, NULL AS n, 2.5 AS x;", 10).expect("select");
        assert_eq!(r.columns, ["one", "s", "n", "x"]);
        assert_eq!(r.rows, vec![vec![1.into(), "a".into(), serde_json::Value::Null, 2.5.into()]]);
        let r = run_read_only(&conn, "-- comment\nWITH t(x) AS (VALUES (1), (2), (3)) SELECT x FROM t", 2).expect("cte");
        assert_eq!((r.rows.len(), r.truncated), (2, true));
        assert!(run_read_only(&conn, "SELECT * FROM v_hit_rates", 10).is_ok());
        assert!(run_read_only(&conn, "PRAGMA table_info(facts)", 100).expect("pragma").rows.len() > 5);
        assert!(run_read_only(&conn, "SELECT vec_version()", 1).is_ok());
    }

    #[test]
    fn writes_are_refused() {
        let (_d, path) = db();
        let conn = open_read_only(&path).expect("open");
        for sql in [
            "INSERT INTO facts (tenant, content, content_norm, confidence, source_type) VALUES ('t', 'x', 'x', 1, 'deduced')",
            "UPDATE facts SET confidence = 1",
            "DELETE FROM inferences",
            "DROP TABLE facts",
            "ATTACH DATABASE '/tmp/x.db' AS x",
            "  /* sneaky */ detach x",
            "WITH t AS (SELECT 1) DELETE FROM facts",
            "CREATE TABLE x (a)",
            "PRAGMA user_version = 7",
            "VACUUM",
            "VACUUM INTO '/tmp/copy.db'",
            "REPLACE INTO facts (id) VALUES (1)",
        ] {
            let err = run_read_only(&conn, sql, 10).expect_err(sql);
            assert!(matches!(err, StoreError::Refused(_)), "{sql}: {err}");
        }
        let multi = run_read_only(&conn, "SELECT 1; DROP TABLE facts", 1);
        assert!(matches!(multi, Err(StoreError::Refused(_))), "{multi:?}");
        let two = run_read_only(&conn, "SELECT 1; SELECT 2", 1);
        assert!(matches!(two, Err(StoreError::Invalid(_))), "{two:?}");
        let version: i64 = Connection::open(&path).expect("rw").query_row("PRAGMA user_version", [], |r| r.get(0)).expect("v");
        assert_eq!(version, crate::store::MIGRATIONS.len() as i64);
    }

    #[test]
    fn missing_and_corrupt_files_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(open_read_only(&dir.path().join("none.db")), Err(StoreError::Invalid(_))));
        let bad = dir.path().join("bad.db");
        std::fs::write(&bad, b"this is not a database, not even close, just some text to fill a page").expect("write");
        assert!(matches!(open_read_only(&bad), Err(StoreError::Corrupt { .. })));
    }
}

//! `forge-cache sql` is bounded and leaves nothing behind (issue 16, finding 4), running the
//! real binary on a real store: an unbounded recursive CTE stops at `--timeout` with a clear
//! error, and a query on a database no service has open creates no `-wal` / `-shm` file beside
//! it (a read-only connection could not remove them again).

use std::process::Command;
use std::time::{Duration, Instant};

fn sql(db: &std::path::Path, args: &[&str]) -> (bool, String, String, Duration) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_forge-cache")).arg("sql").arg("--db").arg(db).args(args).output().expect("run forge-cache sql");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned(), t.elapsed())
}

fn beside(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).expect("dir").map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn an_unbounded_query_stops_at_its_time_limit_and_no_file_is_left_beside_the_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("forge.db");
    drop(forge_cache::store::Store::open(&db).expect("create"));
    assert_eq!(beside(dir.path()), ["forge.db"], "a closed store leaves only its file");

    let (ok, out, _, _) = sql(&db, &["--json", "SELECT COUNT(*) AS n FROM inferences"]);
    assert!(ok, "a plain query works");
    assert!(out.contains("\"n\""), "{out}");
    assert_eq!(beside(dir.path()), ["forge.db"], "no -wal / -shm file may be left beside the database");

    let forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c";
    let (ok, _, err, took) = sql(&db, &["--timeout", "1", forever]);
    assert!(!ok, "an unbounded query must fail");
    assert!(err.contains("ran longer than 1s and was stopped"), "{err}");
    assert!(took < Duration::from_secs(10), "stopped after {took:?}");
    assert_eq!(beside(dir.path()), ["forge.db"]);
}

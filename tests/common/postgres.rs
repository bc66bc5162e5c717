//! A throw-away PostgreSQL + pgvector for tests (scripts/pg-test-server.sh, from the binaries
//! scripts/fetch-postgres.sh fetched). A test that needs it FAILS, naming the fix, when it cannot
//! start: it never passes silently without a database.

use std::path::PathBuf;
use std::process::Command;

/// A running server in a temporary folder; stopped and deleted when dropped.
pub struct PgServer {
    /// `postgres://forge@127.0.0.1:PORT/forge`
    pub url: String,
    dir: PathBuf,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/pg-test-server.sh")
}

fn run(args: &[&str]) -> String {
    let out = Command::new("bash").arg(script()).args(args).output().expect("run scripts/pg-test-server.sh");
    assert!(
        out.status.success(),
        "scripts/pg-test-server.sh {} failed ({}); the PostgreSQL tests need it (run scripts/fetch-postgres.sh or \
         scripts/fetch-test-clients.sh first):\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl PgServer {
    /// Starts a fresh server (about 2 s); panics with the script's message when it cannot.
    pub fn start() -> PgServer {
        let dir = std::env::temp_dir().join(format!("forge-pg-test-{}-{}", std::process::id(), next()));
        let url = run(&["start", dir.to_str().expect("utf-8 temp dir")]);
        assert!(url.starts_with("postgres://"), "pg-test-server.sh printed {url:?}, not a URL");
        PgServer { url, dir }
    }

    /// Stops the server and keeps its data (the database is "lost" to clients).
    pub fn pause(&self) {
        run(&["pause", self.dir.to_str().expect("dir")]);
    }

    /// Starts it again on the same port with the same data.
    pub fn resume(&self) {
        run(&["resume", self.dir.to_str().expect("dir")]);
    }
}

fn next() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(script()).args(["stop", self.dir.to_str().unwrap_or("")]).output();
    }
}

//! `forge-cache sql "SELECT ..."`: one read-only query on the database (a SQLite file, or
//! `--db postgres://...` in a READ ONLY transaction), printed as a table,
//! CSV or JSON. Anything that would write (INSERT, UPDATE, DELETE, DROP, CREATE, ATTACH, ...)
//! is refused; see `forge_cache::store::query` for how. A query stops after `--timeout` seconds
//! (default 5; SQLite: a progress handler, PostgreSQL: the transaction's `statement_timeout`),
//! and no file is created beside the database. The schema: docs/schema.md.

use std::path::PathBuf;

use clap::Args;

use forge_cache::store::{QueryResult, ReadOnlyStore};

#[derive(Debug, Args)]
pub struct SqlArgs {
    /// One SQL statement that only reads (SELECT, WITH, VALUES, EXPLAIN, read-only PRAGMAs).
    pub query: String,
    /// The SQLite file, or a `postgres://` URL (the shared store of replicas).
    #[arg(long, default_value = super::DEFAULT_DB)]
    pub db: PathBuf,
    /// CSV with a header row.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// One JSON object: {columns, rows, truncated}.
    #[arg(long)]
    pub json: bool,
    /// Print at most this many rows.
    #[arg(long, default_value_t = 10_000)]
    pub max_rows: usize,
    /// Stop the query after this many seconds (0: no limit).
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
}

fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "NULL".into(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn csv(r: &QueryResult) -> anyhow::Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(&r.columns)?;
    for row in &r.rows {
        w.write_record(row.iter().map(|v| if v.is_null() { String::new() } else { cell(v) }))?;
    }
    Ok(String::from_utf8(w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?)?)
}

pub fn run(a: &SqlArgs) -> anyhow::Result<()> {
    if !(a.timeout >= 0.0 && a.timeout.is_finite()) {
        anyhow::bail!("--timeout must be a number of seconds (0: no limit)");
    }
    let limit = (a.timeout > 0.0).then(|| std::time::Duration::from_secs_f64(a.timeout));
    let mut db = ReadOnlyStore::open(&a.db)?;
    let r = db.run_read_only_within(&a.query, a.max_rows, limit)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else if a.csv {
        print!("{}", csv(&r)?);
    } else {
        let rows: Vec<Vec<String>> = r.rows.iter().map(|row| row.iter().map(cell).collect()).collect();
        print!("{}", super::table(&r.columns, &rows, 80));
        let more = if r.truncated { format!(" (more than {}; see --max-rows)", a.max_rows) } else { String::new() };
        eprintln!("({} rows{more})", r.rows.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_and_nulls() {
        let r = QueryResult {
            columns: vec!["a".into(), "b".into()],
            rows: vec![vec!["x, \"y\"".into(), serde_json::Value::Null], vec![1.into(), 2.5.into()]],
            truncated: false,
        };
        assert_eq!(csv(&r).expect("csv"), "a,b\n\"x, \"\"y\"\"\",\n1,2.5\n");
    }
}

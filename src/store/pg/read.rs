//! The read side of the PostgreSQL store: `forge-cache stats` (every replica's requests), the
//! semantic evidence, and `forge-cache sql` (one statement in a READ ONLY transaction).

use std::time::Duration;

use super::PgStore;
use crate::store::semantic::SemanticEvidence;
use crate::store::stats::{self, KvStats, Raw, Row, Stats, StatsFilter};
use crate::store::{QueryResult, StoreError};
use crate::vocab::ServedFrom;

impl PgStore {
    /// Per tenant, then the total; the same numbers as the SQLite store's `stats::compute`.
    pub fn stats(&self, filter: &StatsFilter) -> Result<Vec<Stats>, StoreError> {
        let since = filter.since_seconds.map(|s| s as f64);
        let raw = self.with(|c| {
            let rows = c.query(
                "SELECT i.tenant, i.served_from, i.latency_ms, i.tokens_computed, i.tokens_reused, s.latency_ms, i.kv_tokens_reused
                 FROM inferences i LEFT JOIN inferences s ON s.id = i.source_inference_id
                 WHERE ($1::text IS NULL OR i.tenant = $1) AND ($2::float8 IS NULL OR i.created_at >= forge_ago($2))",
                &[&filter.tenant, &since],
            )?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                let tier: String = r.try_get(1)?;
                let served_from = ServedFrom::parse(&tier).ok_or_else(|| StoreError::Malformed(format!("served_from {tier:?}")))?;
                let u = |v: i64| v.max(0) as u64;
                out.push(Row {
                    tenant: r.try_get(0)?,
                    served_from,
                    latency_ms: r.try_get(2)?,
                    computed: u(r.try_get(3)?),
                    reused: u(r.try_get(4)?),
                    source_latency_ms: r.try_get(5)?,
                    kv_reused: u(r.try_get(6)?),
                });
            }
            let mut counts = std::collections::BTreeMap::new();
            for r in c.query(
                "SELECT tenant, COUNT(*) FILTER (WHERE degraded_at IS NULL), COUNT(*) FILTER (WHERE degraded_at IS NOT NULL), 0::bigint
                 FROM facts WHERE $1::text IS NULL OR tenant = $1 GROUP BY tenant
                 UNION ALL
                 SELECT tenant, 0, 0, COUNT(*) FROM reasoning_chains WHERE $1::text IS NULL OR tenant = $1 GROUP BY tenant",
                &[&filter.tenant],
            )? {
                let c: &mut (u64, u64, u64) = counts.entry(r.try_get::<_, String>(0)?).or_default();
                c.0 += r.try_get::<_, i64>(1)?.max(0) as u64;
                c.1 += r.try_get::<_, i64>(2)?.max(0) as u64;
                c.2 += r.try_get::<_, i64>(3)?.max(0) as u64;
            }
            // Filled by the shared KV tier (`--kv-storage blob`); empty when blocks stay per
            // replica (the default).
            let mut kv: std::collections::BTreeMap<String, KvStats> = std::collections::BTreeMap::new();
            for r in c.query(
                "SELECT tenant, COUNT(*), SUM(kv_tokens_reused)::bigint, SUM(prompt_blocks)::bigint, SUM(blocks_memory)::bigint,
                        SUM(blocks_disk)::bigint, SUM(blocks_corrupt)::bigint
                 FROM kv_requests WHERE ($1::text IS NULL OR tenant = $1) AND ($2::float8 IS NULL OR created_at >= forge_ago($2)) GROUP BY tenant",
                &[&filter.tenant, &since],
            )? {
                let u = |i: usize| -> Result<u64, StoreError> { Ok(r.try_get::<_, i64>(i)?.max(0) as u64) };
                let k = kv.entry(r.try_get(0)?).or_default();
                (k.requests, k.kv_tokens_reused, k.prompt_blocks, k.blocks_from_memory, k.blocks_from_disk, k.blocks_corrupt) =
                    (u(1)?, u(2)?, u(3)?, u(4)?, u(5)?, u(6)?);
                k.block_hit_rate = stats::hit_rate(k);
            }
            Ok(Raw { rows: out, counts, kv })
        })?;
        Ok(stats::assemble(raw, filter))
    }

    /// Stats of one tenant.
    pub fn tenant_stats(&self, tenant: &str, since_seconds: Option<u64>) -> Result<Stats, StoreError> {
        let filter = StatsFilter { tenant: Some(tenant.to_string()), since_seconds };
        self.stats(&filter)?.into_iter().next().ok_or_else(|| StoreError::Malformed("no stats row for the tenant".into()))
    }

    /// The raw evidence of semantic reuse, as `semantic::evidence` reads it from SQLite.
    pub fn semantic_evidence(&self, tenant: Option<&str>) -> Result<SemanticEvidence, StoreError> {
        self.with(|c| {
            let mut ev = SemanticEvidence::default();
            for r in c.query(
                "SELECT tenant, SUM(draft_tokens)::bigint, SUM(draft_accepted)::bigint FROM inferences WHERE $1::text IS NULL OR tenant = $1 GROUP BY tenant",
                &[&tenant],
            )? {
                ev.drafts.insert(r.try_get::<_, String>(0)?, (r.try_get::<_, i64>(1)?.max(0) as u64, r.try_get::<_, i64>(2)?.max(0) as u64));
            }
            for r in c.query("SELECT tenant, similarity, correct FROM semantic_outcomes WHERE $1::text IS NULL OR tenant = $1 ORDER BY id", &[&tenant])? {
                ev.outcomes.entry(r.try_get(0)?).or_default().push((r.try_get(1)?, r.try_get::<_, i64>(2)? != 0));
            }
            Ok(ev)
        })
    }

    /// One statement in a READ ONLY transaction (rolled back): anything that writes fails in
    /// PostgreSQL itself; a statement list is refused (the extended protocol takes one).
    /// `limit` (`None`: no limit) is the transaction's `statement_timeout` (`SET LOCAL`): the
    /// server cancels a longer query, which comes back as [`StoreError::TimedOut`].
    pub fn run_read_only(&self, sql: &str, max_rows: usize, limit: Option<Duration>) -> Result<QueryResult, StoreError> {
        let sql = crate::store::query::checked_statement(sql)?;
        let timed_out = |e: StoreError| match (e, limit) {
            (StoreError::Postgres(pe), Some(l)) if pe.code() == Some(&postgres::error::SqlState::QUERY_CANCELED) => StoreError::TimedOut(l),
            (e, _) => e,
        };
        self.with(|c| {
            let mut tx = c.build_transaction().read_only(true).start()?;
            // 0 = no limit; at least 1 ms (a smaller value would mean none).
            let ms = limit.map_or(0, |l| l.as_millis().clamp(1, i32::MAX as u128) as i64);
            tx.batch_execute(&format!("SET LOCAL statement_timeout = {ms}"))?;
            let stmt = match tx.prepare(sql) {
                Ok(s) => s,
                Err(e) => return Err(refusal(e)),
            };
            let columns: Vec<String> = stmt.columns().iter().map(|c| c.name().to_string()).collect();
            let numeric: Vec<bool> = stmt.columns().iter().map(|c| matches!(c.type_().name(), "int2" | "int4" | "int8" | "float4" | "float8" | "numeric" | "oid")).collect();
            let bytea: Vec<bool> = stmt.columns().iter().map(|c| c.type_().name() == "bytea").collect();
            drop(stmt);
            // The simple protocol gives every value as text, whatever its type; `prepare`
            // above proved `sql` is one statement.
            let msgs = tx.simple_query(sql).map_err(refusal)?;
            let mut rows = Vec::new();
            let mut truncated = false;
            for m in msgs {
                if let postgres::SimpleQueryMessage::Row(r) = m {
                    if rows.len() == max_rows {
                        truncated = true;
                        break;
                    }
                    let row = (0..r.len())
                        .map(|i| match r.get(i) {
                            None => serde_json::Value::Null,
                            Some(s) if bytea.get(i).copied().unwrap_or(false) => format!("<blob {} bytes>", s.len().saturating_sub(2) / 2).into(),
                            Some(s) if numeric.get(i).copied().unwrap_or(false) => {
                                serde_json::from_str::<serde_json::Number>(s).map(serde_json::Value::Number).unwrap_or_else(|_| s.into())
                            }
                            Some(s) => s.into(),
                        })
                        .collect();
                    rows.push(row);
                }
            }
            tx.rollback()?;
            Ok(QueryResult { columns, rows, truncated })
        })
        .map_err(timed_out)
    }
}

/// A statement PostgreSQL refused in a read-only transaction is a refusal; others stay errors.
fn refusal(e: postgres::Error) -> StoreError {
    match e.code() {
        Some(c) if *c == postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION => {
            StoreError::Refused("forge-cache sql only reads the database: the statement would change it (change data through the service's API)".into())
        }
        // statement_timeout: `run_read_only` says TimedOut.
        Some(c) if *c == postgres::error::SqlState::QUERY_CANCELED => StoreError::Postgres(e),
        _ => match e.as_db_error() {
            Some(db) => StoreError::Invalid(db.message().to_string()),
            None => StoreError::Postgres(e),
        },
    }
}

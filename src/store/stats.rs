//! What the caches are worth: per tenant and tier (served_from), requests and hit rate, tokens
//! computed and reused, latency p50/p95; tokens saved (reused) and time saved (an EXACT replay
//! saves its source answer's latency minus its own); fact and chain counts. Works on any
//! connection, so `forge-cache stats` reads the file directly through a read-only one.

use std::collections::BTreeMap;

use rusqlite::Connection;

use super::{SqliteStore, StoreError};
use crate::vocab::ServedFrom;

#[derive(Debug, Clone, Default)]
pub struct StatsFilter {
    /// Only this tenant (the service always sets it; the CLI may not).
    pub tenant: Option<String>,
    /// Only requests of the last N seconds.
    pub since_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TierStats {
    /// The tier.
    pub served_from: ServedFrom,
    /// Requests this tier served.
    pub requests: u64,
    /// This tier's share of the tenant's requests.
    pub hit_rate: f64,
    /// Positions the model computed for them.
    pub tokens_computed: u64,
    /// Tokens whose computation was reused instead of redone.
    pub tokens_reused: u64,
    /// Prompt tokens whose KV came from stored blocks.
    pub kv_tokens_reused: u64,
    /// Latency median (nearest rank), ms.
    pub latency_p50_ms: f64,
    /// Latency 95th percentile (nearest rank), ms.
    pub latency_p95_ms: f64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stats {
    /// The tenant, or `*` for all tenants together.
    pub tenant: String,
    /// Requests recorded.
    pub requests: u64,
    /// Every tier, MODEL first (zeros where unused).
    pub tiers: Vec<TierStats>,
    /// Reused tokens summed over all tiers.
    pub tokens_saved: u64,
    /// EXACT hits: the source answer's latency minus the hit's (at least 0), summed, ms.
    pub time_saved_ms: f64,
    /// Facts not degraded.
    pub live_facts: u64,
    /// Facts degraded.
    pub degraded_facts: u64,
    /// Rows in `reasoning_chains`.
    pub reasoning_chains: u64,
    /// KV-block reuse.
    pub kv: KvStats,
}

/// KV-block reuse of the computed requests (`kv_requests`) and what the disk tier holds.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct KvStats {
    /// Computed requests (`kv_requests` rows).
    pub requests: u64,
    /// Prompt tokens whose KV came from stored blocks.
    pub kv_tokens_reused: u64,
    /// Of those, leading tokens of a stored block a prompt diverged inside (or of a stored tail).
    pub partial_tokens_reused: u64,
    /// Prompt tokens computed (not reused).
    pub prompt_tokens_computed: u64,
    /// BLEND: document tokens that kept KV computed elsewhere, and those recomputed.
    pub blend_tokens_reused: u64,
    /// BLEND: document tokens whose KV was recomputed.
    pub blend_tokens_recomputed: u64,
    /// Whole blocks in the prompts; of those, found in memory / on disk; damaged ones found.
    pub prompt_blocks: u64,
    /// Of those, found in memory.
    pub blocks_from_memory: u64,
    /// Of those, found on disk.
    pub blocks_from_disk: u64,
    /// Damaged blocks found.
    pub blocks_corrupt: u64,
    /// (memory + disk) / prompt blocks.
    pub block_hit_rate: f64,
    /// Blocks and bytes on disk now (for the tenant).
    pub disk_blocks: u64,
    /// Bytes of those blocks on disk.
    pub disk_bytes: u64,
    /// Bytes in the service's memory when its latest request finished (all tenants).
    pub memory_bytes: u64,
}

/// One request as the stats read it (either backend fetches these; [`assemble`] sums them).
pub(crate) struct Row {
    /// The request's tenant.
    pub(crate) tenant: String,
    /// The tier that served it.
    pub(crate) served_from: ServedFrom,
    /// Its latency, ms.
    pub(crate) latency_ms: f64,
    /// Positions the model computed.
    pub(crate) computed: u64,
    /// Tokens reused.
    pub(crate) reused: u64,
    /// Prompt tokens whose KV came from stored blocks.
    pub(crate) kv_reused: u64,
    /// Latency of the source inference, ms (None without one).
    pub(crate) source_latency_ms: Option<f64>,
}

/// What a backend reads for [`assemble`]: the requests, per tenant (live facts, degraded facts,
/// chains), and per tenant KV numbers.
pub(crate) struct Raw {
    /// Every request in the filter.
    pub(crate) rows: Vec<Row>,
    /// Per tenant: (live facts, degraded facts, reasoning chains).
    pub(crate) counts: BTreeMap<String, (u64, u64, u64)>,
    /// Per tenant KV numbers.
    pub(crate) kv: BTreeMap<String, KvStats>,
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summarize(tenant: String, rows: &[&Row], counts: (u64, u64, u64), kv: KvStats) -> Stats {
    let n = rows.len() as u64;
    let tiers = ServedFrom::ALL
        .into_iter()
        .map(|tier| {
            let mine: Vec<&&Row> = rows.iter().filter(|r| r.served_from == tier).collect();
            let mut lat: Vec<f64> = mine.iter().map(|r| r.latency_ms).collect();
            lat.sort_by(f64::total_cmp);
            TierStats {
                served_from: tier,
                requests: mine.len() as u64,
                hit_rate: if n == 0 { 0.0 } else { mine.len() as f64 / n as f64 },
                tokens_computed: mine.iter().map(|r| r.computed).sum(),
                tokens_reused: mine.iter().map(|r| r.reused).sum(),
                kv_tokens_reused: mine.iter().map(|r| r.kv_reused).sum(),
                latency_p50_ms: percentile(&lat, 0.50),
                latency_p95_ms: percentile(&lat, 0.95),
            }
        })
        .collect();
    let time_saved_ms = rows
        .iter()
        .filter(|r| r.served_from == ServedFrom::Exact)
        .filter_map(|r| r.source_latency_ms.map(|s| (s - r.latency_ms).max(0.0)))
        .sum();
    Stats {
        tenant,
        requests: n,
        tiers,
        tokens_saved: rows.iter().map(|r| r.reused).sum(),
        time_saved_ms,
        live_facts: counts.0,
        degraded_facts: counts.1,
        reasoning_chains: counts.2,
        kv,
    }
}

/// One [`Stats`] per tenant (sorted by name), then, when no tenant was asked for and there is
/// more than one, the total over all of them (tenant `*`).
pub fn compute(conn: &Connection, filter: &StatsFilter) -> Result<Vec<Stats>, StoreError> {
    let since = filter.since_seconds.map(|s| format!("-{s} seconds"));
    let mut stmt = conn.prepare(
        "SELECT i.tenant, i.served_from, i.latency_ms, i.tokens_computed, i.tokens_reused, s.latency_ms, i.kv_tokens_reused
         FROM inferences i LEFT JOIN inferences s ON s.id = i.source_inference_id
         WHERE (?1 IS NULL OR i.tenant = ?1)
           AND (?2 IS NULL OR i.created_at >= strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2))",
    )?;
    let rows = stmt
        .query_map(rusqlite::params![filter.tenant, since], |r| {
            let tier: String = r.get(1)?;
            Ok((
                (r.get::<_, String>(0)?, tier, r.get::<_, f64>(2)?),
                (r.get::<_, i64>(3)?, r.get::<_, i64>(4)?, r.get::<_, Option<f64>>(5)?, r.get::<_, i64>(6)?),
            ))
        })?
        .map(|row| {
            let ((tenant, tier, latency_ms), (computed, reused, source_latency_ms, kv_reused)) = row?;
            let served_from = ServedFrom::parse(&tier).ok_or_else(|| StoreError::Malformed(format!("served_from {tier:?}")))?;
            Ok(Row { tenant, served_from, latency_ms, computed: computed.max(0) as u64, reused: reused.max(0) as u64, kv_reused: kv_reused.max(0) as u64, source_latency_ms })
        })
        .collect::<Result<Vec<Row>, StoreError>>()?;

    let mut counts: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let mut stmt = conn.prepare(
        "SELECT tenant, SUM(degraded_at IS NULL), SUM(degraded_at IS NOT NULL), 0 FROM facts WHERE ?1 IS NULL OR tenant = ?1 GROUP BY tenant
         UNION ALL
         SELECT tenant, 0, 0, COUNT(*) FROM reasoning_chains WHERE ?1 IS NULL OR tenant = ?1 GROUP BY tenant",
    )?;
    for row in stmt.query_map([&filter.tenant], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, i64>(3)?)))? {
        let (tenant, live, degraded, chains) = row?;
        let c = counts.entry(tenant).or_default();
        c.0 += live.max(0) as u64;
        c.1 += degraded.max(0) as u64;
        c.2 += chains.max(0) as u64;
    }

    let kv = kv_stats(conn, filter, since.as_deref())?;
    Ok(assemble(Raw { rows, counts, kv }, filter))
}

/// One [`Stats`] per tenant (sorted), then the total (`*`) when no tenant was asked for and
/// there is more than one.
pub(crate) fn assemble(raw: Raw, filter: &StatsFilter) -> Vec<Stats> {
    let Raw { rows, counts, kv } = raw;
    let mut tenants: Vec<String> = rows.iter().map(|r| r.tenant.clone()).chain(counts.keys().cloned()).collect();
    if let Some(t) = &filter.tenant {
        tenants.push(t.clone());
    }
    tenants.sort();
    tenants.dedup();
    let mut out: Vec<Stats> = tenants
        .iter()
        .map(|t| {
            let mine: Vec<&Row> = rows.iter().filter(|r| &r.tenant == t).collect();
            summarize(t.clone(), &mine, counts.get(t).copied().unwrap_or_default(), kv.get(t).cloned().unwrap_or_default())
        })
        .collect();
    if filter.tenant.is_none() && out.len() > 1 {
        let all: Vec<&Row> = rows.iter().collect();
        let total = counts.values().fold((0, 0, 0), |a, c| (a.0 + c.0, a.1 + c.1, a.2 + c.2));
        let mut sum = KvStats::default();
        for k in kv.values() {
            sum.requests += k.requests;
            sum.kv_tokens_reused += k.kv_tokens_reused;
            sum.partial_tokens_reused += k.partial_tokens_reused;
            sum.blend_tokens_reused += k.blend_tokens_reused;
            sum.blend_tokens_recomputed += k.blend_tokens_recomputed;
            sum.prompt_tokens_computed += k.prompt_tokens_computed;
            sum.prompt_blocks += k.prompt_blocks;
            sum.blocks_from_memory += k.blocks_from_memory;
            sum.blocks_from_disk += k.blocks_from_disk;
            sum.blocks_corrupt += k.blocks_corrupt;
            sum.disk_blocks += k.disk_blocks;
            sum.disk_bytes += k.disk_bytes;
            sum.memory_bytes = k.memory_bytes;
        }
        sum.block_hit_rate = hit_rate(&sum);
        out.push(summarize("*".into(), &all, total, sum));
    }
    out
}

pub(crate) fn hit_rate(k: &KvStats) -> f64 {
    if k.prompt_blocks == 0 {
        0.0
    } else {
        (k.blocks_from_memory + k.blocks_from_disk) as f64 / k.prompt_blocks as f64
    }
}

/// KV reuse per tenant: `kv_requests` in the period, `kv_lineage` now.
fn kv_stats(conn: &Connection, filter: &StatsFilter, since: Option<&str>) -> Result<BTreeMap<String, KvStats>, StoreError> {
    let memory_bytes: i64 =
        conn.query_row("SELECT COALESCE((SELECT memory_bytes FROM kv_requests ORDER BY created_at DESC, inference_id DESC LIMIT 1), 0)", [], |r| r.get(0))?;
    let mut out: BTreeMap<String, KvStats> = BTreeMap::new();
    let mut stmt = conn.prepare(
        "SELECT tenant, COUNT(*), SUM(kv_tokens_reused), SUM(prompt_blocks), SUM(blocks_memory), SUM(blocks_disk), SUM(blocks_corrupt),
                SUM(partial_tokens), SUM(MAX(prompt_tokens - kv_tokens_reused, 0)), SUM(blend_tokens_reused), SUM(blend_tokens_recomputed)
         FROM kv_requests
         WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR created_at >= strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2))
         GROUP BY tenant",
    )?;
    let u = |v: i64| v.max(0) as u64;
    for row in stmt.query_map(rusqlite::params![filter.tenant, since], |r| {
        Ok((r.get::<_, String>(0)?, [r.get::<_, i64>(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?, r.get(9)?, r.get(10)?]))
    })? {
        let (tenant, v) = row?;
        let k = out.entry(tenant).or_default();
        (k.requests, k.kv_tokens_reused, k.prompt_blocks, k.blocks_from_memory, k.blocks_from_disk, k.blocks_corrupt) =
            (u(v[0]), u(v[1]), u(v[2]), u(v[3]), u(v[4]), u(v[5]));
        (k.partial_tokens_reused, k.prompt_tokens_computed) = (u(v[6]), u(v[7]));
        (k.blend_tokens_reused, k.blend_tokens_recomputed) = (u(v[8]), u(v[9]));
    }
    let mut stmt = conn.prepare("SELECT tenant, COUNT(*), COALESCE(SUM(size_bytes), 0) FROM kv_lineage WHERE ?1 IS NULL OR tenant = ?1 GROUP BY tenant")?;
    for row in stmt.query_map([&filter.tenant], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))? {
        let (tenant, blocks, bytes) = row?;
        let k = out.entry(tenant).or_default();
        (k.disk_blocks, k.disk_bytes) = (u(blocks), u(bytes));
    }
    for k in out.values_mut() {
        k.block_hit_rate = hit_rate(k);
        k.memory_bytes = u(memory_bytes);
    }
    Ok(out)
}

impl SqliteStore {
    /// Stats of one tenant.
    pub fn tenant_stats(&self, tenant: &str, since_seconds: Option<u64>) -> Result<Stats, StoreError> {
        let filter = StatsFilter { tenant: Some(tenant.to_string()), since_seconds };
        compute(&self.conn(), &filter)?
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Malformed("no stats row for the tenant".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::inferences::tests::sample;
    use crate::store::CacheMode;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!((percentile(&v, 0.5), percentile(&v, 0.95)), (10.0, 19.0));
        assert_eq!(percentile(&[3.0], 0.95), 3.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn stats_per_tenant_and_total() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = SqliteStore::open(dir.path().join("s.db")).expect("open");
        let src = s.record_inference(&sample("a", Some("k"), ServedFrom::Model, CacheMode::Auto)).expect("model");
        let mut hit = sample("a", Some("k"), ServedFrom::Exact, CacheMode::Auto);
        (hit.source_inference_id, hit.latency_ms, hit.tokens_computed, hit.tokens_reused) = (Some(src), 0.5, 0, 13);
        s.record_inference(&hit).expect("hit");
        s.record_inference(&sample("b", None, ServedFrom::Model, CacheMode::Bypass)).expect("b");

        let a = s.tenant_stats("a", None).expect("stats");
        assert_eq!((a.requests, a.tokens_saved, a.time_saved_ms), (2, 13, 3.0));
        let exact = &a.tiers[1];
        assert_eq!((exact.served_from, exact.requests, exact.hit_rate, exact.latency_p50_ms), (ServedFrom::Exact, 1, 0.5, 0.5));
        assert_eq!(s.tenant_stats("nobody", None).expect("stats").requests, 0);

        let all = compute(&s.conn(), &StatsFilter::default()).expect("all");
        let names: Vec<&str> = all.iter().map(|x| x.tenant.as_str()).collect();
        assert_eq!(names, ["a", "b", "*"]);
        assert_eq!(all[2].requests, 3);
        let recent = compute(&s.conn(), &StatsFilter { tenant: None, since_seconds: Some(3600) }).expect("recent");
        assert_eq!(recent[2].requests, 3);
    }
}

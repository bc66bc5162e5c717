//! `forge-cache stats`: what the caches saved, read straight from the database file (read-only,
//! safe while the service runs): requests and hit rate per tier and tenant, tokens computed and
//! reused, latency p50/p95 per tier, tokens and time saved, facts and reasoning chains.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use forge_cache::cache::trust::{semantic_stats, SemanticStats, TrustParams};
use forge_cache::store::{ReadOnlyStore, Stats, StatsFilter};

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The SQLite file, or a `postgres://` URL (the shared store of replicas).
    #[arg(long, default_value = super::DEFAULT_DB)]
    pub db: PathBuf,
    /// Only requests of the last DURATION: a number with s, m, h or d (e.g. 90s, 15m, 2h, 7d).
    #[arg(long, value_parser = parse_duration)]
    pub since: Option<u64>,
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// One JSON array of per-tenant objects (plus tenant "*" for all together), each with a
    /// `semantic` object (draft acceptance, TRUST evidence) when there is any.
    #[arg(long)]
    pub json: bool,
    /// The TRUST error bound to evaluate the evidence against (as `serve --trust-delta`).
    #[arg(long, default_value_t = TrustParams::default().delta)]
    pub trust_delta: f64,
}

/// `90s`, `15m`, `2h`, `7d` (a bare number is seconds) → seconds.
fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration like 90s, 15m, 2h or 7d"))?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use s, m, h or d")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too long"))
}

fn render(all: &[Stats]) -> String {
    let headers: Vec<String> =
        ["tenant", "served_from", "requests", "hit rate", "tokens computed", "tokens reused", "KV tokens reused", "p50 ms", "p95 ms"].map(String::from).to_vec();
    let mut rows = Vec::new();
    for s in all {
        for t in s.tiers.iter().filter(|t| t.requests > 0) {
            rows.push(vec![
                s.tenant.clone(),
                format!("{:?}", t.served_from).to_uppercase(),
                t.requests.to_string(),
                format!("{:.1}%", t.hit_rate * 100.0),
                t.tokens_computed.to_string(),
                t.tokens_reused.to_string(),
                t.kv_tokens_reused.to_string(),
                format!("{:.1}", t.latency_p50_ms),
                format!("{:.1}", t.latency_p95_ms),
            ]);
        }
    }
    let mut out = super::table(&headers, &rows, 40);
    out.push('\n');
    for s in all {
        out.push_str(&format!(
            "{}: {} requests, {} tokens saved, {:.1} s saved; {} live facts ({} degraded), {} reasoning chains\n",
            if s.tenant == "*" { "all tenants" } else { &s.tenant },
            s.requests,
            s.tokens_saved,
            s.time_saved_ms / 1e3,
            s.live_facts,
            s.degraded_facts,
            s.reasoning_chains
        ));
        let k = &s.kv;
        if k.requests > 0 || k.disk_blocks > 0 {
            out.push_str(&format!(
                "  KV blocks: {} tokens reused ({} from partial blocks), {} prompt tokens computed; block hit rate {:.1}% ({} of {} prompt blocks: {} from memory, {} from disk, {} corrupt and recomputed); \
                 {:.1} MiB in memory, {:.1} MiB on disk ({} blocks)\n",
                k.kv_tokens_reused,
                k.partial_tokens_reused,
                k.prompt_tokens_computed,
                k.block_hit_rate * 100.0,
                k.blocks_from_memory + k.blocks_from_disk,
                k.prompt_blocks,
                k.blocks_from_memory,
                k.blocks_from_disk,
                k.blocks_corrupt,
                k.memory_bytes as f64 / (1 << 20) as f64,
                k.disk_bytes as f64 / (1 << 20) as f64,
                k.disk_blocks
            ));
        }
        if k.blend_tokens_reused + k.blend_tokens_recomputed > 0 {
            out.push_str(&format!(
                "  BLEND: {} document tokens reused at other positions, {} recomputed ({:.1}%)\n",
                k.blend_tokens_reused,
                k.blend_tokens_recomputed,
                100.0 * k.blend_tokens_recomputed as f64 / (k.blend_tokens_reused + k.blend_tokens_recomputed) as f64
            ));
        }
    }
    out
}

/// Draft acceptance and TRUST's evidence per tenant.
fn render_semantic(all: &[SemanticStats], p: &TrustParams) -> String {
    let mut out = String::new();
    for s in all.iter().filter(|s| s.draft_tokens > 0 || s.checks > 0) {
        let name = if s.tenant == "*" { "all tenants" } else { &s.tenant };
        out.push_str(&format!(
            "{name}: draft tokens accepted {}/{} ({:.1}%); {} verified neighbour checks, {} exactly right; ",
            s.draft_accepted,
            s.draft_tokens,
            100.0 * s.draft_accepted as f64 / s.draft_tokens.max(1) as f64,
            s.checks,
            s.checks_correct
        ));
        match (s.trust_threshold, s.trust_false_hit_bound) {
            (Some(t), Some(b)) => out.push_str(&format!(
                "TRUST (delta {:.2}%) serves from similarity {t:.3}: {} wrong of {} checks there, false-hit rate <= {:.2}% ({:.0}% confidence)\n",
                p.delta * 100.0,
                s.trust_wrong,
                s.trust_outcomes,
                b * 100.0,
                100.0 * normal_cdf(p.z)
            )),
            _ => out.push_str(&format!("TRUST (delta {:.2}%): not enough evidence yet, requests are verified\n", p.delta * 100.0)),
        }
    }
    out
}

/// Φ(z) by the Abramowitz–Stegun erf approximation (for printing the confidence).
fn normal_cdf(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * (-x * x).exp();
    0.5 * (1.0 + y.copysign(x))
}

pub fn run(a: &StatsArgs) -> anyhow::Result<()> {
    let db = ReadOnlyStore::open(&a.db)?;
    let all = db.stats(&StatsFilter { tenant: a.tenant.clone(), since_seconds: a.since })?;
    let params = TrustParams { delta: a.trust_delta, ..TrustParams::default() };
    let evidence = db.semantic_evidence(a.tenant.as_deref())?;
    let semantic = semantic_stats(&evidence, a.tenant.is_none(), &params);
    if a.json {
        let mut rows = serde_json::to_value(&all)?;
        for row in rows.as_array_mut().into_iter().flatten() {
            let name = row["tenant"].as_str().unwrap_or_default().to_string();
            if let (Some(obj), Some(sem)) = (row.as_object_mut(), semantic.iter().find(|s| s.tenant == name)) {
                obj.insert("semantic".into(), serde_json::to_value(sem)?);
            }
        }
        println!("{}", serde_json::to_string(&rows)?);
    } else if all.is_empty() {
        bail!("no requests recorded in {} yet", a.db.display());
    } else {
        print!("{}", render(&all));
        print!("{}", render_semantic(&semantic, &params));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("15m"), Ok(900));
        assert_eq!(parse_duration("2h"), Ok(7200));
        assert_eq!(parse_duration("7d"), Ok(604800));
        assert!(parse_duration("2w").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}

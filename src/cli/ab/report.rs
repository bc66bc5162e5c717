//! The A/B report: per request, per arm, and the totals the issue asks for.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::svg::{Chart, Series};
use super::workload::Line;
use super::{Arm, Mode};
use forge_cache::store::stats::percentile;

#[derive(Debug, Serialize)]
pub struct Request {
    /// The workload line's prompt.
    pub prompt: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pair: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
    /// The cache-off arm's answer (None without an off arm).
    pub text_off: Option<String>,
    /// The cache-on arm's answer.
    pub text_on: String,
    /// Both arms succeeded with the same text (None without an off arm).
    pub identical: Option<bool>,
    /// The tier that served the cache-on request.
    pub served_from_on: String,
    /// Cache-off client latency, ms.
    pub latency_ms_off: Option<f64>,
    /// Cache-on client latency, ms.
    pub latency_ms_on: f64,
    /// Positions the model computed, cache off.
    pub tokens_computed_off: Option<u32>,
    /// Positions the model computed, cache on.
    pub tokens_computed_on: u32,
    /// Draft tokens offered, cache on.
    pub draft_tokens_on: u32,
    /// Draft tokens accepted, cache on.
    pub draft_accepted_on: u32,
    /// The similarity the server reported, cache on.
    pub similarity_on: f32,
}

#[derive(Debug, Serialize)]
pub struct ArmTotals {
    /// Requests run.
    pub requests: usize,
    /// The arm's wall time, s.
    pub wall_s: f64,
    /// Requests ÷ wall time.
    pub requests_per_s: f64,
    /// Client latency median, ms.
    pub latency_p50_ms: f64,
    /// Client latency 95th percentile, ms.
    pub latency_p95_ms: f64,
    /// Client latency 99th percentile, ms.
    pub latency_p99_ms: f64,
    /// Positions the model computed, summed over requests.
    pub tokens_computed: u64,
    /// Share of requests per served_from.
    pub hit_rates: BTreeMap<String, f64>,
    /// Client round-trip latency per served_from: (requests, p50 ms, p95 ms).
    pub latency_by_tier: BTreeMap<String, (usize, f64, f64)>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    /// The semantic mode of the cache-on arm.
    pub mode: Mode,
    /// The arms ran interleaved request by request (same load), not one after the other.
    pub interleaved: bool,
    /// Per workload line, both arms side by side.
    pub requests: Vec<Request>,
    /// The cache-off arm's totals (None without one).
    pub off: Option<ArmTotals>,
    /// The cache-on arm's totals.
    pub on: ArmTotals,
    /// Requests whose on-arm text equals the off-arm text (None without an off arm).
    pub identical: Option<usize>,
    /// on requests/s ÷ off requests/s.
    pub speedup: Option<f64>,
    /// Draft tokens offered in the cache-on arm.
    pub draft_tokens: u64,
    /// Draft tokens accepted in the cache-on arm.
    pub draft_accepted: u64,
    /// TRUST: served without the model, and of those, texts that differ from the off arm.
    pub trusted: usize,
    /// TRUST hits whose text differs from the off arm's (None without an off arm).
    pub false_hits: Option<usize>,
    /// TRUST: correct trusted hits ÷ (correct trusted hits + VERIFIED hits, i.e. requests whose
    /// neighbour's answer was exactly right but not trusted).
    pub trust_recall: Option<f64>,
    /// With pair labels (QQP): what the cache-on arm did with each pair's second question.
    pub pairs: Option<PairLabels>,
    /// Failed requests, both arms.
    pub failed: usize,
}

/// The label columns of a workload with pairs (`pair`, `duplicate`): each pair's second
/// question, served how, against the label. "Served" means served without decoding (EQUIVALENT
/// or TRUST).
#[derive(Debug, Serialize)]
pub struct PairLabels {
    /// Pairs labelled duplicate.
    pub duplicate_pairs: usize,
    /// Pairs labelled not duplicate.
    pub non_duplicate_pairs: usize,
    /// Duplicates whose second question was served without decoding ÷ duplicates.
    pub recall: f64,
    /// Duplicates whose second question was served without decoding.
    pub served_duplicates: usize,
    /// Non-duplicates whose second question was served without decoding ÷ non-duplicates.
    pub false_hit_rate: f64,
    /// Non-duplicates whose second question was served without decoding.
    pub false_hits: usize,
    /// Served requests: median of (cache-off latency ÷ cache-on latency), same request.
    pub served_speedup_p50: Option<f64>,
    /// Served requests' latency p50 (cache on) and the same requests' p50 with BYPASS, ms.
    pub served_latency_p50_ms: Option<f64>,
    /// Those requests' latency p50 in the cache-off (BYPASS) arm, ms.
    pub served_bypass_latency_p50_ms: Option<f64>,
    /// EQUIVALENT's check: median server time per scored token (prompt + answer) on served
    /// requests, and BYPASS's median prefill time per prompt token, ms.
    pub check_ms_per_token_p50: Option<f64>,
    /// BYPASS's median prefill time per prompt token, ms.
    pub bypass_prefill_ms_per_token_p50: Option<f64>,
}

fn pair_labels(lines: &[Line], off: Option<&Arm>, on: &Arm) -> Option<PairLabels> {
    if !lines.iter().any(|l| l.pair.is_some() && l.duplicate.is_some()) {
        return None;
    }
    let mut seen = std::collections::HashSet::new();
    let (mut dup, mut non, mut served_dup, mut false_hits) = (0, 0, 0, 0);
    let (mut ratios, mut lat_on, mut lat_off, mut check, mut prefill) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, l) in lines.iter().enumerate() {
        if let Some(o) = off.map(|a| &a.shots[i]).filter(|o| o.error.is_none() && o.prompt_tokens > 0 && o.prefill_ms > 0.0) {
            prefill.push(o.prefill_ms / o.prompt_tokens as f64);
        }
        let (Some(pair), Some(d)) = (l.pair, l.duplicate) else { continue };
        if seen.insert(pair) {
            continue; // the first question of its pair
        }
        let s = &on.shots[i];
        let hit = matches!(s.served_from.as_str(), "EQUIVALENT" | "TRUST");
        if d {
            dup += 1;
            served_dup += usize::from(hit);
        } else {
            non += 1;
            false_hits += usize::from(hit);
        }
        if hit {
            lat_on.push(s.latency_ms);
            check.push(s.prefill_ms / (s.prompt_tokens + s.completion_tokens).max(1) as f64);
            if let Some(o) = off.map(|a| &a.shots[i]).filter(|o| o.error.is_none()) {
                ratios.push(o.latency_ms / s.latency_ms.max(1e-9));
                lat_off.push(o.latency_ms);
            }
        }
    }
    let p50 = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| percentile(&v, 0.50))
    };
    Some(PairLabels {
        duplicate_pairs: dup,
        non_duplicate_pairs: non,
        recall: served_dup as f64 / dup.max(1) as f64,
        served_duplicates: served_dup,
        false_hit_rate: false_hits as f64 / non.max(1) as f64,
        false_hits,
        served_speedup_p50: p50(ratios),
        served_latency_p50_ms: p50(lat_on),
        served_bypass_latency_p50_ms: p50(lat_off),
        check_ms_per_token_p50: p50(check),
        bypass_prefill_ms_per_token_p50: p50(prefill),
    })
}

fn totals(arm: &Arm) -> ArmTotals {
    let mut lat: Vec<f64> = arm.shots.iter().map(|s| s.latency_ms).collect();
    lat.sort_by(f64::total_cmp);
    let n = arm.shots.len();
    let mut hit_rates = BTreeMap::new();
    for s in &arm.shots {
        *hit_rates.entry(s.served_from.clone()).or_insert(0.0) += 1.0 / n as f64;
    }
    let mut by_tier: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for s in &arm.shots {
        by_tier.entry(s.served_from.clone()).or_default().push(s.latency_ms);
    }
    let latency_by_tier = by_tier
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            (k, (v.len(), percentile(&v, 0.50), percentile(&v, 0.95)))
        })
        .collect();
    ArmTotals {
        latency_by_tier,
        requests: n,
        wall_s: arm.wall.as_secs_f64(),
        requests_per_s: n as f64 / arm.wall.as_secs_f64().max(1e-9),
        latency_p50_ms: percentile(&lat, 0.50),
        latency_p95_ms: percentile(&lat, 0.95),
        latency_p99_ms: percentile(&lat, 0.99),
        tokens_computed: arm.shots.iter().map(|s| s.tokens_computed as u64).sum(),
        hit_rates,
    }
}

impl Report {
    pub fn build(lines: &[Line], off: Option<&Arm>, on: &Arm, mode: Mode, interleaved: bool) -> Report {
        let requests: Vec<Request> = lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let (o, s) = (off.map(|a| &a.shots[i]), &on.shots[i]);
                Request {
                    prompt: l.prompt.clone(),
                    pair: l.pair,
                    duplicate: l.duplicate,
                    text_off: o.map(|o| o.text.clone()),
                    text_on: s.text.clone(),
                    identical: o.map(|o| o.error.is_none() && s.error.is_none() && o.text == s.text),
                    served_from_on: s.served_from.clone(),
                    latency_ms_off: o.map(|o| o.latency_ms),
                    latency_ms_on: s.latency_ms,
                    tokens_computed_off: o.map(|o| o.tokens_computed),
                    tokens_computed_on: s.tokens_computed,
                    draft_tokens_on: s.draft_tokens,
                    draft_accepted_on: s.draft_accepted,
                    similarity_on: s.similarity,
                }
            })
            .collect();
        let trusted = requests.iter().filter(|r| r.served_from_on == "TRUST").count();
        let false_hits = off.map(|_| requests.iter().filter(|r| r.served_from_on == "TRUST" && r.identical == Some(false)).count());
        let verified = requests.iter().filter(|r| r.served_from_on == "VERIFIED").count();
        let trust_recall = match (mode, false_hits) {
            (Mode::Trust, Some(f)) if trusted - f + verified > 0 => Some((trusted - f) as f64 / (trusted - f + verified) as f64),
            _ => None,
        };
        let offt = off.map(totals);
        let ont = totals(on);
        Report {
            mode,
            interleaved,
            identical: off.map(|_| requests.iter().filter(|r| r.identical == Some(true)).count()),
            speedup: offt.as_ref().map(|o| ont.requests_per_s / o.requests_per_s.max(1e-9)),
            draft_tokens: on.shots.iter().map(|s| s.draft_tokens as u64).sum(),
            draft_accepted: on.shots.iter().map(|s| s.draft_accepted as u64).sum(),
            failed: on.shots.iter().chain(off.iter().flat_map(|a| a.shots.iter())).filter(|s| s.error.is_some()).count(),
            requests,
            off: offt,
            on: ont,
            trusted,
            false_hits,
            trust_recall,
            pairs: pair_labels(lines, off, on),
        }
    }

    pub fn summary(&self) -> String {
        let mut s = String::new();
        let n = self.requests.len();
        let row = |s: &mut String, name: &str, t: &ArmTotals| {
            let _ = writeln!(
                s,
                "| {name} | {:.3} | {:.1} | {:.1} | {:.1} | {} | {:.1} |",
                t.requests_per_s, t.latency_p50_ms, t.latency_p95_ms, t.latency_p99_ms, t.tokens_computed, t.wall_s
            );
        };
        let how = if self.interleaved {
            "arms interleaved request by request (same load); wall s = sum of the arm's own request times"
        } else {
            "arms run one after the other"
        };
        let _ = writeln!(s, "{how}\n");
        let _ = writeln!(s, "| arm | requests/s | p50 ms | p95 ms | p99 ms | tokens computed | wall s |\n|---|---|---|---|---|---|---|");
        if let Some(o) = &self.off {
            row(&mut s, "cache off (BYPASS)", o);
        }
        row(&mut s, &format!("cache on ({:?})", self.mode).to_lowercase(), &self.on);
        let _ = writeln!(s);
        if let (Some(i), Some(x)) = (self.identical, self.speedup) {
            let _ = writeln!(s, "identical texts: {i}/{n} ({:.2}%)  |  speedup (requests/s on / off): {x:.2}x", 100.0 * i as f64 / n as f64);
        }
        let hits: Vec<String> = self.on.hit_rates.iter().map(|(k, v)| format!("{k} {:.1}%", v * 100.0)).collect();
        let _ = writeln!(s, "served from (cache on): {}", hits.join(", "));
        let tiers: Vec<String> =
            self.on.latency_by_tier.iter().map(|(k, (n, p50, p95))| format!("{k} (n={n}) p50 {p50:.2} / p95 {p95:.2}")).collect();
        let _ = writeln!(s, "latency by tier, ms (cache on, client round trip): {}", tiers.join(", "));
        let _ = writeln!(
            s,
            "draft tokens accepted: {}/{} ({:.1}%)",
            self.draft_accepted,
            self.draft_tokens,
            100.0 * self.draft_accepted as f64 / self.draft_tokens.max(1) as f64
        );
        if self.mode == Mode::Trust {
            let fh = self.false_hits.map_or("n/a (no off arm)".to_string(), |f| format!("{f}/{} ({:.2}%)", self.trusted, 100.0 * f as f64 / self.trusted.max(1) as f64));
            let _ = writeln!(s, "TRUST: served {} without the model; false hits {fh}; recall {}", self.trusted, self.trust_recall.map_or("n/a".into(), |r| format!("{:.1}%", r * 100.0)));
        }
        if let Some(p) = &self.pairs {
            let f = |x: Option<f64>| x.map_or("n/a".into(), |v| format!("{v:.3}"));
            let _ = writeln!(
                s,
                "pair labels (second questions): recall on duplicates {}/{} ({:.1}%), false hits on non-duplicates {}/{} ({:.2}%); \
                 served p50 {} ms vs BYPASS {} ms (per-request speedup p50 {}x); check ms/token {} vs BYPASS prefill ms/token {}",
                p.served_duplicates,
                p.duplicate_pairs,
                100.0 * p.recall,
                p.false_hits,
                p.non_duplicate_pairs,
                100.0 * p.false_hit_rate,
                f(p.served_latency_p50_ms),
                f(p.served_bypass_latency_p50_ms),
                f(p.served_speedup_p50),
                f(p.check_ms_per_token_p50),
                f(p.bypass_prefill_ms_per_token_p50)
            );
        }
        if self.failed > 0 {
            let _ = writeln!(s, "FAILED requests: {}", self.failed);
        }
        s
    }

    /// report.md, latency_cdf.svg, hit_rate.svg in `dir`.
    pub fn write_files(&self, dir: &Path, workload: &Path) -> anyhow::Result<()> {
        let cdf = |lat: Vec<f64>| -> Vec<(f64, f64)> {
            let mut l = lat;
            l.sort_by(f64::total_cmp);
            let n = l.len() as f64;
            l.iter().enumerate().map(|(i, &x)| (x, (i + 1) as f64 / n)).collect()
        };
        let mut series = Vec::new();
        if self.off.is_some() {
            series.push(Series { name: "cache off (BYPASS)", color: "#c0392b", points: cdf(self.requests.iter().filter_map(|r| r.latency_ms_off).collect()) });
        }
        series.push(Series { name: "cache on", color: "#2471a3", points: cdf(self.requests.iter().map(|r| r.latency_ms_on).collect()) });
        let latency = Chart { title: "Latency CDF (client round trip)", x_label: "latency, ms (log scale)", y_label: "share of requests", log_x: true, series };
        let mut hits = 0usize;
        let cumulative: Vec<(f64, f64)> = self
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                hits += usize::from(r.served_from_on != "MODEL" && r.served_from_on != "ERROR");
                ((i + 1) as f64, hits as f64 / (i + 1) as f64)
            })
            .collect();
        let hit = Chart {
            title: "Cumulative hit rate (cache on: any tier but MODEL)",
            x_label: "request",
            y_label: "hit rate",
            log_x: false,
            series: vec![Series { name: "cache on", color: "#2471a3", points: cumulative }],
        };
        std::fs::write(dir.join("latency_cdf.svg"), latency.render()).context("writing latency_cdf.svg")?;
        std::fs::write(dir.join("hit_rate.svg"), hit.render()).context("writing hit_rate.svg")?;
        let mut md = format!("# A/B report: cache off vs {:?}\n\nWorkload: `{}` ({} requests).\n\n", self.mode, workload.display(), self.requests.len())
            .replace("Verified", "verified")
            .replace("Trust", "trust")
            .replace("Exact", "exact");
        md.push_str(&self.summary());
        md.push_str("\n![latency CDF](latency_cdf.svg)\n\n![cumulative hit rate](hit_rate.svg)\n\n");
        let differing: Vec<&Request> = self.requests.iter().filter(|r| r.identical == Some(false)).take(20).collect();
        if !differing.is_empty() {
            md.push_str("## Requests whose texts differ\n\n| prompt | served from | off | on |\n|---|---|---|---|\n");
            for r in differing {
                let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ").chars().take(80).collect::<String>();
                let _ = writeln!(md, "| {} | {} | {} | {} |", cell(&r.prompt), r.served_from_on, cell(r.text_off.as_deref().unwrap_or("")), cell(&r.text_on));
            }
        }
        std::fs::write(dir.join("report.md"), md).context("writing report.md")?;
        Ok(())
    }
}

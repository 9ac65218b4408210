//! The campaign's table: one row per tier × scenario. Election rows are named
//! `election-…`; one whose tier has no elections shows `n/a` and why.

use std::fmt::Write;
use std::time::Duration;

use crate::run::Outcome;

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e3)
}

/// The `q` quantile of the measured durations, `-` if none, `never` if one never came.
fn quantile(values: &[Option<Duration>], q: f64) -> String {
    if values.is_empty() {
        return "-".into();
    }
    if values.iter().any(Option::is_none) {
        return "never".into();
    }
    let mut sorted: Vec<Duration> = values.iter().flatten().copied().collect();
    sorted.sort();
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    ms(sorted[i])
}

/// The Markdown table of `rows` (outcome, broken criteria).
pub fn markdown(rows: &[(Outcome, Vec<String>)]) -> String {
    let mut out = String::from(
        "| tier | scenario | grants | faults | overlaps (max ms) | stale refused / accepted | token regressions | foreign releases + extends | recovery p50 / p95 ms | lost-signal lag ms | leaked | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (o, broken) in rows {
        if let Some(why) = &o.not_applicable {
            let _ = writeln!(
                out,
                "| {} | {} | - | - | - | - | - | - | - | - | - | n/a: {why} |",
                o.tier, o.scenario
            );
            continue;
        }
        let v = &o.verdict;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} ({}) | {} / {} | {} | {} | {} / {} | {} | {} | {} |",
            o.tier,
            o.scenario,
            v.acquisitions,
            o.faults,
            v.overlaps,
            ms(v.overlap_max),
            v.stale_rejected,
            v.stale_accepted,
            v.token_regressions + v.token_duplicates,
            v.foreign_releases + v.foreign_extends,
            quantile(&v.recovery, 0.5),
            quantile(&v.recovery, 0.95),
            quantile(&v.lost_lag, 0.5),
            o.leaked,
            if broken.is_empty() {
                "ok".to_owned()
            } else {
                format!("FAIL: {}", broken.join("; "))
            },
        );
    }
    out
}

//! lockkit's fault-injection campaign (not published).
//!
//! Lock workers run as separate processes ([`worker`]), take a lock on one of the compose
//! tiers, write under it to a fenced resource, and record every step with the machine's
//! monotonic clock. A [`Scenario`] times a fault against them: a stopped or killed holder, a
//! partition or delay through a fault proxy, a stopped or killed server. The histories are
//! merged and checked ([`lockkit_core::testing::check`]), and [`expect::broken`] says which
//! of the tier's guarantees, if any, the run broke. The election rows
//! (`election-holder-pause`, `election-partition`, `election-server-crash`) time the same
//! faults against election candidates instead of lock takers, on every tier whose backend has
//! elections, and are judged as the lock rows they repeat; on a tier without elections
//! (Redlock) they show as not applicable. The semaphore and read-write lock rows
//! (`semaphore-` and `rwlock-holder-pause`, `-partition`, `-server-crash`) do the same with
//! permit takers of a semaphore of 2 whose other permit a companion holds throughout, and
//! with writers while a companion reads; `semaphore-contention` and `rwlock-contention`
//! check the merged history of 10,000 grants of 8 processes (never more than 3 holders of a
//! semaphore of 3; never a writer beside anyone). The checker judges each grant by its kind.
//!
//! `cargo run --release -p lockkit-campaign` runs every scenario on every tier whose servers
//! are up (`compose/campaign.sh` starts them first); `tests/smoke.rs` runs the subset CI
//! runs.

pub mod expect;
pub mod private;
pub mod random;
pub mod report;
pub mod run;
pub mod scenarios;
pub mod tiers;
pub mod worker;

pub use run::{Campaign, Outcome, Run};
pub use scenarios::Scenario;
pub use tiers::{Tier, Topology};
pub use worker::{Worker, WorkerSpec};

/// Why a scenario could not be carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CampaignError(pub String);

impl std::fmt::Display for CampaignError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CampaignError {}

impl From<lockkit::Error> for CampaignError {
    fn from(e: lockkit::Error) -> Self {
        CampaignError(e.to_string())
    }
}

/// Runs `scenarios` on every tier of `tiers` they apply to, one after the other, printing
/// progress on stderr; each outcome comes with the criteria it broke.
///
/// # Errors
/// When a scenario cannot be carried out.
pub async fn run_all(
    campaign: &Campaign,
    tiers: &[Tier],
    scenarios: &[Scenario],
) -> Result<Vec<(Outcome, Vec<String>)>, CampaignError> {
    let mut rows = Vec::new();
    for tier in tiers {
        for &scenario in scenarios {
            if !scenario.applies_to(tier.topology) {
                continue;
            }
            eprintln!("{} / {}...", tier.name(), scenario.name());
            let outcome = scenario.run(campaign, tier).await.map_err(|e| {
                CampaignError(format!("{} / {}: {e}", tier.name(), scenario.name()))
            })?;
            let broken = expect::broken(&outcome, tier.topology, scenario);
            eprintln!("  took {:.1} s", outcome.took.as_secs_f64());
            if !broken.is_empty() {
                eprintln!(
                    "  FAILED ({}): {:?}; histories in {}",
                    broken.join("; "),
                    outcome.verdict.violations,
                    outcome.dir.display()
                );
            }
            rows.push((outcome, broken));
        }
    }
    Ok(rows)
}

//! `lockkit-campaign`: the full fault-injection campaign, or one lock worker.
//!
//! ```sh
//! compose/up.sh all
//! cargo run --release -p lockkit-campaign -- [--tiers redis,etcd-3] [--scenarios partition] [--ttl-ms 2000]
//! cargo run --release -p lockkit-campaign -- --random 10m [--seed 42] [--tiers ...]
//! ```
//! Prints one Markdown row per tier × scenario (or per tier, for `--random`: see
//! `random.rs`); exits 1 if a run broke a guarantee its tier makes (see `expect.rs`), 2 if a
//! scenario could not be carried out.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lockkit_campaign::worker::{self, WorkerSpec};
use lockkit_campaign::{Campaign, Scenario, Tier, Topology, random, report, run_all};

#[derive(Debug, Parser)]
#[command(about = "lockkit's fault-injection campaign")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Tiers to run on (comma-separated names); all that are up by default.
    #[arg(long, value_delimiter = ',')]
    tiers: Vec<String>,
    /// Scenarios to run (comma-separated names); all by default.
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// The TTL of every lock, in milliseconds (at least 100).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(100..))]
    ttl_ms: u64,
    /// Where to keep the histories.
    #[arg(long, default_value = "target/campaign")]
    dir: PathBuf,
    /// Instead of the scenarios: the randomized campaign, for this long in all (`10m`, `90s`),
    /// shared equally by the tiers.
    #[arg(long, value_parser = humantime::parse_duration)]
    random: Option<Duration>,
    /// The seed of the randomized campaign's fault schedule (random by default; printed).
    #[arg(long)]
    seed: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One lock worker (started by the campaign itself).
    Worker(WorkerSpec),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Worker(spec)) = cli.command {
        return match worker::run(spec).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("worker: {e}");
                ExitCode::from(2)
            }
        };
    }
    let scenarios: Vec<Scenario> = if cli.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        let mut chosen = Vec::new();
        for name in &cli.scenarios {
            let Some(s) = Scenario::named(name) else {
                let known: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
                eprintln!("unknown scenario {name} (known: {})", known.join(", "));
                return ExitCode::from(2);
            };
            chosen.push(s);
        }
        chosen
    };
    if let Some(unknown) = cli
        .tiers
        .iter()
        .find(|name| !Topology::ALL.iter().any(|t| t.name() == name.as_str()))
    {
        let known: Vec<&str> = Topology::ALL.iter().map(|t| t.name()).collect();
        eprintln!("unknown tier {unknown} (known: {})", known.join(", "));
        return ExitCode::from(2);
    }
    let tiers: Vec<Tier> = Tier::available()
        .into_iter()
        .filter(|t| cli.tiers.is_empty() || cli.tiers.iter().any(|n| n == t.name()))
        .collect();
    let Ok(worker_exe) = std::env::current_exe() else {
        eprintln!("cannot find my own executable");
        return ExitCode::from(2);
    };
    let campaign = Campaign {
        worker_exe,
        dir: cli.dir,
        ttl: Duration::from_millis(cli.ttl_ms),
    };
    if let Some(total) = cli.random {
        return randomized(&campaign, &tiers, total, cli.seed).await;
    }
    match run_all(&campaign, &tiers, &scenarios).await {
        Ok(rows) => {
            println!("{}", report::markdown(&rows));
            if rows.iter().all(|(_, broken)| broken.is_empty()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

async fn randomized(
    campaign: &Campaign,
    tiers: &[Tier],
    total: Duration,
    seed: Option<u64>,
) -> ExitCode {
    let Some(share) = u32::try_from(tiers.len())
        .ok()
        .filter(|n| *n > 0)
        .map(|n| total / n)
    else {
        eprintln!("no tier is up");
        return ExitCode::from(2);
    };
    let plan = random::Plan {
        duration: share,
        seed: seed.unwrap_or_else(rand::random),
        break_fencing: false,
    };
    eprintln!(
        "randomized campaign: seed {}, {share:?} per tier (replay: --random {} --seed {})",
        plan.seed,
        humantime::format_duration(total),
        plan.seed
    );
    let mut rows = Vec::new();
    for tier in tiers {
        eprintln!("{} / random...", tier.name());
        match random::run_random(campaign, tier, &plan).await {
            Ok(row) => {
                let broken = row.broken();
                if !broken.is_empty() {
                    eprintln!(
                        "  FAILED ({}): {:?}; histories in {}",
                        broken.join("; "),
                        row.outcome.verdict.violations,
                        row.outcome.dir.display()
                    );
                }
                rows.push(row);
            }
            Err(e) => {
                eprintln!("{} / random: {e}", tier.name());
                return ExitCode::from(2);
            }
        }
    }
    println!("{}", random::markdown(&rows));
    if rows.iter().all(|row| row.broken().is_empty()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

//! `lockkit list` and `lockkit release --force`: what an operator needs to see and break
//! locks.

use std::collections::HashSet;
use std::io::{BufRead, Write};

use lockkit::{LockInfo, LockkitConfig};
use serde_json::json;

use crate::{Failure, connect, exit};

/// How many locks one page asks the backend for.
const PAGE: usize = 100;

fn info_json(name: &str, info: &LockInfo) -> serde_json::Value {
    json!({
        "key": name,
        "fencing_token": info.fencing_token.get(),
        "remaining_ttl_ms": info.remaining_ttl.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "waiters": info.waiters,
    })
}

fn info_text(info: &LockInfo) -> String {
    let mut text = format!("fencing token {}", info.fencing_token);
    if let Some(ttl) = info.remaining_ttl {
        text.push_str(&format!(", {ttl:?} left without renewal"));
    }
    if let Some(waiters) = info.waiters {
        text.push_str(&format!(", {waiters} waiting"));
    }
    text
}

/// Prints the held locks whose names start with `prefix`, a page at a time as they come
/// (JSON: one object per line), each once.
pub(crate) async fn list(config: &LockkitConfig, prefix: &str, json: bool) -> Result<u8, Failure> {
    let locks = connect(config).await?;
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = locks.list_page(prefix, cursor.as_deref(), PAGE).await?;
        for (key, info) in page.locks {
            if !seen.insert(key.name().to_owned()) {
                continue;
            }
            let line = if json {
                info_json(key.name(), &info).to_string()
            } else {
                format!("{}: held, {}", key.name(), info_text(&info))
            };
            let _ = writeln!(std::io::stdout().lock(), "{line}");
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if seen.is_empty() && !json {
        let _ = writeln!(
            std::io::stdout().lock(),
            "no locks held in namespace {} with names starting {prefix:?} ({} tier {})",
            config.namespace,
            config.backend,
            locks.tier()
        );
    }
    Ok(0)
}

/// The warning an operator reads before breaking a lock.
const CONSEQUENCES: &str = "the holder is not told: its guard reports the lock lost at its \
next renewal, and until then it may still act. A fencing token keeps it harmless only where \
the resource it writes to checks tokens.";

/// Breaks `key` after a confirmation (unless `yes`).
pub(crate) async fn force_release(
    config: &LockkitConfig,
    key: &str,
    yes: bool,
    json: bool,
) -> Result<u8, Failure> {
    let locks = connect(config).await?;
    let Some(info) = locks.inspect(key).await? else {
        if json {
            println!(
                "{}",
                json!({ "key": key, "was_held": false, "broken": false })
            );
        } else {
            println!("{key}: not held, nothing to break");
        }
        return Ok(0);
    };
    if !yes {
        eprint!(
            "Break the lock {key} ({})? Note that {CONSEQUENCES} [y/N] ",
            info_text(&info)
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        // Blocking is fine here: nothing else runs on this thread until the answer.
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            return Err(Failure {
                code: exit::DECLINED,
                message: format!("{key} not broken"),
            });
        }
    }
    let was_held = locks.force_release(key).await?;
    if json {
        println!(
            "{}",
            json!({
                "key": key,
                "was_held": was_held,
                "broken": was_held,
                "fencing_token": info.fencing_token.get(),
            })
        );
    } else if was_held {
        println!(
            "{key}: broken (it was held with fencing token {}); {CONSEQUENCES}",
            info.fencing_token
        );
    } else {
        println!("{key}: its holder released it meanwhile, nothing broken");
    }
    Ok(0)
}

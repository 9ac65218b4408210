//! Histories: what every lock worker, the fenced resource and the fault injector did, each
//! event stamped with the machine's monotonic clock so that the histories of separate
//! processes merge into one timeline.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Nanoseconds on the machine's monotonic clock (`CLOCK_MONOTONIC`): the same clock in every
/// process, never stepped by NTP, and running while a process is stopped.
///
/// # Panics
/// If the kernel refuses `CLOCK_MONOTONIC`, which Linux never does.
pub fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or_else(|e| panic!("CLOCK_MONOTONIC: {e}"));
    u64::try_from(now.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(now.tv_nsec()).unwrap_or(0)
}

/// One thing that happened, by whom, on which key, when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When, in [`monotonic_ns`].
    pub at_ns: u64,
    /// Who: a worker's name, `resource`, or `injector`.
    pub process: String,
    /// The lock key's name (empty for events about no key).
    pub key: String,
    /// What happened.
    #[serde(flatten)]
    pub what: What,
}

/// The kinds of [`Event`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum What {
    /// A worker asked for the lock.
    Invoke,
    /// The lock was granted with `token`, handed out with `remaining_ms` of validity.
    Granted {
        /// The grant's fencing token.
        token: u64,
        /// The validity the guard was handed out with
        /// ([`granted_validity`](crate::MutexGuard::granted_validity)).
        remaining_ms: u64,
        /// The floor it had to be handed over with: a tenth of what the backend can promise
        /// ([`validity_floor`](crate::backend::validity_floor)); 0 when not recorded.
        #[serde(default, skip_serializing_if = "is_zero")]
        floor_ms: u64,
        /// What was granted: the key's only holder (a mutex, a leadership; left out of the
        /// file), one of a semaphore's permits, a read or the write lock of a read-write lock.
        #[serde(default, skip_serializing_if = "GrantKind::is_exclusive")]
        kind: GrantKind,
    },
    /// The acquire failed (`error` is the error kind, or `timeout`).
    Failed {
        /// Why.
        error: String,
    },
    /// The guard's lost signal fired.
    Lost {
        /// The token of the grant that was lost.
        token: u64,
    },
    /// The worker checked that it still held the lock, and it did (the next step writes).
    Checked {
        /// The grant's token.
        token: u64,
    },
    /// The worker asked to extend its lease by hand; `outcome` is `ok`, or an error kind
    /// (`Lost` when the lease was no longer its own).
    Extended {
        /// The grant's token.
        token: u64,
        /// How it ended.
        outcome: String,
    },
    /// The worker asked to release.
    Release {
        /// The grant's token.
        token: u64,
    },
    /// The release answered: `outcome` is `ok` (this worker's record was deleted),
    /// `not_held` (nothing of this worker's was there, answered while the guard was still
    /// valid), `expired` (nothing was there, answered after the guard's validity ran out,
    /// so the lease's expiry explains it: a release slowed by a failover), or an error kind.
    Released {
        /// The grant's token.
        token: u64,
        /// How it ended.
        outcome: String,
    },
    /// The fenced resource stored a write made with `token`.
    Stored {
        /// The writer's token.
        token: u64,
    },
    /// The fenced resource refused a write made with `token`, older than `highest`.
    Refused {
        /// The writer's token.
        token: u64,
        /// The highest token the resource had seen for the key.
        highest: u64,
    },
    /// The injector started a fault; `target` names the worker it hits, if one.
    Fault {
        /// What was done, for the report.
        description: String,
        /// The worker the fault is aimed at (its lost signal should fire), if one.
        target: Option<String>,
    },
    /// The injector ended the faults.
    Heal,
    /// The injector killed the worker named by the event's `process` (SIGKILL).
    Killed,
}

/// What a grant of a key lets others hold beside it, for the checker
/// ([`check`](super::check::check)): a key's sections may overlap only as their kinds allow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantKind {
    /// Nobody: a mutex's guard, an election's leadership.
    #[default]
    Exclusive,
    /// Up to `permits - 1` other permits of the same semaphore.
    Permit {
        /// The semaphore's permits.
        permits: u32,
    },
    /// Any number of other readers, no writer.
    Read,
    /// Nobody, as [`GrantKind::Exclusive`].
    Write,
}

impl GrantKind {
    /// Whether it is [`GrantKind::Exclusive`] (the kind a history leaves unsaid).
    pub fn is_exclusive(&self) -> bool {
        *self == GrantKind::Exclusive
    }
}

/// Appends events to a history file, one JSON object per line, flushed as they come so that
/// a worker killed with SIGKILL leaves everything it recorded.
#[derive(Debug)]
pub struct HistoryWriter {
    file: File,
    process: String,
}

impl HistoryWriter {
    /// Creates (or truncates) the history file at `path` for `process`.
    ///
    /// # Errors
    /// When the file cannot be created.
    pub fn create(path: &Path, process: &str) -> io::Result<HistoryWriter> {
        Ok(HistoryWriter {
            file: File::create(path)?,
            process: process.to_owned(),
        })
    }

    /// Records `what` about `key`, now.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn record(&mut self, key: &str, what: What) -> io::Result<Event> {
        let event = Event {
            at_ns: monotonic_ns(),
            process: self.process.clone(),
            key: key.to_owned(),
            what,
        };
        let mut line = serde_json::to_string(&event).map_err(io::Error::other)?;
        line.push('\n');
        self.file.write_all(line.as_bytes())?;
        Ok(event)
    }
}

/// Reads a history file. A torn last line (its writer was killed mid-write) is ignored.
///
/// # Errors
/// When the file cannot be read or a complete line is not an event.
pub fn read_history(path: &Path) -> io::Result<Vec<Event>> {
    let lines: Vec<String> = BufReader::new(File::open(path)?)
        .lines()
        .collect::<io::Result<_>>()?;
    let last = lines.len().saturating_sub(1);
    let mut events = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(event) => events.push(event),
            Err(_) if i == last => {}
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}:{}: {e}", path.display(), i + 1),
                ));
            }
        }
    }
    Ok(events)
}

/// Merges histories into one timeline, ordered by time (stable for equal stamps).
pub fn merge(histories: impl IntoIterator<Item = Vec<Event>>) -> Vec<Event> {
    let mut all: Vec<Event> = histories.into_iter().flatten().collect();
    all.sort_by_key(|e| e.at_ns);
    all
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_ignores_a_torn_last_line() {
        let path = std::env::temp_dir().join(format!("lockkit-history-{}", std::process::id()));
        let mut writer = HistoryWriter::create(&path, "w1").expect("create");
        let first = writer.record("k", What::Invoke).expect("record");
        let second = writer
            .record(
                "k",
                What::Granted {
                    token: 3,
                    remaining_ms: 900,
                    floor_ms: 100,
                    kind: GrantKind::Permit { permits: 3 },
                },
            )
            .expect("record");
        assert!(second.at_ns >= first.at_ns);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"{\"at_ns\": 12"))
            .expect("tear");
        assert_eq!(read_history(&path).expect("read"), vec![first, second]);
        let _ = std::fs::remove_file(&path);
    }
}

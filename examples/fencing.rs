//! Why fencing tokens: a writer paused past its TTL wakes up believing it holds the lock and
//! writes; the storage, which remembers the highest token it has seen, rejects the write.
//!
//! ```sh
//! cargo run --example fencing                                        # in-process (memory)
//! cargo run --features redis --example fencing -- redis://127.0.0.1:6379
//! ```
//!
//! The pause is simulated by a writer whose lock is not renewed (as when a GC pause or
//! `SIGSTOP` freezes its process, renewal thread included) and that sleeps past the TTL.

use std::sync::Mutex;
use std::time::Duration;

use lockkit::{LockOptions, LockkitConfig};

/// Storage that accepts a write only with a token at least as high as any it has seen.
#[derive(Debug, Default)]
struct FencedStorage {
    highest_token: u64,
    value: String,
}

impl FencedStorage {
    fn write(&mut self, token: u64, value: &str) -> Result<(), String> {
        if token < self.highest_token {
            return Err(format!(
                "rejected: token {token} is older than {}",
                self.highest_token
            ));
        }
        self.highest_token = token;
        self.value = value.to_owned();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> lockkit::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    let mut config = LockkitConfig::from_url(&url)?;
    config.namespace = format!("fencing-{:08x}", rand::random::<u32>());
    let ttl = Duration::from_secs(2);
    config.lock = LockOptions::default().with_ttl(ttl);
    let b = lockkit::connect(&config).await?;
    let a = if config.backend == lockkit::BackendKind::Memory {
        b.clone()
    } else {
        lockkit::connect(&config).await?
    };
    let storage = Mutex::new(FencedStorage::default());
    let write = |token: u64, value: &str| {
        storage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .write(token, value)
    };

    let paused = a
        .mutex("ledger")?
        .with_options(LockOptions::default().with_ttl(ttl).with_auto_renew(false))
        .lock()
        .await?;
    let old_token = paused.fencing_token().get();
    println!(
        "A holds the lock with token {old_token}, reads the ledger, then pauses for {:?}",
        ttl * 2
    );
    tokio::time::sleep(ttl + ttl / 2).await;

    let b_guard = b.mutex("ledger")?.lock_timeout(ttl * 2).await?;
    let new_token = b_guard.fencing_token().get();
    println!("B got the lock after A's TTL ran out, token {new_token}");
    match write(new_token, "B's update") {
        Ok(()) => println!("B writes: accepted"),
        Err(e) => println!("B writes: {e}"),
    }
    tokio::time::sleep(ttl / 2).await;

    println!(
        "A wakes up; its guard says lost = {} (a careful writer checks this first)",
        paused.is_lost()
    );
    match write(old_token, "A's stale update") {
        Ok(()) => println!("A writes anyway: ACCEPTED, the storage is corrupted"),
        Err(e) => println!("A writes anyway: {e}"),
    }
    let final_value = storage
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .value
        .clone();
    println!("the ledger holds: {final_value:?}");
    b_guard.release().await?;
    drop(paused);
    if final_value != "B's update" {
        std::process::exit(1);
    }
    Ok(())
}

//! The conformance scenarios of read-write locks ([`RwLock`](crate::RwLock)): readers share
//! and a writer excludes everyone under contention, a write's fencing token above every
//! earlier grant's, a waiting writer that blocks new readers (so a stream of readers cannot
//! starve it), a crashed holder freed after its TTL, a writer that gave up (cancelled, timed
//! out, or only tried) leaving nothing that blocks readers, renewal past the TTL, and an
//! rwlock independent of the mutex and the semaphore of its name.
//!
//! On a backend without read-write locks, each scenario checks instead that
//! [`LockClient::rwlock`] refuses with `Unsupported` and says why.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::scenarios::{LONG_TTL, clients, expect_no_leftovers, namespace, options, patience};
use super::{Failure, Harness, Outcome};
use crate::backend::{AcquireRequest, Attempt, Hold};
use crate::client::LockClient;
use crate::error::ErrorKind;
use crate::rwlock::RwLock;
use crate::token::OwnerToken;

/// The read-write lock `name` of `client`, or `None` (after checking the refusal) where the
/// backend has none.
pub(super) fn rwlock(client: &LockClient, name: &str) -> Result<Option<RwLock>, Failure> {
    match client.rwlock(name) {
        Ok(rwlock) => {
            ensure!(
                client.capabilities().rwlock.is_supported(),
                "rwlock() succeeded on a backend whose capabilities deny read-write locks"
            );
            Ok(Some(rwlock))
        }
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            ensure!(
                !client.capabilities().rwlock.is_supported(),
                "rwlock() refused on a backend whose capabilities claim read-write locks: {e}"
            );
            ensure!(
                e.to_string().len() > "read-write locks are not supported: ".len() + 10,
                "the refusal does not say why: {e}"
            );
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Who is inside the sections of one rwlock, as the tasks of a scenario count themselves.
#[derive(Default)]
struct Inside {
    readers: AtomicUsize,
    writers: AtomicUsize,
    most_readers: AtomicUsize,
    /// The highest token of a grant that has left its section.
    highest_left: AtomicU64,
}

/// Tasks of several clients read and write one rwlock, two reads to each write: a writer is
/// never inside with anyone, and every write's token is above the tokens of all the grants
/// that left before it came in.
pub(super) async fn readers_share_and_a_writer_excludes_everyone(h: &dyn Harness) -> Outcome {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 3;
    const ROUNDS: usize = 9;
    let ns = namespace();
    let clients = clients(h, &ns, CLIENTS).await?;
    if rwlock(&clients[0], "table")?.is_none() {
        return Ok(());
    }
    let inside = Arc::new(Inside::default());
    let mut tasks = tokio::task::JoinSet::<Result<(), Failure>>::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..TASKS_PER_CLIENT {
            let table = client.rwlock("table")?;
            let (inside, patience) = (inside.clone(), patience(h));
            tasks.spawn(async move {
                for round in 0..ROUNDS {
                    if (c + t + round).is_multiple_of(3) {
                        let guard = table.write_timeout(patience).await?;
                        let token = guard.fencing_token().get();
                        let writers = inside.writers.fetch_add(1, Ordering::SeqCst) + 1;
                        let readers = inside.readers.load(Ordering::SeqCst);
                        ensure!(
                            writers == 1 && readers == 0,
                            "a writer was inside with {} other writers and {readers} readers",
                            writers - 1
                        );
                        let highest = inside.highest_left.load(Ordering::SeqCst);
                        ensure!(
                            token > highest,
                            "a write was granted token {token}, not above {highest} of a grant that left before it"
                        );
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        inside.highest_left.fetch_max(token, Ordering::SeqCst);
                        inside.writers.fetch_sub(1, Ordering::SeqCst);
                        ensure!(guard.release().await?, "a write lock's release was refused");
                    } else {
                        let guard = table.read_timeout(patience).await?;
                        let readers = inside.readers.fetch_add(1, Ordering::SeqCst) + 1;
                        inside.most_readers.fetch_max(readers, Ordering::SeqCst);
                        let writers = inside.writers.load(Ordering::SeqCst);
                        ensure!(writers == 0, "a reader was inside with a writer");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        inside
                            .highest_left
                            .fetch_max(guard.fencing_token().get(), Ordering::SeqCst);
                        inside.readers.fetch_sub(1, Ordering::SeqCst);
                        ensure!(guard.release().await?, "a read lock's release was refused");
                    }
                }
                Ok(())
            });
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| Failure(format!("a task panicked: {e}")))??;
    }
    expect_no_leftovers(h, &ns).await
}

/// Three clients hold read locks at once; a writer cannot get in while they do, and gets in
/// once they are gone; while it holds, nobody reads.
pub(super) async fn readers_share_until_a_writer_comes(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 4).await?;
    if rwlock(&clients[0], "share")?.is_none() {
        return Ok(());
    }
    let mut readers = Vec::new();
    for client in &clients[..3] {
        match client.rwlock("share")?.try_read().await? {
            Some(guard) => readers.push(guard),
            None => return Err(Failure("a reader was refused beside other readers".into())),
        }
    }
    let writer = clients[3].rwlock("share")?;
    ensure!(
        writer.try_write().await?.is_none(),
        "a writer was granted beside three readers"
    );
    let highest = readers.iter().map(|r| r.fencing_token()).max();
    for reader in readers {
        ensure!(reader.release().await?, "a read lock's release was refused");
    }
    let Some(written) = writer.try_write().await? else {
        return Err(Failure(
            "the writer was refused after every reader left".into(),
        ));
    };
    ensure!(
        Some(written.fencing_token()) > highest,
        "the write's token is not above the readers' tokens"
    );
    ensure!(
        clients[0].rwlock("share")?.try_read().await?.is_none(),
        "a reader was granted beside a writer"
    );
    ensure!(
        written.release().await?,
        "a write lock's release was refused"
    );
    expect_no_leftovers(h, &ns).await
}

/// Polls `until` every 20 ms for at most `patience`; whether it came true.
async fn eventually<F, Fut>(patience: Duration, mut until: F) -> Result<bool, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, Failure>>,
{
    let deadline = Instant::now() + patience;
    loop {
        if until().await? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// While a reader holds, a writer waits, and from then on new readers wait too: the writer
/// goes first when the reader leaves (long before any TTL, a minute here), then the reader
/// that came after it.
pub(super) async fn a_waiting_writer_blocks_new_readers(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 4).await?;
    let Some(first) = rwlock(&clients[0], "writer-first")? else {
        return Ok(());
    };
    let first = first.with_ttl(LONG_TTL)?;
    let reading = first.read_timeout(patience(h)).await?;
    let writer = clients[1].rwlock("writer-first")?.with_ttl(LONG_TTL)?;
    let patience = patience(h);
    let writing = tokio::spawn(async move {
        let guard = writer.write_timeout(patience).await;
        (guard, Instant::now())
    });
    let probe = clients[2].rwlock("writer-first")?;
    let blocked = eventually(patience, || async {
        match probe.try_read().await? {
            Some(guard) => {
                guard.release().await?;
                Ok(false)
            }
            None => Ok(true),
        }
    })
    .await?;
    ensure!(blocked, "a waiting writer did not keep new readers out");
    let late_reader = clients[3].rwlock("writer-first")?.with_ttl(LONG_TTL)?;
    let late = tokio::spawn(async move {
        let guard = late_reader.read_timeout(patience).await;
        (guard, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !writing.is_finished() && !late.is_finished(),
        "the writer or the reader behind it was granted while a reader held"
    );
    let read_token = reading.fencing_token();
    let released_at = Instant::now();
    ensure!(
        reading.release().await?,
        "a read lock's release was refused"
    );
    let (written, written_at) = writing
        .await
        .map_err(|e| Failure(format!("the writer panicked: {e}")))?;
    let written = written.map_err(|e| {
        Failure(format!(
            "the writer was not granted after the reader left: {}",
            e.display_chain()
        ))
    })?;
    ensure!(
        written_at >= released_at,
        "the writer was granted before the reader left"
    );
    ensure!(
        written.fencing_token() > read_token,
        "the write's token is not above the earlier read's"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    ensure!(
        !late.is_finished(),
        "the reader behind the writer was granted while the writer held"
    );
    let write_released_at = Instant::now();
    ensure!(
        written.release().await?,
        "a write lock's release was refused"
    );
    let (read_again, read_at) = late
        .await
        .map_err(|e| Failure(format!("the late reader panicked: {e}")))?;
    let read_again = read_again.map_err(|e| {
        Failure(format!(
            "the reader behind the writer was not granted after it: {}",
            e.display_chain()
        ))
    })?;
    ensure!(
        read_at >= write_released_at,
        "the late reader was granted before the writer left"
    );
    ensure!(
        read_again.release().await?,
        "a read lock's release was refused"
    );
    expect_no_leftovers(h, &ns).await
}

/// Four readers take turns so that one of them always holds the lock; a writer that comes
/// while they do is still granted, and nobody reads while it writes.
pub(super) async fn a_stream_of_readers_does_not_starve_a_writer(h: &dyn Harness) -> Outcome {
    const READERS: usize = 4;
    let ns = namespace();
    let clients = clients(h, &ns, READERS + 1).await?;
    if rwlock(&clients[0], "stream")?.is_none() {
        return Ok(());
    }
    let inside = Arc::new(Inside::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let mut readers = tokio::task::JoinSet::<Result<usize, Failure>>::new();
    for (i, client) in clients[..READERS].iter().enumerate() {
        let lock = client.rwlock("stream")?;
        let (inside, stop, patience) = (inside.clone(), stop.clone(), patience(h));
        readers.spawn(async move {
            tokio::time::sleep(Duration::from_millis(15 * i as u64)).await;
            let mut reads = 0;
            while !stop.is_cancelled() {
                let guard = lock.read_timeout(patience).await?;
                inside.readers.fetch_add(1, Ordering::SeqCst);
                ensure!(
                    inside.writers.load(Ordering::SeqCst) == 0,
                    "a reader was inside with a writer"
                );
                tokio::time::sleep(Duration::from_millis(60)).await;
                inside.readers.fetch_sub(1, Ordering::SeqCst);
                guard.release().await?;
                reads += 1;
            }
            Ok(reads)
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writer = clients[READERS].rwlock("stream")?;
    let written = writer.write_timeout(patience(h)).await.map_err(|e| {
        Failure(format!(
            "a writer starved behind a stream of readers: {}",
            e.display_chain()
        ))
    });
    let outcome = match written {
        Ok(guard) => {
            inside.writers.fetch_add(1, Ordering::SeqCst);
            let readers_inside = inside.readers.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            inside.writers.fetch_sub(1, Ordering::SeqCst);
            let released = guard.release().await;
            if readers_inside != 0 {
                Err(Failure(format!(
                    "{readers_inside} readers were inside when the writer came in"
                )))
            } else {
                released.map(|_| ()).map_err(Failure::from)
            }
        }
        Err(e) => Err(e),
    };
    stop.cancel();
    let mut reads = 0;
    while let Some(joined) = readers.join_next().await {
        reads += joined.map_err(|e| Failure(format!("a reader panicked: {e}")))??;
    }
    outcome?;
    ensure!(reads >= READERS, "the readers read only {reads} times");
    expect_no_leftovers(h, &ns).await
}

/// A client that took a read lock and crashed (nothing released, nothing renewed) keeps a
/// writer out for about its TTL; then the writer gets in.
pub(super) async fn a_crashed_reader_frees_the_lock_after_its_ttl(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let crashed = h.client(&ns, options(h)).await?;
    if rwlock(&crashed, "crash")?.is_none() {
        return Ok(());
    }
    let key = crashed.key("crash")?;
    let granted_at = Instant::now();
    let request =
        AcquireRequest::new(key, OwnerToken::generate()?, h.ttl(), false).with_hold(Hold::Read);
    let Attempt::Granted(_) = crashed.backend().try_acquire(&request).await? else {
        return Err(Failure(
            "a read lock of a fresh rwlock was contended".into(),
        ));
    };
    h.crash(crashed).await;
    let next = h.client(&ns, options(h)).await?;
    let written = next.rwlock("crash")?.write_timeout(patience(h)).await?;
    let blocked_for = granted_at.elapsed();
    ensure!(
        blocked_for >= h.ttl() / 2,
        "the crashed reader's lock was free after {blocked_for:?}, before its TTL of {:?}",
        h.ttl()
    );
    ensure!(written.release().await?, "release after expiry refused");
    expect_no_leftovers(h, &ns).await
}

/// While a reader holds (a minute's TTL everywhere), writers that only try, that time out,
/// and that are cut at points spread over a round trip give up: none of them keeps new
/// readers out afterwards (long before a TTL), and nothing of them is left.
pub(super) async fn a_writer_that_gave_up_does_not_block_readers(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 3).await?;
    let Some(first) = rwlock(&clients[0], "gave-up")? else {
        return Ok(());
    };
    let reading = first.with_ttl(LONG_TTL)?.read_timeout(patience(h)).await?;
    let writer = clients[1].rwlock("gave-up")?.with_ttl(LONG_TTL)?;
    ensure!(
        writer.try_write().await?.is_none(),
        "a writer was granted beside a reader"
    );
    let timed_out = writer.write_timeout(Duration::from_millis(200)).await;
    ensure!(
        matches!(&timed_out, Err(e) if e.kind() == ErrorKind::Timeout),
        "a write beside a reader did not time out: {timed_out:?}"
    );
    for round in 0..10u64 {
        let cut_after = Duration::from_micros(round * 700);
        let _ = tokio::time::timeout(cut_after, writer.write()).await;
    }
    let reader = clients[2].rwlock("gave-up")?;
    let admitted = eventually(Duration::from_secs(10), || async {
        match reader.try_read().await? {
            Some(guard) => {
                guard.release().await?;
                Ok(true)
            }
            None => Ok(false),
        }
    })
    .await?;
    ensure!(
        admitted,
        "writers that gave up kept readers out for 10 s (their TTL is a minute)"
    );
    ensure!(
        reading.release().await?,
        "a read lock's release was refused"
    );
    clients[1].close().await;
    expect_no_leftovers(h, &ns).await
}

/// A write lock held for three TTLs is renewed in the background: nobody reads or writes,
/// and the server still counts it.
pub(super) async fn renewal_keeps_a_write_lock_past_its_ttl(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let Some(lock) = rwlock(&clients[0], "renew")? else {
        return Ok(());
    };
    let written = lock.write_timeout(patience(h)).await?;
    let other = clients[1].rwlock("renew")?;
    let until = Instant::now() + h.ttl() * 3;
    while Instant::now() < until {
        ensure!(
            other.try_read().await?.is_none(),
            "a renewed write lock let a reader in"
        );
        ensure!(
            other.try_write().await?.is_none(),
            "a renewed write lock let a writer in"
        );
        tokio::time::sleep(h.ttl() / 2).await;
    }
    ensure!(
        !written.is_lost(),
        "a renewed write lock reports itself lost"
    );
    ensure!(
        written.is_held().await?,
        "the server no longer counts a renewed write lock"
    );
    ensure!(
        written.release().await?,
        "a write lock's release was refused"
    );
    expect_no_leftovers(h, &ns).await
}

/// The rwlock, the mutex and the semaphore of one name do not block each other.
pub(super) async fn an_rwlock_is_independent_of_the_mutex_and_semaphore_of_its_name(
    h: &dyn Harness,
) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let Some(lock) = rwlock(&clients[0], "shared-name")? else {
        return Ok(());
    };
    let locked = clients[1]
        .mutex("shared-name")?
        .lock_timeout(patience(h))
        .await?;
    let permit = match clients[1].semaphore("shared-name", 1) {
        Ok(semaphore) => Some(semaphore.acquire_timeout(patience(h)).await?),
        Err(e) if e.kind() == ErrorKind::Unsupported => None,
        Err(e) => return Err(e.into()),
    };
    let Some(written) = lock.try_write().await? else {
        return Err(Failure(
            "the mutex or the semaphore of the same name blocked the rwlock".into(),
        ));
    };
    ensure!(locked.release().await?, "the mutex's release was refused");
    let Some(relocked) = clients[1].mutex("shared-name")?.try_lock().await? else {
        return Err(Failure(
            "the rwlock of the same name blocked the mutex".into(),
        ));
    };
    ensure!(relocked.release().await?, "the mutex's release was refused");
    if let Some(permit) = permit {
        ensure!(permit.release().await?, "a permit's release was refused");
        let Some(again) = clients[1]
            .semaphore("shared-name", 1)?
            .try_acquire()
            .await?
        else {
            return Err(Failure(
                "the rwlock of the same name blocked the semaphore".into(),
            ));
        };
        ensure!(again.release().await?, "a permit's release was refused");
    }
    ensure!(
        written.release().await?,
        "a write lock's release was refused"
    );
    expect_no_leftovers(h, &ns).await
}

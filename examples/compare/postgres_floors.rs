//! What the suite does by hand on PostgreSQL, with tokio-postgres directly (the client crate
//! lockkit-postgres is built on, re-exported as `lockkit::postgres::tokio_postgres`): the two
//! raw floors, and W2's counter. All of it lives in a schema of its own, [`SCHEMA`] (made on
//! first use), never in lockkit's: lease rows and counters are deleted at the end of a run,
//! the schema and its two tables stay for the next one (`DROP SCHEMA lockkit_compare CASCADE`
//! removes them).
//!
//! - [`Advisory`], the advisory-lock floor: the session-level advisory locks most PostgreSQL
//!   lock libraries use, over one connection per worker. W1: `pg_try_advisory_lock` (the key
//!   is the run's own, so a refusal is an error, as in the other W1 floors) and
//!   `pg_advisory_unlock`; W2: `pg_advisory_lock`, which waits in the server's lock manager
//!   until the holder's `pg_advisory_unlock` wakes it. Nothing is written: no row, no WAL, no
//!   fsync, and none of what lockkit keeps (a TTL, a fencing token, grants that outlive a
//!   restart or the session; lockkit-postgres's README says why it keeps rows). The keys are
//!   of the two-`int4` form, class [`ADVISORY_CLASS`]: a key space apart from the one-`bigint`
//!   keys lockkit's attempts lock.
//! - [`Lease`], the lease floor: a row per held key in [`LEASES`] with its owner and expiry on
//!   the server's clock. Acquire is one `INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE
//!   t.expires_at < clock_timestamp() RETURNING owner` (granted when it returns the row: the key
//!   was free or its lease had expired), release a `DELETE` of the key's row if it is still
//!   ours. Both commit with the server's defaults (`synchronous_commit = on` here: each waits
//!   for its WAL flush; lockkit's releases do not wait). A contended acquire polls: it tries
//!   again after a random pause in [`LEASE_RETRY`], the Redlock floor's pause, as a client of
//!   a lease table without notifications does (etcd's and ZooKeeper's floors wait on the
//!   server, which a plain table cannot; waking waiters with `LISTEN`/`NOTIFY` is what lockkit
//!   adds). A refused attempt is not free: `ON CONFLICT DO UPDATE` locks the row even when its
//!   `WHERE` refuses, so it commits (and flushes) a transaction too.
//! - [`Counter`], W2's protected value: a row per counter in [`COUNTERS`], read with a
//!   `SELECT` and written with an `UPDATE` to the value read plus one (not `v = v + 1`, which
//!   the server would apply atomically: an overlap of two holders must show as a lost update,
//!   as it does with GET/SET on Redis).
//!
//! Every statement is prepared once per connection before it is timed, so each one costs a
//! round trip, as each of lockkit's does.

use std::time::Duration;

use lockkit::postgres::tokio_postgres::config::TargetSessionAttrs;
use lockkit::postgres::tokio_postgres::error::SqlState;
use lockkit::postgres::tokio_postgres::{Client, Config, NoTls, Statement};

use crate::floors::BoxError;

/// The schema of the suite's own tables on PostgreSQL.
pub(crate) const SCHEMA: &str = "lockkit_compare";
/// The lease floor's table: `(key text primary key, owner text, expires_at timestamptz)`.
pub(crate) const LEASES: &str = "lockkit_compare.floor_leases";
/// W2's counters: `(name text primary key, v bigint)`.
pub(crate) const COUNTERS: &str = "lockkit_compare.counters";
/// The class (first `int4`) of the advisory-lock floor's keys.
pub(crate) const ADVISORY_CLASS: i32 = 0x6c6b_6366;
/// How long a lease floor waiter pauses before it tries again: uniform in this range.
pub(crate) const LEASE_RETRY: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_millis(10));
/// The lease floor's TTL, as lockkit's default and the other floors'.
const LEASE_TTL_MS: i64 = 10_000;

/// The connection settings of a `postgres://` URL, as lockkit reads it (its hosts, user,
/// password and database), for the floors' own connections: plain text only, to the first
/// host that accepts writes.
///
/// # Errors
/// A URL lockkit refuses, or one that asks for TLS.
pub(crate) fn config(url: &str) -> Result<Config, BoxError> {
    let lockkit = lockkit::postgres::PostgresConfig::from_url(url)?;
    if lockkit.tls {
        return Err("the PostgreSQL floors connect in plain text only, not over TLS".into());
    }
    let mut config = Config::new();
    for host in &lockkit.hosts {
        let (name, port) = host
            .rsplit_once(':')
            .ok_or_else(|| format!("host {host:?} is not a host:port"))?;
        config
            .host(name.trim_start_matches('[').trim_end_matches(']'))
            .port(port.parse()?);
    }
    config
        .dbname(&lockkit.dbname)
        .user(&lockkit.user)
        .connect_timeout(lockkit.connect_timeout)
        .target_session_attrs(TargetSessionAttrs::ReadWrite)
        .application_name("lockkit-compare");
    if let Some(password) = &lockkit.password {
        config.password(password);
    }
    Ok(config)
}

/// A connection of its own; its I/O is driven by a task of its own until the client is
/// dropped (an error there reaches the client's next statement).
async fn connect(config: &Config) -> Result<Client, BoxError> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Creates [`SCHEMA`] and its tables if missing. Two runs creating them at once can collide
/// on the catalog's unique index; the loser tries again and finds them.
async fn create_schema(client: &Client) -> Result<(), BoxError> {
    let ddl = format!(
        "CREATE SCHEMA IF NOT EXISTS {SCHEMA};
         CREATE TABLE IF NOT EXISTS {LEASES} (
             key text PRIMARY KEY, owner text NOT NULL, expires_at timestamptz NOT NULL);
         CREATE TABLE IF NOT EXISTS {COUNTERS} (name text PRIMARY KEY, v bigint NOT NULL);"
    );
    let mut attempts = 0;
    loop {
        attempts += 1;
        match client.batch_execute(&ddl).await {
            Ok(()) => return Ok(()),
            Err(e) if attempts < 3 && e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// A fresh advisory-lock key in the floor's class, for one run of a floor.
pub(crate) fn advisory_key() -> i32 {
    rand::random()
}

/// One connection of the advisory-lock floor, on its key.
pub(crate) struct Advisory {
    client: Client,
    try_lock: Statement,
    lock: Statement,
    unlock: Statement,
    key: i32,
}

impl Advisory {
    /// A connection with its statements prepared, for the advisory lock `key`.
    pub(crate) async fn connect(config: &Config, key: i32) -> Result<Advisory, BoxError> {
        let client = connect(config).await?;
        let try_lock = client
            .prepare("SELECT pg_try_advisory_lock($1::int4, $2::int4)")
            .await?;
        let lock = client
            .prepare("SELECT pg_advisory_lock($1::int4, $2::int4)")
            .await?;
        let unlock = client
            .prepare("SELECT pg_advisory_unlock($1::int4, $2::int4)")
            .await?;
        Ok(Advisory {
            client,
            try_lock,
            lock,
            unlock,
            key,
        })
    }

    /// W1's cycle: `pg_try_advisory_lock`, which must grant, then `pg_advisory_unlock`.
    pub(crate) async fn cycle(&mut self) -> Result<(), BoxError> {
        let row = self
            .client
            .query_one(&self.try_lock, &[&ADVISORY_CLASS, &self.key])
            .await?;
        if !row.try_get::<_, bool>(0)? {
            return Err("the floor's advisory lock was taken".into());
        }
        self.unlock().await
    }

    /// Takes the lock, waiting in the server as long as it takes.
    pub(crate) async fn lock(&mut self) -> Result<(), BoxError> {
        self.client
            .query_one(&self.lock, &[&ADVISORY_CLASS, &self.key])
            .await?;
        Ok(())
    }

    /// Releases the lock this session holds.
    pub(crate) async fn unlock(&mut self) -> Result<(), BoxError> {
        let row = self
            .client
            .query_one(&self.unlock, &[&ADVISORY_CLASS, &self.key])
            .await?;
        if !row.try_get::<_, bool>(0)? {
            return Err("the floor's advisory lock was not held at release".into());
        }
        Ok(())
    }
}

/// One connection of the lease floor, on its key, and the owner of the lease it holds.
pub(crate) struct Lease {
    client: Client,
    acquire: Statement,
    release: Statement,
    key: String,
    held: Option<String>,
}

impl Lease {
    /// A connection with its statements prepared, for the lease of `key` (the table is
    /// created if missing).
    pub(crate) async fn connect(config: &Config, key: &str) -> Result<Lease, BoxError> {
        let client = connect(config).await?;
        create_schema(&client).await?;
        let acquire = client
            .prepare(&format!(
                "INSERT INTO {LEASES} AS t (key, owner, expires_at)
                 VALUES ($1, $2, clock_timestamp() + $3::bigint * interval '1 millisecond')
                 ON CONFLICT (key) DO UPDATE
                     SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
                     WHERE t.expires_at < clock_timestamp()
                 RETURNING owner"
            ))
            .await?;
        let release = client
            .prepare(&format!(
                "DELETE FROM {LEASES} WHERE key = $1 AND owner = $2"
            ))
            .await?;
        Ok(Lease {
            client,
            acquire,
            release,
            key: key.to_owned(),
            held: None,
        })
    }

    /// One attempt for a new owner: whether it was granted (then it is held).
    async fn try_acquire(&mut self, owner: &str) -> Result<bool, BoxError> {
        let granted = self
            .client
            .query_opt(&self.acquire, &[&self.key, &owner, &LEASE_TTL_MS])
            .await?
            .is_some();
        if granted {
            self.held = Some(owner.to_owned());
        }
        Ok(granted)
    }

    /// W1's cycle: an acquire, which must grant, then the release.
    pub(crate) async fn cycle(&mut self) -> Result<(), BoxError> {
        let owner = lockkit_core::backend::OwnerToken::generate()?.expose_hex();
        if !self.try_acquire(&owner).await? {
            return Err("the floor's lease was taken".into());
        }
        self.unlock().await
    }

    /// Takes the lease, polling after a pause in [`LEASE_RETRY`] while another holds it.
    pub(crate) async fn lock(&mut self) -> Result<(), BoxError> {
        let owner = lockkit_core::backend::OwnerToken::generate()?.expose_hex();
        while !self.try_acquire(&owner).await? {
            let pause =
                LEASE_RETRY.0 + (LEASE_RETRY.1 - LEASE_RETRY.0).mul_f64(rand::random::<f64>());
            tokio::time::sleep(pause).await;
        }
        Ok(())
    }

    /// Deletes the lease taken by [`Lease::lock`], which must still be ours.
    pub(crate) async fn unlock(&mut self) -> Result<(), BoxError> {
        let owner = self.held.take().ok_or("not held")?;
        let deleted = self
            .client
            .execute(&self.release, &[&self.key, &owner])
            .await?;
        if deleted != 1 {
            return Err("the floor's lease was gone at release".into());
        }
        Ok(())
    }

    /// Deletes the rows of its key (a floor leaves none, unless it failed).
    pub(crate) async fn clean_up(self) {
        let _ = self
            .client
            .execute(
                &format!("DELETE FROM {LEASES} WHERE key = $1"),
                &[&self.key],
            )
            .await;
    }
}

/// Deletes the lease rows of `key` (a run's floor leaves none, unless it failed).
pub(crate) async fn delete_leases(config: &Config, key: &str) {
    if let Ok(client) = connect(config).await {
        let _ = client
            .execute(&format!("DELETE FROM {LEASES} WHERE key = $1"), &[&key])
            .await;
    }
}

/// Makes the counter `name` in [`COUNTERS`], at zero (the table is created if missing).
pub(crate) async fn create_counter(config: &Config, name: &str) -> Result<(), BoxError> {
    let client = connect(config).await?;
    create_schema(&client).await?;
    client
        .execute(
            &format!(
                "INSERT INTO {COUNTERS} (name, v) VALUES ($1, 0)
                 ON CONFLICT (name) DO UPDATE SET v = 0"
            ),
            &[&name],
        )
        .await?;
    Ok(())
}

/// One worker's connection to a counter of [`COUNTERS`].
pub(crate) struct Counter {
    client: Client,
    read: Statement,
    write: Statement,
    name: String,
}

impl Counter {
    /// A connection with its statements prepared, for the counter `name`.
    pub(crate) async fn connect(config: &Config, name: &str) -> Result<Counter, BoxError> {
        let client = connect(config).await?;
        let read = client
            .prepare(&format!("SELECT v FROM {COUNTERS} WHERE name = $1"))
            .await?;
        let write = client
            .prepare(&format!("UPDATE {COUNTERS} SET v = $2 WHERE name = $1"))
            .await?;
        Ok(Counter {
            client,
            read,
            write,
            name: name.to_owned(),
        })
    }

    /// The counter's value.
    pub(crate) async fn read(&mut self) -> Result<u64, BoxError> {
        let row = self
            .client
            .query_opt(&self.read, &[&self.name])
            .await?
            .ok_or_else(|| format!("the counter {} is gone", self.name))?;
        Ok(u64::try_from(row.try_get::<_, i64>(0)?)?)
    }

    /// Sets the counter to `value`.
    pub(crate) async fn write(&mut self, value: u64) -> Result<(), BoxError> {
        let value = i64::try_from(value)?;
        let updated = self
            .client
            .execute(&self.write, &[&self.name, &value])
            .await?;
        if updated != 1 {
            return Err(format!("the counter {} is gone", self.name).into());
        }
        Ok(())
    }

    /// Deletes the counter.
    pub(crate) async fn delete(self) {
        let _ = self
            .client
            .execute(
                &format!("DELETE FROM {COUNTERS} WHERE name = $1"),
                &[&self.name],
            )
            .await;
    }
}

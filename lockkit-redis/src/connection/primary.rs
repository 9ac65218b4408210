//! The primary a [`RedisBackend`](crate::RedisBackend) takes its locks on: a fixed server,
//! or the one a group of Sentinels points to, followed across failovers. Each primary address
//! gets an [`Epoch`] of connections; a request that finds the primary gone or demoted makes a
//! background task ask the Sentinels again and switch to a new epoch when the primary moved.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use lockkit_core::{Error, ErrorKind, Result};
use redis::aio::ConnectionManager;
use redis::{ProtocolVersion, RedisError};

use super::Dialer;
use super::caller::CallerConnection;
use crate::error::{from_redis, timed_out};
use crate::notify::Notifier;
use crate::scripts::PubSub;

/// The server locks are taken on: a fixed server, or the primary that Sentinels point to.
/// After a failover it finds the new primary and opens new connections to it.
pub(crate) struct Primary {
    dialer: Dialer,
    sentinels: Option<Sentinels>,
    current: RwLock<Arc<Epoch>>,
    resolving: tokio::sync::Mutex<Instant>,
}

/// The connections to one primary address.
pub(crate) struct Epoch {
    pub(crate) addr: (String, u16),
    /// For acquire, release and inspect when no application runtime is current (on
    /// lockkit's runtime: background releases, clean-up), driven on lockkit's runtime.
    pub(crate) connection: ConnectionManager,
    /// For acquire, release and inspect from the application's tasks (see
    /// [`CallerConnection`]).
    caller: CallerConnection,
    /// For renewals only, always used on lockkit's runtime, so its connection driver lives
    /// there and a saturated user runtime cannot delay renewals.
    pub(crate) renewals: ConnectionManager,
    /// For grants followed by `WAIT` (`min_replicas`): `WAIT` counts the writes of its own
    /// connection and blocks it, so it gets one of its own. Connects on first use.
    pub(crate) replication: ConnectionManager,
    /// Release notifications.
    pub(crate) notifier: Notifier,
}

pub(crate) struct Sentinels {
    pub(crate) hosts: Vec<(String, u16)>,
    pub(crate) master: String,
    /// The Sentinels' own credentials (not the Redis servers').
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// Which Sentinel to ask first next time.
    pub(crate) next: AtomicUsize,
}

/// Re-resolving the primary more often than this does not find a failover faster.
const RESOLVE_INTERVAL: Duration = Duration::from_millis(250);

impl Primary {
    /// Connects to a fixed server, whose scripts publish as `pubsub` says (sharded only if
    /// the server has `SPUBLISH`).
    pub(crate) async fn fixed(dialer: Dialer, addr: (String, u16), pubsub: PubSub) -> Result<Self> {
        let epoch = Epoch::open(&dialer, addr, pubsub).await?;
        Ok(Primary::new(dialer, None, epoch))
    }

    /// Asks the Sentinels for the primary they know by their master name and connects to it.
    pub(crate) async fn sentinel(dialer: Dialer, sentinels: Sentinels) -> Result<Self> {
        let addr = sentinels.resolve(&dialer).await?;
        let epoch = Epoch::open(&dialer, addr, PubSub::Classic).await?;
        Ok(Primary::new(dialer, Some(sentinels), epoch))
    }

    fn new(dialer: Dialer, sentinels: Option<Sentinels>, epoch: Epoch) -> Self {
        Primary {
            dialer,
            sentinels,
            current: RwLock::new(Arc::new(epoch)),
            resolving: tokio::sync::Mutex::new(Instant::now()),
        }
    }

    /// The connections to the current primary.
    pub(crate) fn epoch(&self) -> Arc<Epoch> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Runs `request` on the current primary's connection, bounded, and looks for a new
    /// primary (in the background) when the error says this one is gone or demoted.
    pub(crate) async fn request<T, F, Fut>(self: &Arc<Self>, what: &str, request: F) -> Result<T>
    where
        T: Send,
        F: Fn(ConnectionManager) -> Fut + Sync,
        Fut: Future<Output = redis::RedisResult<T>> + Send,
    {
        self.request_on(what, Epoch::for_caller, request).await
    }

    /// As [`Primary::request`], on the connection `pick` chooses.
    ///
    /// A request whose connection turns out to be dropped (the server restarted, or closed
    /// it) is sent once more, on the connection the manager opens instead, within the same
    /// bound: after a restart the first request on each connection would fail otherwise,
    /// a release among them. Every request lockkit sends may be repeated: a second acquire
    /// by the same owner returns its grant, a second release finds nothing to delete.
    pub(crate) async fn request_on<T, F, Fut>(
        self: &Arc<Self>,
        what: &str,
        pick: fn(&Epoch) -> ConnectionManager,
        request: F,
    ) -> Result<T>
    where
        T: Send,
        F: Fn(ConnectionManager) -> Fut + Sync,
        Fut: Future<Output = redis::RedisResult<T>> + Send,
    {
        let epoch = self.epoch();
        let bound = self.dialer.request_bound();
        let connection = &pick(&epoch);
        let twice = async {
            match request(connection.clone()).await {
                Err(e) if e.is_connection_dropped() => request(connection.clone()).await,
                outcome => outcome,
            }
        };
        match tokio::time::timeout(bound, twice).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if primary_may_have_moved(&e) {
                    self.follow_failover(epoch);
                }
                Err(from_redis(self.dialer.backend, e))
            }
            Err(_) => {
                self.follow_failover(epoch);
                Err(timed_out(self.dialer.backend, what, bound))
            }
        }
    }

    /// Starts asking the Sentinels where the primary is now, in the background (the failed
    /// request returns its error at once), and switches to it if it moved. At most one such
    /// task runs at a time, and not more often than [`RESOLVE_INTERVAL`].
    fn follow_failover(self: &Arc<Self>, failed: Arc<Epoch>) {
        if self.sentinels.is_none() {
            return;
        }
        let this = self.clone();
        lockkit_core::backend::runtime::spawn(async move {
            let Ok(mut last) = this.resolving.try_lock() else {
                return;
            };
            if !Arc::ptr_eq(&this.epoch(), &failed) || last.elapsed() < RESOLVE_INTERVAL {
                return;
            }
            *last = Instant::now();
            let Some(sentinels) = &this.sentinels else {
                return;
            };
            let addr = match sentinels.resolve(&this.dialer).await {
                Ok(addr) => addr,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot find the primary through the Sentinels");
                    return;
                }
            };
            if addr == failed.addr {
                return;
            }
            match Epoch::open(&this.dialer, addr.clone(), PubSub::Classic).await {
                Ok(epoch) => {
                    tracing::info!(primary = %format!("{}:{}", addr.0, addr.1), "following a Sentinel failover");
                    *this
                        .current
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(epoch);
                    // Releases are published on the new primary now: the old one's waiters retry.
                    failed.notifier.wake_all();
                }
                Err(e) => tracing::warn!(error = %e, "cannot connect to the new primary"),
            }
        });
    }
}

impl Epoch {
    /// The connection for a request made now: on an application's runtime, the connection
    /// that runtime drives itself (see [`CallerConnection`]); on lockkit's runtime or none,
    /// the one lockkit's runtime drives.
    pub(crate) fn for_caller(&self) -> ConnectionManager {
        self.caller.get(&self.connection)
    }

    /// The connection for a request that must reach the server after the attempts an
    /// application's task made (the clean-up of an acquisition dropped mid-attempt, run on
    /// lockkit's runtime): the application runtime's connection while it has one, since a
    /// server runs one connection's requests in order and two connections' in any.
    pub(crate) fn after_attempts(&self) -> ConnectionManager {
        self.caller.existing().unwrap_or_else(|| self.for_caller())
    }

    /// Connects to `addr`, on lockkit's runtime so that the connection drivers live there.
    /// `PubSub::Sharded` falls back to classic pub/sub on a server without `SPUBLISH`
    /// (before Redis 7).
    async fn open(dialer: &Dialer, addr: (String, u16), pubsub: PubSub) -> Result<Self> {
        let dialer = dialer.clone();
        lockkit_core::backend::runtime::run(async move {
            let info = dialer.info(&addr.0, addr.1, ProtocolVersion::RESP2)?;
            let info_for_caller = info.clone();
            let (connection, renewals) =
                tokio::try_join!(dialer.connect(info.clone()), dialer.connect(info.clone()))?;
            let replication = dialer.lazy(info)?;
            let pubsub = match pubsub {
                PubSub::Sharded => {
                    let mut connection = connection.clone();
                    let info = dialer
                        .bounded("reading the server's version", async move {
                            redis::cmd("INFO")
                                .arg("server")
                                .query_async::<String>(&mut connection)
                                .await
                        })
                        .await;
                    if sharded_pubsub_in(info) {
                        PubSub::Sharded
                    } else {
                        PubSub::Classic
                    }
                }
                PubSub::Classic => PubSub::Classic,
            };
            let notifier = Notifier::new(
                dialer.clone(),
                dialer.info(&addr.0, addr.1, ProtocolVersion::RESP3)?,
                pubsub,
            );
            Ok(Epoch {
                caller: CallerConnection::new(&dialer, info_for_caller),
                addr,
                connection,
                renewals,
                replication,
                notifier,
            })
        })
        .await?
    }
}

/// Whether a server has sharded pub/sub (`SPUBLISH`, Redis 7 or later), as the version in
/// its answer to `INFO server` says (`INFO` is in the minimal ACL already; `COMMAND INFO` is
/// not). A server that does not say (`INFO` refused, no answer) is taken for one without,
/// with a warning.
pub(crate) fn sharded_pubsub_in(info: Result<String>) -> bool {
    match info {
        Ok(info) => major_version(&info).is_some_and(|major| major >= 7),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the server's version (INFO server): waiters listen by classic pub/sub");
            false
        }
    }
}

/// The major version in an `INFO server` answer (`redis_version:7.0.15`).
fn major_version(info: &str) -> Option<u32> {
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .and_then(|version| version.trim().split('.').next()?.parse().ok())
}

impl Sentinels {
    /// The primary's address: the first answer, asking the Sentinels in turn (starting with a
    /// different one each time, so one stale Sentinel cannot pin us), that names a server
    /// which says it is a primary (`ROLE`).
    async fn resolve(&self, dialer: &Dialer) -> Result<(String, u16)> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in 0..self.hosts.len() {
            let (host, port) = &self.hosts[(start + i) % self.hosts.len()];
            let failure = match self.ask(dialer, host, *port).await {
                Ok(addr) => match is_primary(dialer, &addr).await {
                    Ok(true) => return Ok(addr),
                    Ok(false) => Error::new(
                        ErrorKind::Unavailable,
                        dialer.backend,
                        format!("it names {}:{}, which is not a primary", addr.0, addr.1),
                    )
                    .with_retryable(true),
                    Err(e) => e,
                },
                Err(e) => e,
            };
            failures.push((format!("{host}:{port}"), failure));
        }
        // Every Sentinel refusing the same way (an unknown master name, credentials) is that
        // error, not an outage.
        Err(crate::error::none_answered(
            dialer.backend,
            &format!("no Sentinel named a primary for {:?}", self.master),
            &failures,
        ))
    }

    async fn ask(&self, dialer: &Dialer, host: &str, port: u16) -> Result<(String, u16)> {
        let sentinel = Dialer {
            username: self.username.clone(),
            password: self.password.clone(),
            db: 0,
            ..dialer.clone()
        };
        let client = sentinel.client(sentinel.info(host, port, ProtocolVersion::RESP2)?)?;
        let master = self.master.clone();
        let reply: Option<(String, String)> = sentinel
            .bounded("asking a Sentinel", async move {
                let mut con = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&master)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        let Some((host, port)) = reply else {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                dialer.backend,
                format!(
                    "the Sentinel does not know a primary named {:?}",
                    self.master
                ),
            ));
        };
        let port = port.parse().map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                dialer.backend,
                format!("a Sentinel answered with the port {port:?}"),
            )
        })?;
        Ok((host, port))
    }
}

/// Whether the server at `addr` says it is a primary.
async fn is_primary(dialer: &Dialer, addr: &(String, u16)) -> Result<bool> {
    let client = dialer.client(dialer.info(&addr.0, addr.1, ProtocolVersion::RESP2)?)?;
    let role: Vec<redis::Value> = dialer
        .bounded("asking a server its role", async move {
            let mut con = client.get_multiplexed_async_connection().await?;
            redis::cmd("ROLE").query_async(&mut con).await
        })
        .await?;
    Ok(matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master"))
}

/// Whether `error` means the primary may be down or demoted (then the Sentinels are asked).
fn primary_may_have_moved(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
        || matches!(
            error.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::ReadOnly | redis::ServerErrorKind::MasterDown
            )
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_major_version_is_read_from_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(major_version(info), Some(7));
        assert_eq!(major_version("redis_version:6.2.14\r\n"), Some(6));
        assert_eq!(major_version("# Server\r\nredis_mode:cluster\r\n"), None);
    }
}

//! The primary a [`RedisBackend`](crate::RedisBackend) takes its locks on: a fixed server,
//! or the one a group of Sentinels points to, followed across failovers. Each primary address
//! gets an [`Epoch`] of connections. The backend switches to a new epoch when a Sentinel
//! announces a failover (`sentinels.rs`), or when a request finds the primary gone or demoted
//! and a background task, asking the Sentinels again, finds that the primary moved.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use lockkit_core::Result;
use redis::aio::ConnectionManager;
use redis::{ProtocolVersion, RedisError};

use super::Dialer;
use super::caller::CallerConnection;
use super::sentinels::{self, Sentinels, is_primary};
use crate::error::{from_redis, timed_out};
use crate::notify::Notifier;
use crate::scripts::PubSub;

/// The server locks are taken on: a fixed server, or the primary that Sentinels point to.
/// After a failover it finds the new primary and opens new connections to it.
pub(crate) struct Primary {
    pub(super) dialer: Dialer,
    pub(super) sentinels: Option<Sentinels>,
    current: RwLock<Arc<Epoch>>,
    /// Held while the primary is looked for or switched; when it was last looked for.
    resolving: tokio::sync::Mutex<Instant>,
    /// Dropped with the primary, which stops the Sentinel subscriptions.
    _listening: Option<tokio::sync::watch::Sender<()>>,
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

/// Re-resolving the primary more often than this does not find a failover faster.
const RESOLVE_INTERVAL: Duration = Duration::from_millis(250);

impl Primary {
    /// Connects to a fixed server, whose scripts publish as `pubsub` says (sharded only if
    /// the server has `SPUBLISH`).
    pub(crate) async fn fixed(
        dialer: Dialer,
        addr: (String, u16),
        pubsub: PubSub,
    ) -> Result<Arc<Self>> {
        let epoch = Epoch::open(&dialer, addr, pubsub).await?;
        Ok(Arc::new(Primary::new(dialer, None, epoch, None)))
    }

    /// Asks the Sentinels for the primary they know by their master name, connects to it and
    /// listens to the Sentinels' failover announcements (on lockkit's runtime).
    pub(crate) async fn sentinel(dialer: Dialer, sentinels: Sentinels) -> Result<Arc<Self>> {
        let addr = sentinels.resolve(&dialer).await?;
        let epoch = Epoch::open(&dialer, addr, PubSub::Classic).await?;
        let (listening, stop) = tokio::sync::watch::channel(());
        let primary = Arc::new(Primary::new(
            dialer,
            Some(sentinels),
            epoch,
            Some(listening),
        ));
        if let Some(sentinels) = &primary.sentinels {
            sentinels::watch(&primary, sentinels, &stop);
        }
        Ok(primary)
    }

    fn new(
        dialer: Dialer,
        sentinels: Option<Sentinels>,
        epoch: Epoch,
        listening: Option<tokio::sync::watch::Sender<()>>,
    ) -> Self {
        Primary {
            dialer,
            sentinels,
            current: RwLock::new(Arc::new(epoch)),
            resolving: tokio::sync::Mutex::new(Instant::now()),
            _listening: listening,
        }
    }

    /// The connections to the current primary.
    pub(crate) fn epoch(&self) -> Arc<Epoch> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether `epoch` is still the current one: the backend has not moved to another
    /// primary since it was taken.
    pub(crate) fn is_current(&self, epoch: &Arc<Epoch>) -> bool {
        Arc::ptr_eq(epoch, &self.epoch())
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
            if addr != failed.addr {
                this.switch(&failed, addr).await;
            }
        });
    }

    /// Moves to `addr`, which a Sentinel announced as the new primary, unless the backend is
    /// there already or the server there does not say it is a primary.
    pub(super) async fn follow_announcement(&self, addr: (String, u16)) {
        let _resolving = self.resolving.lock().await;
        let current = self.epoch();
        if current.addr == addr {
            return;
        }
        match is_primary(&self.dialer, &addr).await {
            Ok(true) => self.switch(&current, addr).await,
            Ok(false) => tracing::debug!(
                primary = %format!("{}:{}", addr.0, addr.1),
                "a Sentinel announced a primary that is not one (yet, or any more)"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot reach the primary a Sentinel announced"),
        }
    }

    /// Opens connections to `addr` and makes them the current epoch in place of `from`'s.
    async fn switch(&self, from: &Epoch, addr: (String, u16)) {
        match Epoch::open(&self.dialer, addr.clone(), PubSub::Classic).await {
            Ok(epoch) => {
                tracing::info!(primary = %format!("{}:{}", addr.0, addr.1), "following a Sentinel failover");
                *self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(epoch);
                // Releases are published on the new primary now: the old one's waiters retry.
                from.notifier.wake_all();
            }
            Err(e) => tracing::warn!(error = %e, "cannot connect to the new primary"),
        }
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

//! Connections: one reconnecting [`ConnectionManager`] per server, with bounded timeouts, and
//! the [`Primary`] that follows a Sentinel-managed primary across failovers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use lockkit_core::{Error, ErrorKind, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion,
    RedisConnectionInfo, RedisError,
};

use crate::error::{from_redis, timed_out};
use crate::notify::Notifier;
use crate::scripts::PubSub;

/// How to open connections to the servers of one backend.
#[derive(Clone)]
pub(crate) struct Dialer {
    pub(crate) backend: &'static str,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
    pub(crate) tls: bool,
    /// PEM CA certificates to trust instead of the system's roots.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) tls_ca: Option<Arc<Vec<u8>>>,
    /// The client certificate and key for mutual TLS.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) tls_identity: Option<Arc<ClientIdentity>>,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

/// A client certificate (chain) and its private key, PEM. `Debug` shows neither.
pub(crate) struct ClientIdentity {
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    cert: Vec<u8>,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    key: Vec<u8>,
}

impl Dialer {
    /// The dialer of a `[redis]` configuration (one server, Sentinel, or a cluster's nodes).
    pub(crate) fn of(config: &crate::RedisConfig) -> Result<Self> {
        Ok(Dialer {
            backend: crate::error::BACKEND,
            username: config.username.clone(),
            password: config.password.clone(),
            db: config.db,
            tls: config.tls,
            tls_ca: Dialer::read_ca(config.tls_ca_file.as_deref())?,
            tls_identity: Dialer::read_identity(
                config.tls_cert_file.as_deref(),
                config.tls_key_file.as_deref(),
            )?,
            connect_timeout: config.connect_timeout,
            response_timeout: config.response_timeout,
        })
    }

    /// The connection info of `host:port` with this dialer's credentials.
    pub(crate) fn info(
        &self,
        host: &str,
        port: u16,
        protocol: ProtocolVersion,
    ) -> Result<ConnectionInfo> {
        let mut redis = RedisConnectionInfo::default()
            .set_db(self.db)
            .set_protocol(protocol);
        if let Some(user) = &self.username {
            redis = redis.set_username(user);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(password);
        }
        let addr = self.addr(host, port)?;
        let info = addr
            .into_connection_info()
            .map_err(|e| from_redis(self.backend, e))?;
        Ok(info.set_redis_settings(redis))
    }

    /// Reads the CA file named in the configuration, if any.
    pub(crate) fn read_ca(path: Option<&std::path::Path>) -> Result<Option<Arc<Vec<u8>>>> {
        path.map(|path| {
            std::fs::read(path).map(Arc::new).map_err(|e| {
                Error::invalid_config(format!("cannot read tls_ca_file {}: {e}", path.display()))
            })
        })
        .transpose()
    }

    /// Reads the client certificate and key named in the configuration, if any (the
    /// configuration's validation has checked they come together).
    pub(crate) fn read_identity(
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<Option<Arc<ClientIdentity>>> {
        let read = |field: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| {
                Error::invalid_config(format!("cannot read {field} {}: {e}", path.display()))
            })
        };
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(Arc::new(ClientIdentity {
                cert: read("tls_cert_file", cert)?,
                key: read("tls_key_file", key)?,
            }))),
            _ => Ok(None),
        }
    }

    /// A client for `info`, trusting the configured CA for TLS and presenting the configured
    /// client certificate.
    pub(crate) fn client(&self, info: ConnectionInfo) -> Result<Client> {
        #[cfg(feature = "tls")]
        if self.tls && (self.tls_ca.is_some() || self.tls_identity.is_some()) {
            let certificates = redis::TlsCertificates {
                client_tls: self
                    .tls_identity
                    .as_ref()
                    .map(|identity| redis::ClientTlsConfig {
                        client_cert: identity.cert.clone(),
                        client_key: identity.key.clone(),
                    }),
                root_cert: self.tls_ca.as_ref().map(|ca| ca.to_vec()),
            };
            return Client::build_with_tls(info, certificates)
                .map_err(|e| from_redis(self.backend, e));
        }
        Client::open(info).map_err(|e| from_redis(self.backend, e))
    }

    #[cfg(feature = "tls")]
    fn addr(&self, host: &str, port: u16) -> Result<ConnectionAddr> {
        if self.tls {
            // rustls needs one process-wide crypto provider; another library may have
            // installed one already, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
            return Ok(ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            });
        }
        Ok(ConnectionAddr::Tcp(host.to_owned(), port))
    }

    #[cfg(not(feature = "tls"))]
    fn addr(&self, host: &str, port: u16) -> Result<ConnectionAddr> {
        if self.tls {
            return Err(Error::invalid_config(
                "TLS needs the cargo feature `tls` of lockkit-redis",
            ));
        }
        Ok(ConnectionAddr::Tcp(host.to_owned(), port))
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(200))
    }

    /// A manager that connects on first use (for servers that may be down at start-up).
    pub(crate) fn lazy(&self, info: ConnectionInfo) -> Result<ConnectionManager> {
        let client = self.client(info)?;
        ConnectionManager::new_lazy_with_config(client, self.manager_config())
            .map_err(|e| from_redis(self.backend, e))
    }

    /// As [`Dialer::lazy`], with no response timeout: for callers that bound every request
    /// themselves and need a request to stay pending (and so be sent) after they stop
    /// waiting for it. The client drops a timed-out request that it has not written yet.
    pub(crate) fn lazy_without_response_timeout(
        &self,
        info: ConnectionInfo,
    ) -> Result<ConnectionManager> {
        let client = self.client(info)?;
        let config = self.manager_config().set_response_timeout(None);
        ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| from_redis(self.backend, e))
    }

    /// A manager that is connected (and authenticated) before this returns.
    ///
    /// # Errors
    /// As [`Dialer::bounded`]; [`ErrorKind::InvalidConfig`] when the server has no database
    /// numbered `db`.
    pub(crate) async fn connect(&self, info: ConnectionInfo) -> Result<ConnectionManager> {
        let client = self.client(info)?;
        let config = self.manager_config();
        let bound = self.request_bound();
        match tokio::time::timeout(bound, ConnectionManager::new_with_config(client, config)).await
        {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) if crate::error::is_missing_database(&e) => Err(Error::new(
                ErrorKind::InvalidConfig,
                self.backend,
                format!(
                    "the server has no database {}: redis.db (the URL's /db) must be below the server's `databases` setting (16 by default)",
                    self.db
                ),
            )),
            Ok(Err(e)) => Err(from_redis(self.backend, e)),
            Err(_) => Err(timed_out(self.backend, "connect", bound)),
        }
    }

    /// A manager for pub/sub pushes (RESP3), which resubscribes after a reconnect.
    pub(crate) fn pubsub(
        &self,
        info: ConnectionInfo,
        pushes: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
    ) -> Result<ConnectionManager> {
        let client = self.client(info)?;
        let config = self
            .manager_config()
            .set_push_sender(pushes)
            .set_automatic_resubscription();
        ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| from_redis(self.backend, e))
    }

    /// The longest one request may take, reconnecting included.
    pub(crate) fn request_bound(&self) -> Duration {
        self.connect_timeout + self.response_timeout
    }

    /// Runs one request with the [`Dialer::request_bound`] and maps its error.
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        request: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        let bound = self.request_bound();
        match tokio::time::timeout(bound, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(from_redis(self.backend, e)),
            Err(_) => Err(timed_out(self.backend, what, bound)),
        }
    }
}

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

/// The connection an application's runtime drives itself, for the requests its tasks make on
/// a contended lock's hand-over path (attempts, releases): sent and answered without a switch
/// to lockkit's thread and back (on Redis W2, 9,189-11,994 increments/s at 40-52 µs of client
/// CPU each, against 7,303-7,702/s at 85-88 µs with every request through lockkit's runtime;
/// interleaved runs, 2026-12-04).
///
/// Opened on first use from a runtime that is not lockkit's, so its driver runs there; a task
/// on that runtime that never ends is dropped when the runtime shuts down and forgets the
/// connection then, so that no request reaches a driver that is gone (the next runtime to ask
/// opens its own). One client keeps one such connection, whichever runtime opened it: a
/// second runtime that shares the client sends on it too. Renewals keep their own
/// connection on lockkit's runtime: a saturated application runtime delays the attempts and
/// releases sent on its connection, never a renewal.
struct CallerConnection {
    dialer: Dialer,
    info: ConnectionInfo,
    slot: Arc<std::sync::Mutex<Option<(u64, ConnectionManager)>>>,
    opened: AtomicUsize,
}

impl CallerConnection {
    fn new(dialer: &Dialer, info: ConnectionInfo) -> Self {
        CallerConnection {
            dialer: dialer.clone(),
            info,
            slot: Arc::default(),
            opened: AtomicUsize::new(0),
        }
    }

    fn existing(&self) -> Option<ConnectionManager> {
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|(_, connection)| connection.clone())
    }

    /// The application runtime's connection, opened now if it has none; `shared` on
    /// lockkit's runtime, outside any runtime or task, on a current-thread runtime, or when
    /// the connection cannot be set up.
    ///
    /// A future that `block_on` runs (`#[tokio::main]`'s own, say) is not a task: it is
    /// polled on the thread that blocks, not on a worker, and a runtime's connection would be
    /// driven on a worker anyway; the hop to lockkit's thread, which waits on nothing else,
    /// costs less than one to a parked worker (W1's p50 on Redis from `main`: 68-70 µs
    /// against 88-89 µs, 2026-12-04). A current-thread runtime runs its tasks only while a
    /// thread blocks on it: a connection driven there would stall every other runtime's
    /// requests on it whenever that runtime sits idle, still alive.
    fn get(&self, shared: &ConnectionManager) -> ConnectionManager {
        if lockkit_core::backend::runtime::is_current() || tokio::task::try_id().is_none() {
            return shared.clone();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return shared.clone();
        };
        if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return shared.clone();
        }
        let mut slot = self
            .slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, connection)) = slot.as_ref() {
            return connection.clone();
        }
        let Ok(connection) = self.dialer.lazy(self.info.clone()) else {
            return shared.clone();
        };
        let id = self.opened.fetch_add(1, Ordering::Relaxed) as u64;
        *slot = Some((id, connection.clone()));
        let forget = ForgetOnDrop {
            slot: Arc::downgrade(&self.slot),
            id,
        };
        runtime.spawn(async move {
            let _forget = forget;
            std::future::pending::<()>().await;
        });
        connection
    }
}

/// Forgets the caller connection `id` when dropped: at the shutdown of the runtime that
/// drives it.
struct ForgetOnDrop {
    slot: std::sync::Weak<std::sync::Mutex<Option<(u64, ConnectionManager)>>>,
    id: u64,
}

impl Drop for ForgetOnDrop {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.upgrade() {
            let mut slot = slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if slot.as_ref().is_some_and(|(id, _)| *id == self.id) {
                *slot = None;
            }
        }
    }
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

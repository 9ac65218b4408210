//! `PostgresBackend`: the [`LockBackend`] over the `lockkit` schema of one database.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use lockkit_core::backend::{
    AcquireRequest, Attempt, CancellationToken, Contention, Grant, Leader, Lease, LockBackend,
    LockInfo, LockPage, Renewal, async_trait,
};
use lockkit_core::{
    Capabilities, Error, FencingGuarantee, LockKey, Result, Support, Tier, WaitStrategy,
};

use crate::config::PostgresConfig;
use crate::error::BACKEND;
use crate::session::Session;
use crate::wait::{self, Board};

/// Locks in a PostgreSQL database: tier `single` on a server alone, `replicated` when it
/// commits to synchronous standbys (see the crate documentation for what each survives).
///
/// Clones share the connections. Dropping the last one stops its listener; the connections
/// close once their last statement is answered.
#[derive(Debug, Clone)]
pub struct PostgresBackend {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) session: Session,
    pub(crate) board: Arc<Board>,
    /// When this client last swept expired rows (seconds since the epoch).
    pub(crate) last_sweep: AtomicU64,
    tier: Tier,
    stop: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl PostgresBackend {
    /// Connects to the database of `config`, checks the `lockkit` schema (creating it when
    /// it is missing and `create_schema` allows), reads the server's tier and starts the
    /// listener.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for an invalid
    /// configuration or a schema this lockkit cannot use;
    /// [`ErrorKind::Unavailable`](lockkit_core::ErrorKind::Unavailable) when no server
    /// answers within the timeouts; [`ErrorKind::Auth`](lockkit_core::ErrorKind::Auth) for
    /// refused credentials or missing rights.
    pub async fn connect(config: PostgresConfig) -> Result<PostgresBackend> {
        config.validate()?;
        let session = Session::new(config)?;
        session.prepare_schema().await?;
        let synchronous = session
            .query_one(
                "reading synchronous_standby_names",
                "SELECT current_setting('synchronous_standby_names') <> ''",
                &[],
            )
            .await?
            .try_get::<_, bool>(0)
            .unwrap_or(false);
        let board = Arc::new(Board::new());
        let stop = CancellationToken::new();
        if session.config.listen {
            wait::listen(
                session.listen_config(),
                session.transport.clone(),
                session.config.connect_timeout,
                board.clone(),
                stop.clone(),
            );
        }
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                session,
                board,
                last_sweep: AtomicU64::new(0),
                tier: if synchronous {
                    Tier::Replicated
                } else {
                    Tier::Single
                },
                stop,
            }),
        })
    }

    /// The configuration this backend was made with.
    pub fn config(&self) -> &PostgresConfig {
        &self.inner.session.config
    }
}

#[async_trait]
impl LockBackend for PostgresBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn tier(&self) -> Tier {
        self.inner.tier
    }

    fn capabilities(&self) -> Capabilities {
        // Without the listener a waiter polls at the core's backoff_max, which also refreshes
        // its row in time; with it, its wait ends by itself (wait.rs).
        let wait = if self.config().listen {
            WaitStrategy::Queue
        } else {
            WaitStrategy::Notify
        };
        Capabilities::new(FencingGuarantee::Monotonic, wait)
            .with_min_ttl(Duration::from_millis(10))
            .with_semaphore(Support::Supported)
            .with_rwlock(Support::Supported)
            .with_election(Support::Supported)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.attempt(request).await
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        self.wait(request, contention, max_wait).await
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.remove(&request.owner, false).await.map(drop)
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        let mut answers = self.renew_all(std::slice::from_ref(lease)).await?;
        Ok(answers.pop().unwrap_or(Renewal::Lost))
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        match self.renew_all(leases).await {
            Ok(answers) => answers.into_iter().map(Ok).collect(),
            Err(e) => leases
                .iter()
                .map(|_| Err(Error::new(e.kind(), BACKEND, e.message().to_owned())))
                .collect(),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.remove(lease.owner(), true).await
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        self.holds(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.holder(key).await.map(|holder| holder.map(|h| h.info))
    }

    async fn ping(&self) -> Result<()> {
        self.inner
            .session
            .query("pinging PostgreSQL", "SELECT 1", &[])
            .await
            .map(drop)
    }

    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        self.list_page(namespace, prefix, cursor, limit).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        self.break_lock(key).await
    }

    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        self.store_value(lease, value).await
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        self.read_leader(key).await
    }

    async fn wait_for_leader_change(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        self.watch_leader(key, seen, max_wait).await
    }
}

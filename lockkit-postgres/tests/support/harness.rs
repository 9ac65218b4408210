//! The conformance harness of the PostgreSQL backend.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use lockkit_core::backend::async_trait;
use lockkit_core::testing::Harness;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{LockClient, LockKey, LockOptions, Result};
use lockkit_postgres::tokio_postgres;
use lockkit_postgres::{PostgresBackend, PostgresConfig};

/// Every client gets its own backend (its own connections and listener), as separate
/// processes would; `admin` plays the operator. Each client reaches the server through its
/// own proxy, so that `crash` can cut it off: its rows then live until they expire, as after
/// a real crash, even when the scenario still holds (forgot) a guard that keeps the backend
/// alive.
pub struct PostgresHarness {
    config: PostgresConfig,
    admin: PostgresBackend,
    sql: tokio_postgres::Client,
    proxies: StdMutex<Vec<(usize, FaultProxy)>>,
}

impl PostgresHarness {
    /// A harness over the server of `config`.
    pub async fn connect(config: PostgresConfig) -> Result<PostgresHarness> {
        let admin = PostgresBackend::connect(config.clone()).await?;
        let sql = super::admin(&config).await;
        Ok(PostgresHarness {
            config,
            admin,
            sql,
            proxies: StdMutex::new(Vec::new()),
        })
    }
}

fn backend_id(client: &LockClient) -> usize {
    Arc::as_ptr(client.backend()).cast::<()>() as usize
}

#[async_trait]
impl Harness for PostgresHarness {
    async fn client(&self, namespace: &str, options: LockOptions) -> Result<LockClient> {
        let proxy = FaultProxy::start(&self.config.hosts)
            .await
            .expect("a fault proxy");
        let mut config = self.config.clone();
        config.hosts = proxy.hosts();
        let backend = PostgresBackend::connect(config).await?;
        let client = LockClient::with_options(Arc::new(backend), namespace, options)?;
        self.proxies
            .lock()
            .expect("proxies")
            .push((backend_id(&client), proxy));
        Ok(client)
    }

    async fn crash(&self, client: LockClient) {
        let id = backend_id(&client);
        if let Some((_, proxy)) = self
            .proxies
            .lock()
            .expect("proxies")
            .iter()
            .find(|(p, _)| *p == id)
        {
            proxy.set(Direction::Both, Fault::Blackhole);
        }
        drop(client);
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn force_release(&self, key: &LockKey) -> Result<()> {
        use lockkit_core::backend::LockBackend as _;
        self.admin.force_release(key).await.map(drop)
    }

    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>> {
        Ok(super::rows_under(&self.sql, namespace).await)
    }
}

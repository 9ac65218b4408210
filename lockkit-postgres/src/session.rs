//! The connections a client's statements go over, and the schema they need.
//!
//! A client keeps `pool_size` connections and spreads its statements over them in turn; each
//! connection pipelines what is sent on it. Every statement is one round trip with an unnamed
//! prepared statement (`query_typed`): nothing is left on the server between statements, so
//! PgBouncer in transaction pooling can give each one to any server connection. A connection
//! that broke is replaced by the next statement that picks it. Connections are made on
//! lockkit's own runtime, whose thread drives them, so a busy application runtime cannot
//! stall a renewal's reply.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use lockkit_core::backend::runtime;
use lockkit_core::{Error, ErrorKind, Result};
use tokio_postgres::config::{SslMode, TargetSessionAttrs};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use crate::config::PostgresConfig;
use crate::error::{self, BACKEND};
use crate::tls::Transport;

/// The schema version this lockkit reads and writes (`lockkit.schema_version`).
pub(crate) const SCHEMA_VERSION: i32 = 1;

/// The schema, as a DBA would run it.
const SCHEMA_SQL: &str = include_str!("../sql/schema.sql");

/// The advisory lock that serializes schema creation between clients starting together.
const SCHEMA_LOCK: i64 = 0x6c6f_636b_6b69_7401;

/// One parameter of a statement with its type.
pub(crate) type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// The connections of one client.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) config: PostgresConfig,
    pg: tokio_postgres::Config,
    pub(crate) transport: Transport,
    slots: Vec<Slot>,
    next: AtomicUsize,
}

#[derive(Debug, Default)]
struct Slot {
    client: StdMutex<Option<Arc<Client>>>,
    /// Held while the slot's connection is being made, so that only one is.
    connecting: tokio::sync::Mutex<()>,
}

impl Session {
    /// The connections of `config`; none is made yet.
    ///
    /// # Errors
    /// `InvalidConfig` for TLS files that cannot be used.
    pub(crate) fn new(config: PostgresConfig) -> Result<Session> {
        let transport = Transport::of(&config)?;
        let pg = pg_config(&config, &transport);
        let slots = (0..config.pool_size).map(|_| Slot::default()).collect();
        Ok(Session {
            config,
            pg,
            transport,
            slots,
            next: AtomicUsize::new(0),
        })
    }

    /// The driver settings of the `LISTEN` connection (to `listen_hosts`, when set).
    pub(crate) fn listen_config(&self) -> tokio_postgres::Config {
        pg_config(&self.config.for_listening(), &self.transport)
    }

    /// Runs `sql` with `params` on the next connection, within the request timeout.
    pub(crate) async fn query(
        &self,
        what: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed);
        self.query_on(slot, what, sql, params).await
    }

    /// Runs `sql` on the connection of `owner` (an owner digest): the statements of one
    /// acquisition go over one connection, so the server runs them in the order they were
    /// sent, and an abandon cannot overtake the attempt it cleans up after.
    pub(crate) async fn query_as(
        &self,
        owner: &str,
        what: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>> {
        let slot = owner
            .get(..8)
            .and_then(|hex| usize::from_str_radix(hex, 16).ok())
            .unwrap_or(0);
        self.query_on(slot, what, sql, params).await
    }

    async fn query_on(
        &self,
        slot: usize,
        what: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>> {
        let timeout = self.config.request_timeout;
        let mut used = None;
        let run = async {
            let client = self.client(slot).await?;
            used = Some(client.clone());
            client
                .query_typed(sql, params)
                .await
                .map_err(|e| error::map(what, e))
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(outcome) => outcome,
            Err(_) => {
                // A server that does not answer in time may be gone without a word (a
                // partition): the next statement on this slot connects afresh, and fails fast
                // if the server is unreachable, rather than waiting behind this one.
                if let Some(client) = used {
                    self.slots[slot % self.slots.len()].discard(&client);
                }
                Err(error::timed_out(what, timeout))
            }
        }
    }

    /// Like [`Session::query`], for a statement that returns one row.
    pub(crate) async fn query_one(
        &self,
        what: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Row> {
        one(what, self.query(what, sql, params).await?)
    }

    /// Like [`Session::query_as`], for a statement that returns one row.
    pub(crate) async fn query_one_as(
        &self,
        owner: &str,
        what: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Row> {
        one(what, self.query_as(owner, what, sql, params).await?)
    }

    /// A live connection of slot `slot` (modulo the pool), made if the slot has none.
    async fn client(&self, slot: usize) -> Result<Arc<Client>> {
        let slot = &self.slots[slot % self.slots.len()];
        if let Some(client) = slot.live() {
            return Ok(client);
        }
        let _connecting = slot.connecting.lock().await;
        if let Some(client) = slot.live() {
            return Ok(client);
        }
        let client =
            Arc::new(connect(&self.pg, &self.transport, self.config.connect_timeout).await?);
        *slot.client.lock().unwrap_or_else(PoisonError::into_inner) = Some(client.clone());
        Ok(client)
    }

    /// Checks the schema's version, creating the schema first when it is missing and the
    /// configuration allows.
    pub(crate) async fn prepare_schema(&self) -> Result<()> {
        let what = "reading the lockkit schema version";
        let version = match self
            .query(what, "SELECT version FROM lockkit.schema_version", &[])
            .await
        {
            Ok(rows) => rows.first().map(|row| row.try_get::<_, i32>(0)),
            Err(e) if is_missing_schema(&e) => None,
            Err(e) => return Err(e),
        };
        match version {
            Some(Ok(SCHEMA_VERSION)) => Ok(()),
            Some(Ok(version)) if version > SCHEMA_VERSION => Err(Error::invalid_config(format!(
                "the lockkit schema has version {version}, newer than this lockkit's {SCHEMA_VERSION}: upgrade lockkit"
            ))),
            Some(Ok(version)) => Err(Error::invalid_config(format!(
                "the lockkit schema has version {version}, and this lockkit knows no migration from it to {SCHEMA_VERSION}"
            ))),
            Some(Err(e)) => Err(Error::new(ErrorKind::Backend, BACKEND, what).with_source(e)),
            None if self.config.create_schema => self.create_schema().await,
            None => Err(Error::invalid_config(
                "the lockkit schema is missing and [postgres] create_schema is false: have a DBA run lockkit-postgres's sql/schema.sql",
            )),
        }
    }

    async fn create_schema(&self) -> Result<()> {
        let what = "creating the lockkit schema (the role needs CREATE on the database, or a DBA runs sql/schema.sql)";
        let script =
            format!("BEGIN;\nSELECT pg_advisory_xact_lock({SCHEMA_LOCK});\n{SCHEMA_SQL}\nCOMMIT;");
        let timeout = self.config.request_timeout;
        let run = async {
            let client = self.client(0).await?;
            client
                .batch_execute(&script)
                .await
                .map_err(|e| error::map(what, e))
        };
        tokio::time::timeout(timeout, run)
            .await
            .unwrap_or_else(|_| Err(error::timed_out(what, timeout)))
    }
}

fn one(what: &str, rows: Vec<Row>) -> Result<Row> {
    rows.into_iter().next().ok_or_else(|| {
        Error::new(
            ErrorKind::Backend,
            BACKEND,
            format!("{what}: the server returned no row"),
        )
    })
}

impl Slot {
    /// Forgets `client` if it is still the slot's connection.
    fn discard(&self, client: &Arc<Client>) {
        let mut current = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            *current = None;
        }
    }

    fn live(&self) -> Option<Arc<Client>> {
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|client| !client.is_closed())
    }
}

/// Makes a connection on lockkit's runtime, where its driver then runs until the connection
/// ends (the server closes it, or the last handle of its [`Client`] is dropped).
pub(crate) async fn connect(
    pg: &tokio_postgres::Config,
    transport: &Transport,
    timeout: Duration,
) -> Result<Client> {
    let (pg, transport) = (pg.clone(), transport.clone());
    let connecting = runtime::run(async move {
        let (client, connection) = pg.connect(transport).await?;
        runtime::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a PostgreSQL connection ended");
            }
        });
        Ok::<_, tokio_postgres::Error>(client)
    });
    match tokio::time::timeout(timeout, connecting).await {
        Ok(connected) => connected?.map_err(|e| error::map("connecting to PostgreSQL", e)),
        Err(_) => Err(error::timed_out("connecting to PostgreSQL", timeout)),
    }
}

fn pg_config(config: &PostgresConfig, transport: &Transport) -> tokio_postgres::Config {
    let mut pg = tokio_postgres::Config::new();
    pg.ssl_mode(if transport.is_tls() {
        SslMode::Require
    } else {
        SslMode::Disable
    });
    for (host, port) in config.host_ports() {
        pg.host(&host).port(port);
    }
    pg.dbname(&config.dbname)
        .user(&config.user)
        .application_name("lockkit")
        .connect_timeout(config.connect_timeout)
        .keepalives_idle(Duration::from_secs(30))
        .target_session_attrs(TargetSessionAttrs::ReadWrite);
    if let Some(password) = &config.password {
        pg.password(password);
    }
    pg
}

/// Whether `error` says that the schema or its version table does not exist.
fn is_missing_schema(error: &Error) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<tokio_postgres::Error>())
        .and_then(tokio_postgres::Error::code)
        .is_some_and(|code| {
            *code == tokio_postgres::error::SqlState::UNDEFINED_TABLE
                || *code == tokio_postgres::error::SqlState::INVALID_SCHEMA_NAME
        })
}

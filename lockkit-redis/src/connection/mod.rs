//! Connections: one reconnecting [`ConnectionManager`] per server, opened by a [`Dialer`]
//! with bounded timeouts; the [`Primary`] that follows a Sentinel-managed primary across
//! failovers (`primary.rs`), as the Sentinels tell (`sentinels.rs`); and the connection an
//! application's runtime drives itself (`caller.rs`).

mod caller;
mod primary;
mod sentinels;

pub(crate) use primary::{Epoch, Primary, sharded_pubsub_in};
pub(crate) use sentinels::Sentinels;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{Error, ErrorKind, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion,
    RedisConnectionInfo,
};

use crate::error::{from_redis, timed_out};

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

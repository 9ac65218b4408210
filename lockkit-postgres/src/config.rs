//! `PostgresConfig`: where the database is, how long to wait for it, and how to log in.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lockkit_core::backend::url::ConnectionUrl;
use lockkit_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The default port of PostgreSQL.
const DEFAULT_PORT: u16 = 5432;

/// The most statement connections a client keeps open.
const MAX_POOL: usize = 64;

/// How to reach a PostgreSQL database; the `[postgres]` table of the lockkit configuration.
///
/// Every field has a default (listed with each field and in `reference.toml`). Build it from a
/// URL with [`PostgresConfig::from_url`] (`postgres://user:password@host:5432/dbname`), from
/// TOML, or field by field. `Debug` never shows the password.
#[non_exhaustive]
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// The servers, as `host:port`. With several, a connection goes to the first that accepts
    /// writes (a primary): list the primary and its standbys, and after a promotion new
    /// connections find the new primary. Default: `["127.0.0.1:5432"]`.
    pub hosts: Vec<String>,
    /// The database whose `lockkit` schema holds the locks. Default: `"postgres"`.
    pub dbname: String,
    /// The role to log in as. Default: `"postgres"`.
    pub user: String,
    /// The role's password. Never logged. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// The longest a connection may take to set up, log-in included. Default: 3 s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// The longest any one statement may take, waiting for a connection included; a server
    /// that does not answer in time gives `Unavailable`. Default: 5 s.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How many connections carry the statements of this client (each pipelines the
    /// statements sent on it). Default: 2.
    pub pool_size: usize,
    /// Wake waiters and election observers by `LISTEN`/`NOTIFY` on one more connection.
    /// Default: `true`. PgBouncer in transaction pooling cannot carry `LISTEN`: behind it,
    /// give the servers themselves in `listen_hosts`, or set `false`, and waiters poll at the
    /// client's `backoff_max` (an election's observer may then miss a leader that leads for
    /// less than that).
    pub listen: bool,
    /// Where the `LISTEN` connection goes, as `host:port`, when `hosts` is a pooler that
    /// cannot carry it (PgBouncer in transaction pooling): the PostgreSQL servers behind it
    /// (with several, the one that accepts writes, where the notifications are sent).
    /// Default: empty, the `hosts`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listen_hosts: Vec<String>,
    /// Create (or upgrade) the `lockkit` schema on first use. Default: `true`. With `false`
    /// a DBA runs `sql/schema.sql` once, and the client checks its version.
    pub create_schema: bool,
    /// Connect over TLS, verifying the server's certificate against `ca_file` and its name
    /// (libpq's `sslmode=verify-full`; lockkit has no weaker TLS mode). Default: `false`.
    pub tls: bool,
    /// A PEM file with the CA certificate(s) that signed the server's certificate. Required
    /// with `tls = true`. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate, for servers that require one (with `key_file`). Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// The PEM private key of `cert_file`. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// The name to verify the server's certificate against, when it differs from the host.
    /// Default: the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_domain: Option<String>,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            hosts: vec![format!("127.0.0.1:{DEFAULT_PORT}")],
            dbname: "postgres".to_owned(),
            user: "postgres".to_owned(),
            password: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            pool_size: 2,
            listen: true,
            listen_hosts: Vec::new(),
            create_schema: true,
            tls: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
            tls_domain: None,
        }
    }
}

impl PostgresConfig {
    /// The default configuration with the hosts, credentials and database of `url`
    /// (`postgres://[user[:password]@]host[:port][,host[:port]...][/dbname]`; `postgresql://`
    /// alike).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for a malformed
    /// URL, another scheme, or invalid values.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut config = PostgresConfig::default();
        config.apply_url(&ConnectionUrl::parse(url)?)?;
        config.validate()?;
        Ok(config)
    }

    /// Takes the hosts (port 5432 when left out), user, password and database (the URL's
    /// path) from `url`, keeping the other fields, and libpq's TLS parameters: `sslmode`
    /// (`disable`, or `verify-full` for `tls = true`), `sslrootcert` (`ca_file`), `sslcert`
    /// and `sslkey`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for a scheme other
    /// than `postgres`/`postgresql`, another query parameter, or an `sslmode` that does not
    /// verify the server (`prefer`, `require`, `verify-ca`).
    pub fn apply_url(&mut self, url: &ConnectionUrl) -> Result<()> {
        if url.scheme != "postgres" && url.scheme != "postgresql" {
            return Err(Error::invalid_config(format!(
                "a PostgreSQL URL starts with postgres:// or postgresql://, not {}://",
                url.scheme
            )));
        }
        for (key, value) in &url.query {
            match key.as_str() {
                "sslmode" => {
                    self.tls = match value.as_str() {
                        "disable" => false,
                        "verify-full" => true,
                        other => {
                            return Err(Error::invalid_config(format!(
                                "sslmode={other} is not offered: lockkit connects either in plain text (disable) or over TLS verifying the server's certificate and name (verify-full)"
                            )));
                        }
                    }
                }
                "sslrootcert" => self.ca_file = Some(PathBuf::from(value)),
                "sslcert" => self.cert_file = Some(PathBuf::from(value)),
                "sslkey" => self.key_file = Some(PathBuf::from(value)),
                other => {
                    return Err(Error::invalid_config(format!(
                        "PostgreSQL URLs take only sslmode, sslrootcert, sslcert and sslkey (got {other:?}); set the [postgres] fields instead"
                    )));
                }
            }
        }
        if !url.hosts.is_empty() {
            self.hosts = url.hosts_with_port(DEFAULT_PORT);
        }
        if let Some(user) = &url.username {
            self.user.clone_from(user);
        }
        if url.password.is_some() {
            self.password.clone_from(&url.password);
        }
        if !url.path.is_empty() {
            self.dbname = url.path.trim_end_matches('/').to_owned();
        }
        Ok(())
    }

    /// Checks the values that serde cannot.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) saying which field
    /// is wrong and why.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::invalid_config(format!("[postgres] {why}")));
        if self.hosts.is_empty() {
            return bad("hosts is empty: list the servers as host:port".into());
        }
        for host in self.hosts.iter().chain(&self.listen_hosts) {
            if split_host(host).is_none() {
                return bad(format!("host {host:?} is not a host:port"));
            }
        }
        if !self.listen && !self.listen_hosts.is_empty() {
            return bad("listen_hosts is set while listen = false".into());
        }
        if self.dbname.is_empty() || self.dbname.contains('\0') {
            return bad(format!("dbname {:?} is not a database name", self.dbname));
        }
        if self.user.is_empty() || self.user.contains('\0') {
            return bad("user is empty".into());
        }
        for (name, value) in [
            ("[postgres] connect_timeout", self.connect_timeout),
            ("[postgres] request_timeout", self.request_timeout),
        ] {
            lockkit_core::backend::validate_duration(name, value)?;
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return bad("cert_file and key_file go together: set both or neither".into());
        }
        if self.tls && self.ca_file.is_none() {
            return bad(
                "tls = true needs ca_file (the CA that signed the server's certificate)".into(),
            );
        }
        let tls_fields =
            self.ca_file.is_some() || self.cert_file.is_some() || self.tls_domain.is_some();
        if tls_fields && !self.tls {
            return bad("ca_file, cert_file, key_file and tls_domain need tls = true".into());
        }
        if !(1..=MAX_POOL).contains(&self.pool_size) {
            return bad(format!(
                "pool_size {} is out of range: 1 to {MAX_POOL} connections",
                self.pool_size
            ));
        }
        Ok(())
    }

    /// The hosts as (host, port) pairs; [`PostgresConfig::validate`] checked them.
    pub(crate) fn host_ports(&self) -> Vec<(String, u16)> {
        self.hosts.iter().filter_map(|h| split_host(h)).collect()
    }

    /// The configuration of the `LISTEN` connection: `listen_hosts` in place of `hosts`,
    /// when set.
    pub(crate) fn for_listening(&self) -> PostgresConfig {
        let mut config = self.clone();
        if !self.listen_hosts.is_empty() {
            config.hosts.clone_from(&self.listen_hosts);
        }
        config
    }
}

/// `host:port` (or `[v6]:port`, or a host alone on the default port) as its parts.
fn split_host(hostport: &str) -> Option<(String, u16)> {
    let (host, port) = match hostport.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') || host.starts_with('[') => {
            (host, port.parse().ok()?)
        }
        _ => (hostport, DEFAULT_PORT),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty() && !host.chars().any(|c| c.is_whitespace() || c.is_control()))
        .then(|| (host.to_owned(), port))
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("hosts", &self.hosts)
            .field("dbname", &self.dbname)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("pool_size", &self.pool_size)
            .field("listen", &self.listen)
            .field("listen_hosts", &self.listen_hosts)
            .field("create_schema", &self.create_schema)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("tls_domain", &self.tls_domain)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_sets_hosts_with_default_port_credentials_and_database() {
        let config =
            PostgresConfig::from_url("postgresql://app:s%40cret@db1,db2:6432/locks").unwrap();
        assert_eq!(config.hosts, vec!["db1:5432", "db2:6432"]);
        assert_eq!(config.user, "app");
        assert_eq!(config.password.as_deref(), Some("s@cret"));
        assert_eq!(config.dbname, "locks");
        assert_eq!(
            config.host_ports(),
            vec![("db1".to_owned(), 5432), ("db2".to_owned(), 6432)]
        );
    }

    #[test]
    fn url_takes_libpq_tls_parameters() {
        let config = PostgresConfig::from_url(
            "postgres://db/locks?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslcert=/c.pem&sslkey=/k.pem",
        )
        .unwrap();
        assert!(config.tls);
        assert_eq!(config.ca_file, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(config.cert_file, Some(PathBuf::from("/c.pem")));
        assert_eq!(config.key_file, Some(PathBuf::from("/k.pem")));
    }

    #[test]
    fn url_without_parts_keeps_the_defaults() {
        let config = PostgresConfig::from_url("postgres://").unwrap();
        assert_eq!(config, PostgresConfig::default());
    }

    #[test]
    fn debug_hides_the_password() {
        let config = PostgresConfig::from_url("postgres://app:hunter2@db/locks").unwrap();
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("<redacted>"),
            "{shown}"
        );
    }

    #[test]
    fn bad_values_are_invalid_config_naming_the_field() {
        for (url_or_field, config) in [
            ("scheme", PostgresConfig::from_url("redis://db").err()),
            (
                "query",
                PostgresConfig::from_url("postgres://db?sslmode=require").err(),
            ),
            (
                "pool_size",
                PostgresConfig {
                    pool_size: 0,
                    ..PostgresConfig::default()
                }
                .validate()
                .err(),
            ),
            (
                "request_timeout",
                PostgresConfig {
                    request_timeout: Duration::ZERO,
                    ..PostgresConfig::default()
                }
                .validate()
                .err(),
            ),
            (
                "hosts",
                PostgresConfig {
                    hosts: vec!["db :1".into()],
                    ..PostgresConfig::default()
                }
                .validate()
                .err(),
            ),
        ] {
            let error = config.unwrap_or_else(|| panic!("{url_or_field} accepted"));
            assert_eq!(error.kind(), lockkit_core::ErrorKind::InvalidConfig);
        }
    }

    #[test]
    fn toml_rejects_unknown_fields_and_reads_durations() {
        let config: PostgresConfig =
            toml::from_str("hosts = [\"db:5433\"]\nrequest_timeout = \"2s\"\nlisten = false")
                .unwrap();
        assert_eq!(config.request_timeout, Duration::from_secs(2));
        assert!(!config.listen);
        assert!(toml::from_str::<PostgresConfig>("hostz = []").is_err());
    }
}

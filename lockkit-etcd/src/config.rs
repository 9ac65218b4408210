//! `EtcdConfig`: where the cluster is, how long to wait for it, and how to log in.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lockkit_core::backend::url::ConnectionUrl;
use lockkit_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The default client port of etcd.
const DEFAULT_PORT: u16 = 2379;

/// How to reach an etcd cluster; the `[etcd]` table of the lockkit configuration.
///
/// Every field has a default (listed with each field and in `reference.toml`). Build it from a
/// URL with [`EtcdConfig::from_url`] (`etcd://user:password@h1:2379,h2:2379/prefix`), from
/// TOML, or field by field. `Debug` never shows the password.
#[non_exhaustive]
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// The cluster members, as `host:port` (or `http://` / `https://` URLs). Requests are
    /// balanced over all of them, so list every member. Default: `["127.0.0.1:2379"]`.
    pub endpoints: Vec<String>,
    /// The key prefix all lock keys live under: a lock is the key range
    /// `<prefix>/<namespace>/<name>/`. Default: `"lockkit"`.
    pub prefix: String,
    /// The longest a TCP (and TLS) connection to one member may take to set up. Default: 3 s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// The longest any one request may take, waiting for a connection included; a cluster
    /// that does not answer in time gives `Unavailable`. Default: 5 s.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Refuse requests at once on a member that has lost its leader, rather than waiting for
    /// an election that may never come (a minority partition). Default: `true`. Such a member
    /// also cancels the watches of queue waiters; with `false` it keeps them open and silent,
    /// so each waiter re-checks the queue once per TTL (load that grows with the waiters).
    pub require_leader: bool,
    /// The user to authenticate as, when the cluster has authentication enabled. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The user's password. Never logged. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Connect over TLS (endpoints without a scheme become `https://`). Default: `false`.
    pub tls: bool,
    /// A PEM file with the CA certificate(s) that signed the members' certificates. Required
    /// with `tls = true`: no public trust roots are built in, as etcd clusters run on private
    /// CAs. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate, for clusters that require client certificates (with
    /// `key_file`). Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// The PEM private key of `cert_file`. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// The name to verify the members' certificates against, when it differs from the
    /// endpoint host. Default: the endpoint host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_domain: Option<String>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec![format!("127.0.0.1:{DEFAULT_PORT}")],
            prefix: "lockkit".to_owned(),
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            require_leader: true,
            user: None,
            password: None,
            tls: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
            tls_domain: None,
        }
    }
}

impl EtcdConfig {
    /// The default configuration with the hosts, credentials and prefix of `url`
    /// (`etcd://[user:password@]host[:port][,host[:port]...][/prefix]`).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for a malformed
    /// URL, a scheme other than `etcd`, or invalid values.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut config = EtcdConfig::default();
        config.apply_url(&ConnectionUrl::parse(url)?)?;
        config.validate()?;
        Ok(config)
    }

    /// Takes the hosts (port 2379 when left out), user, password and prefix (the URL's path)
    /// from `url`, keeping the other fields. Parts the URL does not give are left as they are.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for a scheme other
    /// than `etcd` or query parameters (every option has a field of its own).
    pub fn apply_url(&mut self, url: &ConnectionUrl) -> Result<()> {
        if url.scheme != "etcd" {
            return Err(Error::invalid_config(format!(
                "an etcd URL starts with etcd://, not {}://",
                url.scheme
            )));
        }
        if let Some((key, _)) = url.query.first() {
            return Err(Error::invalid_config(format!(
                "etcd URLs take no query parameters (got {key:?}); set the [etcd] fields instead"
            )));
        }
        if !url.hosts.is_empty() {
            self.endpoints = url.hosts_with_port(DEFAULT_PORT);
        }
        if url.username.is_some() {
            self.user.clone_from(&url.username);
        }
        if url.password.is_some() {
            self.password.clone_from(&url.password);
        }
        if !url.path.is_empty() {
            self.prefix = url.path.trim_end_matches('/').to_owned();
        }
        Ok(())
    }

    /// Checks the values that serde cannot.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) saying which field
    /// is wrong and why.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::invalid_config(format!("[etcd] {why}")));
        if self.endpoints.is_empty() {
            return bad("endpoints is empty: list the cluster members as host:port".into());
        }
        for endpoint in &self.endpoints {
            let host = endpoint
                .strip_prefix("http://")
                .or_else(|| endpoint.strip_prefix("https://"))
                .unwrap_or(endpoint);
            if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return bad(format!("endpoint {endpoint:?} is not a host:port"));
            }
            if self.tls && endpoint.starts_with("http://") {
                return bad(format!(
                    "tls = true, but endpoint {endpoint:?} says http://"
                ));
            }
        }
        if self.prefix.is_empty()
            || self.prefix.starts_with('/')
            || self.prefix.ends_with('/')
            || self
                .prefix
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
            || self.prefix.chars().any(char::is_control)
        {
            return bad(format!(
                "prefix {:?} must be non-empty '/'-separated segments without '.', '..' or control characters",
                self.prefix
            ));
        }
        for (name, value) in [
            ("[etcd] connect_timeout", self.connect_timeout),
            ("[etcd] request_timeout", self.request_timeout),
        ] {
            lockkit_core::backend::validate_duration(name, value)?;
        }
        match (&self.user, &self.password) {
            (Some(user), _) if user.is_empty() => return bad("user is empty".into()),
            (None, Some(_)) => return bad("password is set without a user".into()),
            _ => {}
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return bad("cert_file and key_file go together: set both or neither".into());
        }
        if self.tls && self.ca_file.is_none() {
            return bad(
                "tls = true needs ca_file (the CA that signed the members' certificates)".into(),
            );
        }
        let tls_fields =
            self.ca_file.is_some() || self.cert_file.is_some() || self.tls_domain.is_some();
        if tls_fields && !self.tls {
            return bad(
                "ca_file, cert_file, key_file or tls_domain is set, but tls = false".into(),
            );
        }
        Ok(())
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("require_leader", &self.require_leader)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
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
    use lockkit_core::ErrorKind;

    #[test]
    fn url_sets_hosts_with_default_port_credentials_and_prefix() {
        let config =
            EtcdConfig::from_url("etcd://root:s%40cret@10.0.0.1,10.0.0.2:2380/billing/locks")
                .expect("valid");
        assert_eq!(config.endpoints, ["10.0.0.1:2379", "10.0.0.2:2380"]);
        assert_eq!(config.user.as_deref(), Some("root"));
        assert_eq!(config.password.as_deref(), Some("s@cret"));
        assert_eq!(config.prefix, "billing/locks");
        assert_eq!(config.request_timeout, Duration::from_secs(5));
    }

    #[test]
    fn url_without_parts_keeps_the_defaults() {
        let config = EtcdConfig::from_url("etcd://h").expect("valid");
        assert_eq!(config.prefix, "lockkit");
        assert_eq!(config.user, None);
    }

    #[test]
    fn debug_hides_the_password() {
        let config = EtcdConfig::from_url("etcd://u:hunter2@h").expect("valid");
        let debug = format!("{config:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("***"), "{debug}");
    }

    #[test]
    fn bad_values_are_invalid_config_naming_the_field() {
        let cases: Vec<(&str, EtcdConfig)> = vec![
            (
                "endpoints",
                EtcdConfig {
                    endpoints: vec![],
                    ..EtcdConfig::default()
                },
            ),
            (
                "endpoint",
                EtcdConfig {
                    endpoints: vec!["a b:1".into()],
                    ..EtcdConfig::default()
                },
            ),
            (
                "prefix",
                EtcdConfig {
                    prefix: "/x".into(),
                    ..EtcdConfig::default()
                },
            ),
            (
                "prefix",
                EtcdConfig {
                    prefix: "a/../b".into(),
                    ..EtcdConfig::default()
                },
            ),
            (
                "request_timeout",
                EtcdConfig {
                    request_timeout: Duration::ZERO,
                    ..EtcdConfig::default()
                },
            ),
            (
                "request_timeout must be at most",
                EtcdConfig {
                    request_timeout: Duration::MAX,
                    ..EtcdConfig::default()
                },
            ),
            (
                "password",
                EtcdConfig {
                    password: Some("p".into()),
                    ..EtcdConfig::default()
                },
            ),
            (
                "key_file",
                EtcdConfig {
                    tls: true,
                    ca_file: Some("ca.pem".into()),
                    cert_file: Some("c.pem".into()),
                    ..EtcdConfig::default()
                },
            ),
            (
                "needs ca_file",
                EtcdConfig {
                    tls: true,
                    ..EtcdConfig::default()
                },
            ),
            (
                "tls = false",
                EtcdConfig {
                    ca_file: Some("ca.pem".into()),
                    ..EtcdConfig::default()
                },
            ),
            (
                "http://",
                EtcdConfig {
                    tls: true,
                    ca_file: Some("ca.pem".into()),
                    endpoints: vec!["http://h:2379".into()],
                    ..EtcdConfig::default()
                },
            ),
        ];
        for (needle, config) in cases {
            let err = config.validate().expect_err(needle);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
            assert!(err.to_string().contains(needle), "{needle}: {err}");
        }
        for url in ["redis://h", "etcd://h?tls=1", "etcd://h:notaport"] {
            let err = EtcdConfig::from_url(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
        }
    }

    #[test]
    fn toml_rejects_unknown_fields_and_reads_durations() {
        let config: EtcdConfig =
            toml::from_str("request_timeout = \"750ms\"\nrequire_leader = false").expect("valid");
        assert_eq!(config.request_timeout, Duration::from_millis(750));
        assert!(!config.require_leader);
        assert!(toml::from_str::<EtcdConfig>("timeout = \"1s\"").is_err());
    }
}

//! `ZkConfig`: where the ensemble is, the session, credentials and ACLs; the `[zk]` table of
//! the facade's configuration.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lockkit_core::backend::url::ConnectionUrl;
use lockkit_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// Who may touch the lock nodes and their parents.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ZkAcl {
    /// [`ZkAcl::Creator`] when credentials are configured, [`ZkAcl::Open`] otherwise.
    Auto,
    /// `world:anyone` has every permission: any client of the ensemble can read, create and
    /// delete lock nodes (and so break a lock by hand).
    Open,
    /// Only the authenticated identity that created a node may touch it (`auth` scheme, all
    /// permissions). Clients without the credentials can neither see nor delete the locks.
    /// Needs `username` and `password`.
    Creator,
}

/// Configuration of a [`ZkBackend`](crate::ZkBackend).
///
/// Every field has a default (listed on the field and in the facade's `reference.toml`).
/// `Debug` never shows the password; the TLS fields are file paths, so no key material is
/// ever held in the configuration.
///
/// ```
/// use lockkit_zk::ZkConfig;
///
/// let config = ZkConfig::from_url("zk://app:secret@z1:2181,z2:2181,z3:2181/locks").unwrap();
/// assert_eq!(config.hosts, ["z1:2181", "z2:2181", "z3:2181"]);
/// assert_eq!(config.chroot, "/locks");
/// assert!(!format!("{config:?}").contains("secret"));
/// ```
///
/// TLS (cargo feature `tls`) to the servers' `secureClientPort`: `zks://` (or `tls = true`)
/// plus the CA that signed the servers' certificates, which a URL cannot carry:
///
/// ```
/// # #[cfg(feature = "tls")] {
/// use lockkit_core::backend::url::ConnectionUrl;
/// use lockkit_zk::ZkConfig;
///
/// let mut config = ZkConfig::default();
/// config.ca_file = Some("/etc/lockkit/zk-ca.pem".into());
/// config.apply_url(&ConnectionUrl::parse("zks://z1:2281,z2:2281,z3:2281/locks").unwrap()).unwrap();
/// assert!(config.tls);
/// # }
/// ```
#[non_exhaustive]
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ZkConfig {
    /// The ensemble's servers as `host:port`; the client connects to one of them and fails
    /// over to the others. Default: `["127.0.0.1:2181"]`.
    pub hosts: Vec<String>,
    /// The absolute znode under which every lock lives (created as a persistent node, with
    /// the configured ACL, when missing: at session start, and again when the server has
    /// deleted it, as it does with a chroot another client created as a container). Locks are `{chroot}/{namespace}/{key}/_c_{id}-lock-{sequence}`, `{id}`
    /// a digest of the secret owner token.
    /// Default: `"/lockkit"`.
    pub chroot: String,
    /// The session timeout asked of the servers (they clamp it to their
    /// `[minSessionTimeout, maxSessionTimeout]`). A crashed holder blocks its locks this long.
    /// Default: 10 s.
    #[serde(with = "humantime_serde")]
    pub session_timeout: Duration,
    /// How long a disconnected session may stay away, as a fraction of the negotiated session
    /// timeout, before its locks are reported lost. The client notices a dead connection
    /// after 2/5 of the session timeout without an answer, so the lost signal fires at most
    /// `(0.4 + fraction) × session_timeout` after the last contact with the ensemble. A grant
    /// or renewal is trusted for at most `(0.6 − fraction) × session_timeout` (and never more
    /// than half of it, nor more than the lock's ttl): a larger fraction rides out longer
    /// disconnections and renews more often. 0 fires on the first disconnect (Curator's
    /// strict policy). Must be in `[0, 0.5]`. Default: 0.3.
    pub suspended_grace_fraction: f64,
    /// The longest a connection attempt (at start-up and after a session expired) may take.
    /// Default: 10 s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// The longest one request may take before it fails with `Unavailable`. Default: 5 s.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long a lock's parent znode stays after this backend last released the lock,
    /// before the backend deletes it (the server refuses while anyone queues, and removes
    /// parents left by a crashed backend itself, as empty container nodes). Default: 1 s.
    #[serde(with = "humantime_serde")]
    pub empty_parent_linger: Duration,
    /// The user of ZooKeeper `digest` authentication. Default: none.
    pub username: Option<String>,
    /// The password of `digest` authentication; never logged. Default: none.
    pub password: Option<String>,
    /// Who may touch the lock nodes and their parents. Default: `auto` (creator-only with
    /// credentials, open without).
    pub acl: ZkAcl,
    /// Connect over TLS, to the servers' `secureClientPort` (list those ports in `hosts`).
    /// Needs the cargo feature `tls`; without it, `true` is an `InvalidConfig` error, never a
    /// plaintext connection. A `zks://` URL sets it. Each server's certificate must be valid
    /// for its host as written in `hosts` (a DNS name or IP address in its subject
    /// alternative names). Default: `false`.
    pub tls: bool,
    /// A PEM file with the CA certificate(s) that signed the servers' certificates (and any
    /// CRLs to check them against). Required with `tls = true`: no public trust roots are
    /// built in, as ZooKeeper ensembles run on private CAs. Read at every session start, so
    /// a replaced file applies to the next session. Default: none.
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate (chain), for servers that ask for one (ZooKeeper's
    /// `ssl.clientAuth` is `need` by default); with `key_file`. The server also authenticates
    /// the client as its certificate's subject (scheme `x509`). Default: none.
    pub cert_file: Option<PathBuf>,
    /// The PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1). Only its path is kept in
    /// the configuration. Default: none.
    pub key_file: Option<PathBuf>,
}

impl Default for ZkConfig {
    fn default() -> Self {
        ZkConfig {
            hosts: vec!["127.0.0.1:2181".to_owned()],
            chroot: "/lockkit".to_owned(),
            session_timeout: Duration::from_secs(10),
            suspended_grace_fraction: 0.3,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            empty_parent_linger: Duration::from_secs(1),
            username: None,
            password: None,
            acl: ZkAcl::Auto,
            tls: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
        }
    }
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("session_timeout", &self.session_timeout)
            .field("suspended_grace_fraction", &self.suspended_grace_fraction)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("empty_parent_linger", &self.empty_parent_linger)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("acl", &self.acl)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

impl ZkConfig {
    /// A configuration from a `zk://[user:password@]host1:port,host2:port[/chroot]` URL, with
    /// defaults for everything the URL does not say. `zks://` is the same over TLS, which
    /// also needs `ca_file`: use [`ZkConfig::apply_url`] on a configuration that has it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for a malformed
    /// URL, another scheme or an invalid value.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut config = ZkConfig::default();
        config.apply_url(&ConnectionUrl::parse(url)?)?;
        Ok(config)
    }

    /// Takes the hosts, the credentials and the chroot (the URL's path) from `url`; the
    /// other fields keep their values. A URL without a path keeps the configured chroot.
    /// `zks://` sets `tls` (like `rediss://`); `zk://` leaves it as configured.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for a scheme other
    /// than `zk` or `zks`, a URL without hosts, query parameters, or an invalid result (such
    /// as `zks://` without `ca_file`, or without the cargo feature `tls`).
    pub fn apply_url(&mut self, url: &ConnectionUrl) -> Result<()> {
        match url.scheme.as_str() {
            "zk" => {}
            "zks" => self.tls = true,
            other => {
                return Err(Error::invalid_config(format!(
                    "the zk backend takes zk:// (or zks:// for TLS) URLs, not {other}://"
                )));
            }
        }
        if url.hosts.is_empty() {
            return Err(Error::invalid_config(format!(
                "{url} names no ZooKeeper server: expected zk://host1:2181,host2:2181/chroot"
            )));
        }
        if let Some((key, _)) = url.query.first() {
            return Err(Error::invalid_config(format!(
                "zk:// URLs take no query parameters (got {key:?}); set options in the [zk] table (zks:// for TLS)"
            )));
        }
        self.hosts = url
            .hosts
            .iter()
            .map(|h| match h.port {
                Some(_) => h.to_string(),
                None => format!("{h}:2181"),
            })
            .collect();
        if url.username.is_some() || url.password.is_some() {
            self.username.clone_from(&url.username);
            self.password.clone_from(&url.password);
        }
        let path = url.path.trim_end_matches('/');
        if !path.is_empty() {
            self.chroot = format!("/{path}");
        }
        self.validate()
    }

    /// Checks that the values make sense together.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) saying which field
    /// is wrong and why.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::invalid_config(format!("[zk] {why}")));
        if self.hosts.is_empty() {
            return bad("hosts is empty: name at least one server".into());
        }
        for host in &self.hosts {
            let valid = host.rsplit_once(':').is_some_and(|(name, port)| {
                !name.is_empty()
                    && !name.contains([',', '/', ' '])
                    && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !valid {
                return bad(format!("hosts: {host:?} is not host:port"));
            }
        }
        let chroot_ok = self.chroot.starts_with('/')
            && self.chroot.len() > 1
            && !self.chroot.ends_with('/')
            && self.chroot[1..]
                .split('/')
                .all(|segment| lockkit_core::backend::validate_segment("chroot", segment).is_ok())
            && self.chroot != "/zookeeper"
            && !self.chroot.starts_with("/zookeeper/");
        if !chroot_ok {
            return bad(format!(
                "chroot {:?} must be an absolute znode path such as \"/lockkit\" (not / and not under /zookeeper)",
                self.chroot
            ));
        }
        if self.session_timeout < Duration::from_millis(100) {
            return bad(format!(
                "session_timeout {:?} is too short",
                self.session_timeout
            ));
        }
        if !(0.0..=0.5).contains(&self.suspended_grace_fraction) {
            return bad(format!(
                "suspended_grace_fraction {} must be between 0 and 0.5, so the lost signal fires before the session can expire",
                self.suspended_grace_fraction
            ));
        }
        for (name, value) in [
            ("[zk] connect_timeout", self.connect_timeout),
            ("[zk] request_timeout", self.request_timeout),
            ("[zk] session_timeout", self.session_timeout),
        ] {
            lockkit_core::backend::validate_duration(name, value)?;
        }
        match (&self.username, &self.password) {
            (Some(user), Some(_)) if user.is_empty() || user.contains(':') => {
                return bad("username must be non-empty and contain no ':'".into());
            }
            (Some(_), None) | (None, Some(_)) => {
                return bad("username and password go together (digest authentication)".into());
            }
            _ => {}
        }
        if self.acl == ZkAcl::Creator && self.username.is_none() {
            return bad("acl = \"creator\" needs username and password".into());
        }
        self.validate_tls()
    }

    fn validate_tls(&self) -> Result<()> {
        let bad = |why: &str| Err(Error::invalid_config(format!("[zk] {why}")));
        if self.tls && !cfg!(feature = "tls") {
            return bad(
                "tls = true (or a zks:// URL) needs the cargo feature `tls` of lockkit-zk (the `tls` feature of lockkit); refusing to connect in plaintext",
            );
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return bad("cert_file and key_file go together: set both or neither");
        }
        if !self.tls && (self.ca_file.is_some() || self.cert_file.is_some()) {
            return bad("ca_file, cert_file or key_file is set, but tls = false (zks:// sets it)");
        }
        if self.tls && self.ca_file.is_none() {
            return bad("tls = true needs ca_file (the CA that signed the servers' certificates)");
        }
        #[cfg(feature = "tls")]
        if self.tls {
            crate::tls::check_hosts(&self.hosts)?;
        }
        Ok(())
    }

    /// Whether nodes get the creator-only ACL.
    pub(crate) fn creator_only(&self) -> bool {
        match self.acl {
            ZkAcl::Auto => self.username.is_some(),
            ZkAcl::Open => false,
            ZkAcl::Creator => true,
        }
    }

    /// The connect string the client takes: `host:port,host:port`.
    pub(crate) fn connect_string(&self) -> String {
        self.hosts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        ZkConfig::default().validate().expect("defaults");
    }

    #[test]
    fn url_sets_hosts_credentials_and_chroot() {
        let config = ZkConfig::from_url("zk://u:p%40ss@a:1,b/x/y").expect("url");
        assert_eq!(config.hosts, ["a:1", "b:2181"]);
        assert_eq!(config.username.as_deref(), Some("u"));
        assert_eq!(config.password.as_deref(), Some("p@ss"));
        assert_eq!(config.chroot, "/x/y");
        assert!(config.creator_only());
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("p@ss") && debug.contains("redacted"),
            "{debug}"
        );
    }

    #[test]
    fn url_without_path_keeps_the_chroot() {
        let config = ZkConfig::from_url("zk://a:1").expect("url");
        assert_eq!(config.chroot, "/lockkit");
        assert!(!config.creator_only());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn zks_url_sets_tls_and_zk_url_keeps_the_tables_choice() {
        let mut config = ZkConfig {
            ca_file: Some("/etc/zk-ca.pem".into()),
            ..ZkConfig::default()
        };
        config
            .apply_url(&ConnectionUrl::parse("zks://z1:2281,z2:2281/x").expect("url"))
            .expect("zks:// with a ca_file");
        assert!(config.tls);
        assert_eq!(config.hosts, ["z1:2281", "z2:2281"]);
        let mut plain_url = config.clone();
        plain_url
            .apply_url(&ConnectionUrl::parse("zk://z3:2281").expect("url"))
            .expect("zk:// on a tls table");
        assert!(plain_url.tls, "zk:// does not switch TLS off");
        let debug = format!("{config:?}");
        assert!(
            debug.contains("tls: true") && debug.contains("zk-ca.pem"),
            "{debug}"
        );
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_without_the_feature_is_invalid_config_naming_the_feature() {
        let mut with_ca = ZkConfig {
            ca_file: Some("ca.pem".into()),
            ..ZkConfig::default()
        };
        for err in [
            ZkConfig::from_url("zks://a:1").expect_err("zks:// without the feature"),
            with_ca
                .apply_url(&ConnectionUrl::parse("zks://a:1").expect("url"))
                .expect_err("zks:// without the feature"),
        ] {
            assert_eq!(err.kind(), lockkit_core::ErrorKind::InvalidConfig);
            assert!(err.message().contains("cargo feature `tls`"), "{err}");
        }
    }

    #[test]
    fn tls_fields_must_be_consistent() {
        let needs_ca = ZkConfig {
            tls: true,
            ..ZkConfig::default()
        };
        let key_alone = ZkConfig {
            tls: true,
            ca_file: Some("ca.pem".into()),
            key_file: Some("client.key".into()),
            ..ZkConfig::default()
        };
        let ca_without_tls = ZkConfig {
            ca_file: Some("ca.pem".into()),
            ..ZkConfig::default()
        };
        for (config, needle) in [
            (
                needs_ca,
                if cfg!(feature = "tls") {
                    "needs ca_file"
                } else {
                    "feature `tls`"
                },
            ),
            (
                key_alone,
                if cfg!(feature = "tls") {
                    "go together"
                } else {
                    "feature `tls`"
                },
            ),
            (ca_without_tls, "tls = false"),
        ] {
            let err = config.validate().expect_err(needle);
            assert_eq!(err.kind(), lockkit_core::ErrorKind::InvalidConfig);
            assert!(err.message().contains(needle), "{err} lacks {needle:?}");
        }
    }

    #[test]
    fn bad_values_are_invalid_config() {
        for url in [
            "etcd://a:1",
            "zk://",
            "zk://a:1/?x=1",
            "zk://a:1/zookeeper",
            "zk://a:1/a//b",
            "zk://user@a:1",
            "zks://a:1",
            "zk+tls://a:1",
        ] {
            let err = ZkConfig::from_url(url).expect_err(url);
            assert_eq!(
                err.kind(),
                lockkit_core::ErrorKind::InvalidConfig,
                "{url}: {err}"
            );
        }
        let config = ZkConfig {
            suspended_grace_fraction: 0.9,
            ..ZkConfig::default()
        };
        assert!(config.validate().is_err());
        let config = ZkConfig {
            acl: ZkAcl::Creator,
            ..ZkConfig::default()
        };
        assert!(config.validate().is_err());
        let config = ZkConfig {
            hosts: vec!["nohost".into()],
            ..ZkConfig::default()
        };
        assert!(config.validate().is_err());
        for (field, config) in [
            (
                "[zk] session_timeout",
                ZkConfig {
                    session_timeout: Duration::MAX,
                    ..ZkConfig::default()
                },
            ),
            (
                "[zk] request_timeout",
                ZkConfig {
                    request_timeout: Duration::ZERO,
                    ..ZkConfig::default()
                },
            ),
        ] {
            let message = config.validate().expect_err(field).to_string();
            assert!(message.contains(field), "{message}");
        }
    }
}

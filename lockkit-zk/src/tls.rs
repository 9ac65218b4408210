//! TLS to the ensemble (cargo feature `tls`): the client's TLS options from the configured
//! PEM files, checked before any connection so that a bad file is an `InvalidConfig` error
//! rather than a connection that keeps failing.

use std::path::Path;

use lockkit_core::{Error, Result};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use zookeeper_client as zk;

use crate::config::ZkConfig;

/// The client's TLS options: trust `ca_file`, present `cert_file`/`key_file` when set.
///
/// # Errors
/// `InvalidConfig` for an unreadable or malformed file, or a key that is not the
/// certificate's.
pub(crate) fn options(config: &ZkConfig) -> Result<zk::TlsOptions> {
    // zookeeper-client builds its rustls config with the process-wide provider. rustls is
    // compiled with two providers here (ring, and aws-lc-rs that zookeeper-client's rustls
    // dependency enables by default), so none is picked implicitly: install ring, as
    // lockkit-redis does, unless the application installed one already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(ca_file) = &config.ca_file else {
        return Err(Error::invalid_config(
            "[zk] tls = true needs ca_file (the CA that signed the servers' certificates)",
        ));
    };
    let ca = read(ca_file)?;
    let mut options = zk::TlsOptions::new()
        .with_pem_ca(&ca)
        .map_err(|e| bad_file(ca_file, &e))?;
    if let (Some(cert_file), Some(key_file)) = (&config.cert_file, &config.key_file) {
        let cert = read(cert_file)?;
        let key = read(key_file)?;
        check_identity(cert_file, &cert, key_file, &key)?;
        options = options
            .with_pem_identity(&cert, &key)
            .map_err(|e| bad_file(key_file, &e))?;
    }
    Ok(options)
}

/// Checks that every host is a name a certificate can be checked against; the client
/// would panic on one that is not.
pub(crate) fn check_hosts(hosts: &[String]) -> Result<()> {
    for host in hosts {
        let name = host
            .rsplit_once(':')
            .map_or(host.as_str(), |(name, _)| name);
        let name = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(name);
        if ServerName::try_from(name).is_err() {
            return Err(Error::invalid_config(format!(
                "[zk] hosts: {name:?} is neither a DNS name nor an IP address, so no server certificate can be checked against it"
            )));
        }
    }
    Ok(())
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::invalid_config(format!("[zk] cannot read {}: {e}", path.display())))
}

fn bad_file(path: &Path, err: &dyn std::fmt::Display) -> Error {
    Error::invalid_config(format!("[zk] {}: {err}", path.display()))
}

/// zookeeper-client reports a key that does not match the certificate only when it
/// connects, as a connection error; checking here makes it a configuration error.
fn check_identity(cert_file: &Path, cert: &str, key_file: &Path, key: &str) -> Result<()> {
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad_file(cert_file, &e))?;
    if chain.is_empty() {
        return Err(bad_file(cert_file, &"no PEM certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| bad_file(key_file, &e))?;
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| rustls::crypto::ring::default_provider().into());
    rustls::sign::CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
        Error::invalid_config(format!(
            "[zk] key_file {} does not fit cert_file {}: {e}",
            key_file.display(),
            cert_file.display()
        ))
    })?;
    Ok(())
}

//! TLS to the server (`tls = true`, or `sslmode=verify-full` in a URL): rustls with ring,
//! trusting only the configured CA, checking the server's name, and presenting a client
//! certificate when one is configured. The PEM files are read and checked when the backend is
//! made, so that a bad file is an `InvalidConfig` error rather than a connection that keeps
//! failing.
//!
//! lockkit always verifies the certificate and the name (libpq's `verify-full`): a TLS
//! connection to a server that anyone between could impersonate would protect the password
//! no better than plain text.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use lockkit_core::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use crate::config::PostgresConfig;

/// How connections are made: plain, or TLS with this client configuration.
#[derive(Clone)]
pub(crate) struct Transport {
    tls: Option<Arc<rustls::ClientConfig>>,
    domain: Option<String>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("tls", &self.tls.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

impl Transport {
    /// The transport of `config`.
    ///
    /// # Errors
    /// `InvalidConfig` for an unreadable or malformed file, or a key that is not the
    /// certificate's.
    pub(crate) fn of(config: &PostgresConfig) -> Result<Transport> {
        if !config.tls {
            return Ok(Transport {
                tls: None,
                domain: None,
            });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let Some(ca_file) = &config.ca_file else {
            return Err(Error::invalid_config(
                "[postgres] tls = true needs ca_file (the CA that signed the server's certificate)",
            ));
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates(ca_file)? {
            roots.add(cert).map_err(|e| bad_file(ca_file, &e))?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::invalid_config(format!("[postgres] TLS: {e}")))?
            .with_root_certificates(roots);
        let client = match (&config.cert_file, &config.key_file) {
            (Some(cert_file), Some(key_file)) => {
                let key =
                    PrivateKeyDer::from_pem_file(key_file).map_err(|e| bad_file(key_file, &e))?;
                builder
                    .with_client_auth_cert(certificates(cert_file)?, key)
                    .map_err(|e| {
                        Error::invalid_config(format!(
                            "[postgres] key_file {} does not fit cert_file {}: {e}",
                            key_file.display(),
                            cert_file.display()
                        ))
                    })?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Transport {
            tls: Some(Arc::new(client)),
            domain: config.tls_domain.clone(),
        })
    }

    /// Whether connections use TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<std::result::Result<Vec<_>, _>>)
        .map_err(|e| bad_file(path, &e))?;
    if certs.is_empty() {
        return Err(bad_file(path, &"no PEM certificate in it"));
    }
    Ok(certs)
}

fn bad_file(path: &Path, err: &dyn std::fmt::Display) -> Error {
    Error::invalid_config(format!("[postgres] {}: {err}", path.display()))
}

impl<S> MakeTlsConnect<S> for Transport
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type TlsConnect = Connect;
    type Error = io::Error;

    /// Called for every host, TLS or not (the connection asks for a handshake only with
    /// TLS configured, `SslMode::Require`).
    fn make_tls_connect(&mut self, host: &str) -> io::Result<Connect> {
        let Some(config) = self.tls.clone() else {
            return Ok(Connect(None));
        };
        let name = self.domain.as_deref().unwrap_or(host).to_owned();
        let name = ServerName::try_from(name)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(Connect(Some((config, name))))
    }
}

/// One TLS handshake to come, if TLS is configured.
pub(crate) struct Connect(Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>);

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let Some((config, name)) = self.0 else {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "TLS is not configured",
                ));
            };
            let connector = tokio_rustls::TlsConnector::from(config);
            Ok(TlsStream(connector.connect(name, stream).await?))
        })
    }
}

/// A TLS session over a connection.
pub(crate) struct TlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for TlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM without channel binding: the verified certificate already binds the session
        // to the server, and the binding's hash would have to follow the certificate's
        // signature algorithm.
        ChannelBinding::none()
    }
}

//! TLS against a private server that refuses plain text (ports 22200-22220): the configured
//! CA and the server's name are checked, a client certificate is presented when configured,
//! and every wrong setting fails with a clear error.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod support;

use std::path::PathBuf;

use lockkit_core::{ErrorKind, LockClient, testing};
use lockkit_postgres::{PostgresBackend, PostgresConfig};
use support::private::PrivatePostgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verifies_the_server_and_plain_text_is_refused() {
    let certs = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lk-pg-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&certs);
    if testing::tls_certificates(&certs).is_none() {
        return;
    }
    let Some(server) = PrivatePostgres::start(
        "tls",
        22200..22220,
        "ssl = on\nssl_cert_file = 'server.pem'\nssl_key_file = 'server.key'\nssl_ca_file = 'ca.pem'\n",
        "hostssl all all 127.0.0.1/32 scram-sha-256\nhostnossl all all 127.0.0.1/32 reject",
        &[
            &certs.join("server.pem"),
            &certs.join("server.key"),
            &certs.join("ca.pem"),
        ],
    ) else {
        return;
    };
    let ca = certs.join("ca.pem");
    let verified = PostgresConfig::from_url(&server.url(&format!(
        "?sslmode=verify-full&sslrootcert={}",
        ca.display()
    )))
    .unwrap();
    let locks = LockClient::new(PostgresBackend::connect(verified.clone()).await.unwrap());
    let guard = locks.mutex("job").unwrap().lock().await.unwrap();
    assert!(guard.release().await.unwrap());

    // With a client certificate too.
    let mut mutual = verified.clone();
    mutual.cert_file = Some(certs.join("client.pem"));
    mutual.key_file = Some(certs.join("client.key"));
    PostgresBackend::connect(mutual).await.unwrap();

    let plain = PostgresConfig::from_url(&server.url("")).unwrap();
    let err = PostgresBackend::connect(plain)
        .await
        .expect_err("plain text");
    assert_eq!(err.kind(), ErrorKind::Auth, "{}", err.display_chain());

    let mut unknown_ca = verified.clone();
    unknown_ca.ca_file = Some(certs.join("other.pem"));
    let err = PostgresBackend::connect(unknown_ca)
        .await
        .expect_err("unknown CA");
    assert!(
        err.display_chain().to_string().contains("certificate"),
        "{}",
        err.display_chain()
    );

    let mut wrong_name = verified.clone();
    wrong_name.tls_domain = Some("db.example".into());
    let err = PostgresBackend::connect(wrong_name)
        .await
        .expect_err("wrong name");
    assert!(
        err.display_chain().to_string().contains("certificate"),
        "{}",
        err.display_chain()
    );

    for (what, change) in [
        (
            "missing ca_file",
            Box::new(|c: &mut PostgresConfig| {
                c.ca_file = Some(PathBuf::from("/nonexistent/ca.pem"))
            }) as Box<dyn Fn(&mut PostgresConfig)>,
        ),
        (
            "a key that is not the certificate's",
            Box::new(|c: &mut PostgresConfig| {
                c.cert_file = Some(certs.join("client.pem"));
                c.key_file = Some(certs.join("other.key"));
            }),
        ),
        (
            "no PEM in ca_file",
            Box::new(|c: &mut PostgresConfig| c.ca_file = Some(certs.join("san.ext"))),
        ),
    ] {
        let mut config = verified.clone();
        change(&mut config);
        let err = PostgresBackend::connect(config).await.expect_err(what);
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{what}: {err}");
    }
    drop(locks);
    drop(server);
    let _ = std::fs::remove_dir_all(&certs);
}

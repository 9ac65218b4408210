//! Credentials, the least rights a lock role needs, and secrets, against the server of
//! `compose/up.sh postgres` (SCRAM over TCP). Each test makes a role of its own, with a random
//! password, and drops it at the end.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::testing::{
    TraceCapture, assert_nothing_shown, exercise, owner_token_spellings, secret_spellings,
};
use lockkit_core::{ErrorKind, LockClient, LockOptions};
use lockkit_postgres::tokio_postgres::error::SqlState;
use lockkit_postgres::{PostgresBackend, PostgresConfig};

/// A login role made for one test, dropped with [`Role::drop_it`].
struct Role {
    name: String,
    password: String,
    admin: lockkit_postgres::tokio_postgres::Client,
    server: PostgresConfig,
}

impl Role {
    /// A role with the rights `sql/grants.sql` gives (`granted`), or with none.
    async fn make(server: PostgresConfig, granted: bool) -> Role {
        // The schema exists once a backend connected with the administrator's rights.
        PostgresBackend::connect(server.clone()).await.unwrap();
        let admin = support::admin(&server).await;
        let name = format!("lk_role_{:08x}", rand::random::<u32>());
        let password = format!("pw-{:032x}", rand::random::<u128>());
        admin
            .batch_execute(&format!("CREATE ROLE {name} LOGIN PASSWORD '{password}'"))
            .await
            .unwrap();
        if granted {
            let grants = include_str!("../sql/grants.sql").replace(":\"role\"", &name);
            admin.batch_execute(&serialized(&grants)).await.unwrap();
        }
        Role {
            name,
            password,
            admin,
            server,
        }
    }

    fn config(&self, password: &str) -> PostgresConfig {
        let mut config = self.server.clone();
        config.user.clone_from(&self.name);
        config.password = Some(password.to_owned());
        config.create_schema = false;
        config
    }

    async fn drop_it(self) {
        self.admin
            .batch_execute(&serialized(&format!(
                "DROP OWNED BY {0}; DROP ROLE {0};",
                self.name
            )))
            .await
            .unwrap();
    }
}

/// `sql` in one transaction that first waits for the other tests' changes of privileges: two
/// transactions that grant or revoke on the same functions at once fail ("tuple concurrently
/// updated").
fn serialized(sql: &str) -> String {
    format!("BEGIN; SELECT pg_advisory_xact_lock(7311); {sql} COMMIT;")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_auth_error_and_no_server_is_unavailable_in_time() {
    let Some(server) = support::server_config().await else {
        return;
    };
    let role = Role::make(server.clone(), true).await;
    let err = PostgresBackend::connect(role.config("not-the-password"))
        .await
        .expect_err("a wrong password");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!err.to_string().contains("not-the-password"), "{err}");

    let mut nowhere = server.clone();
    // A port nothing listens on, and an address that drops packets: both end within the
    // connect timeout, as Unavailable.
    for hosts in [
        vec!["127.0.0.1:1".to_owned()],
        vec!["10.255.255.1:5432".to_owned()],
    ] {
        nowhere.hosts = hosts;
        nowhere.connect_timeout = Duration::from_millis(500);
        let started = Instant::now();
        let err = PostgresBackend::connect(nowhere.clone())
            .await
            .expect_err("no server");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(
            started.elapsed() < nowhere.connect_timeout + Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }
    role.drop_it().await;
}

/// A role whose transactions default to REPEATABLE READ would take its snapshot before the
/// key's advisory lock, and two attempts could both find the key free: every statement that
/// changes a queue refuses it, with a clear error, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_defaults_to_repeatable_read_is_refused() {
    let Some(server) = support::server_config().await else {
        return;
    };
    let role = Role::make(server.clone(), true).await;
    role.admin
        .batch_execute(&format!(
            "ALTER ROLE {} SET default_transaction_isolation = 'repeatable read'",
            role.name
        ))
        .await
        .unwrap();
    let backend = PostgresBackend::connect(role.config(&role.password))
        .await
        .unwrap();
    let ns = format!("lk-isolation-{:08x}", rand::random::<u32>());
    let locks = LockClient::with_options(Arc::new(backend), &ns, LockOptions::default()).unwrap();
    let err = locks
        .mutex("job")
        .unwrap()
        .try_lock()
        .await
        .expect_err("an attempt under REPEATABLE READ");
    assert!(
        err.display_chain().to_string().contains("READ COMMITTED"),
        "{err}"
    );
    assert!(support::rows_under(&role.admin, &ns).await.is_empty());
    role.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_granted_functions_are_enough_and_the_rows_stay_closed() {
    let Some(server) = support::server_config().await else {
        return;
    };
    let role = Role::make(server.clone(), true).await;
    let backend = PostgresBackend::connect(role.config(&role.password))
        .await
        .unwrap();
    let ns = format!("lk-rights-{:08x}", rand::random::<u32>());
    let locks = LockClient::with_options(Arc::new(backend), &ns, LockOptions::default()).unwrap();
    let guard = locks.mutex("job").unwrap().lock().await.unwrap();
    let permit = locks
        .semaphore("slots", 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let reader = locks.rwlock("table").unwrap().read().await.unwrap();
    guard.extend().await.unwrap();
    assert_eq!(locks.list_page("", None, 10).await.unwrap().locks.len(), 1);
    assert!(guard.release().await.unwrap());
    assert!(permit.release().await.unwrap());
    assert!(reader.release().await.unwrap());

    let raw = support::admin(&role.config(&role.password)).await;
    for sql in [
        "SELECT owner FROM lockkit.entries",
        "INSERT INTO lockkit.entries VALUES ('x', 'y', 0, 1, 'o', 0, 0, now() + interval '1 h', true, NULL)",
        "SELECT nextval('lockkit.fence')",
    ] {
        let err = raw.batch_execute(sql).await.expect_err(sql);
        assert_eq!(
            err.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {err}"
        );
    }

    let bare = Role::make(server, false).await;
    let err = PostgresBackend::connect(bare.config(&bare.password))
        .await
        .expect_err("a role without the grants");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    bare.drop_it().await;
    role.drop_it().await;
}

/// No password and no owner token in the `Debug` of configurations, backends, clients,
/// guards and leases, in the error of a wrong password, or in a TRACE capture of a whole
/// cycle; and the server holds the owner token's digest, never the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_owner_tokens_stay_out_of_output_traces_and_rows() {
    let capture = TraceCapture::install();
    let Some(server) = support::server_config().await else {
        return;
    };
    let role = Role::make(server.clone(), true).await;
    let ttl = Duration::from_secs(2);
    let ns = format!("sec-{:08x}", rand::random::<u32>());
    let config = role.config(&role.password);
    let mut shown = vec![format!("{config:?}")];
    let connect = || async {
        let backend = PostgresBackend::connect(config.clone()).await.unwrap();
        LockClient::with_options(Arc::new(backend), &ns, LockOptions::default().with_ttl(ttl))
            .unwrap()
    };
    let (locks, other) = (connect().await, connect().await);
    let guard = locks.mutex("job").unwrap().lock().await.unwrap();
    let owner = lockkit_core::backend::lease_of(&guard).owner();
    let stored: String = role
        .admin
        .query_one(
            "SELECT owner FROM lockkit.entries WHERE namespace = $1",
            &[&ns],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, owner.digest_hex(), "the row holds {stored:?}");
    let mut secrets = owner_token_spellings(owner);
    assert!(guard.release().await.unwrap());
    let (tokens, more) = exercise(&locks, &other, ttl).await;
    secrets.extend(tokens);
    shown.extend(more);

    let wrong = role.config(&format!("wrong-{:032x}", rand::random::<u128>()));
    let err = PostgresBackend::connect(wrong.clone())
        .await
        .expect_err("a wrong password");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    shown.push(format!("{err} {err:?} {wrong:?}"));
    for password in [&role.password, wrong.password.as_ref().unwrap()] {
        secrets.extend(secret_spellings(password));
    }
    assert_nothing_shown(&capture, &ns, &shown, &secrets);
    drop((locks, other));
    role.drop_it().await;
}

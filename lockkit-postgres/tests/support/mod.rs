//! What the PostgreSQL test files share: finding the test server and reading its rows.

#![allow(dead_code, unreachable_pub)]

pub mod harness;
pub mod private;

use lockkit_core::testing;
use lockkit_postgres::tokio_postgres::{self, NoTls};
use lockkit_postgres::{PostgresBackend, PostgresConfig};

/// The configuration of the `compose/up.sh postgres` server, or `None` (after
/// [`testing::backend_missing`]) when it is not up.
pub async fn server_config() -> Option<PostgresConfig> {
    let Some(url) = testing::endpoint("LOCKKIT_TEST_POSTGRES_URL") else {
        testing::backend_missing("PostgreSQL (LOCKKIT_TEST_POSTGRES_URL)");
        return None;
    };
    let config = PostgresConfig::from_url(&url).expect("LOCKKIT_TEST_POSTGRES_URL is a valid URL");
    match PostgresBackend::connect(config.clone()).await {
        Ok(_) => Some(config),
        Err(e) => {
            testing::backend_missing(&format!("PostgreSQL at {url} ({e})"));
            None
        }
    }
}

/// A plain connection to the server of `config`, as its administrator (the tests' role owns
/// the schema), driven by a task of the current runtime.
pub async fn admin(config: &PostgresConfig) -> tokio_postgres::Client {
    let mut pg = tokio_postgres::Config::new();
    for host in &config.hosts {
        let (host, port) = host.rsplit_once(':').expect("host:port");
        pg.host(host).port(port.parse().expect("port"));
    }
    pg.dbname(&config.dbname).user(&config.user);
    if let Some(password) = &config.password {
        pg.password(password);
    }
    let (client, connection) = pg.connect(NoTls).await.expect("an admin connection");
    tokio::spawn(connection);
    client
}

/// The live rows (granted or queued) under `namespace`, as `name/seq`.
pub async fn rows_under(client: &tokio_postgres::Client, namespace: &str) -> Vec<String> {
    // An unnamed statement (`query_typed`): through PgBouncer's transaction pooling a named one
    // may be executed on a server connection that never prepared it.
    client
        .query_typed(
            "SELECT name, seq FROM lockkit.entries WHERE namespace = $1 AND expires_at > clock_timestamp() ORDER BY seq",
            &[(&namespace, tokio_postgres::types::Type::TEXT)],
        )
        .await
        .expect("reading rows")
        .iter()
        .map(|row| format!("{}/{}", row.get::<_, String>(0), row.get::<_, i64>(1)))
        .collect()
}

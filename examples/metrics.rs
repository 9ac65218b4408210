//! lockkit's metrics at `/metrics`, in Prometheus' text format, while a few tasks contend.
//!
//! ```sh
//! cargo run --example metrics                    # memory backend; then serves until killed
//! cargo run --example metrics -- --quick         # prints /metrics once, checks it, exits
//! cargo run --features redis --example metrics -- --quick redis://127.0.0.1:6379
//! cargo run --example metrics -- --listen 127.0.0.1:9184
//! ```
//!
//! The recorder is `metrics-exporter-prometheus` without its HTTP server (which would bring
//! hyper along): the example answers `GET /metrics` itself with [`PrometheusHandle::render`],
//! which is all a scrape needs. The workload: tasks taking turns on one lock (acquire and
//! wait times, holds, releases), one `try_lock` that finds it taken, one acquisition given
//! up while it waits (`outcome="cancelled"`), a lock held past its TTL (renewals), and one
//! broken by an operator (`force_release`: lost at its next renewal). The example then
//! scrapes itself, prints what it got, and exits 1 if a metric of `lockkit::metrics::ALL`
//! is missing (CI runs it with `--quick`).

use std::net::SocketAddr;
use std::time::Duration;

use lockkit::{LockkitConfig, metrics};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const TASKS: usize = 4;
const ROUNDS: usize = 5;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let listen = args
        .iter()
        .position(|a| a == "--listen")
        .and_then(|i| args.get(i + 1))
        .map_or("127.0.0.1:0", String::as_str);
    let url = args
        .iter()
        .rfind(|a| !a.starts_with("--") && a.as_str() != listen)
        .map_or("memory://", String::as_str);

    // Installed before the first client, which describes the metrics to it.
    let handle = PrometheusBuilder::new().install_recorder()?;
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener, handle.clone()));

    let mut config = LockkitConfig::from_url(url)?;
    // A namespace of its own, so that runs against shared servers never meet.
    config.namespace = format!("metrics-example-{:08x}", rand::random::<u32>());
    let locks = lockkit::connect(&config).await?;
    workload(&locks).await?;

    let scraped = scrape(addr).await?;
    println!("{scraped}");
    let missing: Vec<&str> = metrics::ALL
        .into_iter()
        .filter(|name| !scraped.contains(name))
        .collect();
    if !missing.is_empty() {
        eprintln!("missing from /metrics: {missing:?}");
        std::process::exit(1);
    }
    eprintln!("every documented metric is in http://{addr}/metrics");
    if !quick {
        eprintln!("serving http://{addr}/metrics until killed");
        loop {
            tokio::time::sleep(Duration::from_secs(60)).await;
            handle.run_upkeep();
        }
    }
    locks.close().await;
    Ok(())
}

async fn workload(locks: &lockkit::LockClient) -> lockkit::Result<()> {
    let ttl = locks.capabilities().min_ttl.max(Duration::from_millis(500));
    let mut tasks: Vec<tokio::task::JoinHandle<lockkit::Result<()>>> = Vec::new();
    for _ in 0..TASKS {
        let report = locks.mutex("report")?.with_ttl(ttl)?;
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = report.lock().await?;
                tokio::time::sleep(Duration::from_millis(10)).await;
                guard.release().await?;
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| {
            lockkit::Error::new(lockkit::ErrorKind::Backend, "example", e.to_string())
        })??;
    }

    let held = locks.mutex("nightly")?.with_ttl(ttl)?.lock().await?;
    let other = locks.mutex("nightly")?;
    assert!(other.try_lock().await?.is_none(), "nightly is held");
    // Given up while it waits: counted as cancelled.
    let _ = tokio::time::timeout(Duration::from_millis(50), other.lock()).await;
    // Held past its TTL: renewed.
    tokio::time::sleep(ttl * 2).await;
    // An operator breaks it: the holder's guard reports it lost at its next renewal.
    locks.force_release("nightly").await?;
    let _ = tokio::time::timeout(ttl * 4, held.lost()).await;
    let _ = held.release().await;
    Ok(())
}

/// Answers `GET /metrics` with the rendered metrics, anything else with 404.
async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    while let Ok((stream, _)) = listener.accept().await {
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut stream = BufReader::new(stream);
            let mut request = String::new();
            if stream.read_line(&mut request).await.is_err() {
                return;
            }
            // The headers, read so that closing the connection does not reset it.
            let mut header = String::new();
            while stream.read_line(&mut header).await.is_ok_and(|n| n > 2) {
                header.clear();
            }
            let (status, body) = if request.starts_with("GET /metrics ") {
                ("200 OK", handle.render())
            } else {
                ("404 Not Found", "not found\n".to_owned())
            };
            let head = format!(
                "HTTP/1.0 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let stream = stream.get_mut();
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        });
    }
}

/// What a Prometheus scrape of `addr` gets.
async fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nhost: lockkit\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .split_once("\r\n\r\n")
        .map_or(response.clone(), |(_, body)| body.to_owned()))
}

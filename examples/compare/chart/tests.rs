//! The chart's tests: its layout on a run like the suite's.
use super::*;
use crate::faults::HolderCrash;
use crate::speed::{Contended, ContendedSide, Uncontended};
use crate::{Failure, TierReport};

fn side(what: &str, increments_per_sec: f64, wait_max_us: f64) -> ContendedSide {
    ContendedSide {
        what: what.to_owned(),
        final_value: 6000,
        lost_updates: 0,
        increments_per_sec,
        wait_p50_us: wait_max_us / 20.0,
        wait_p99_us: wait_max_us / 2.0,
        wait_max_us,
        cpu_us_per_increment: None,
        wait_max_all_rounds_us: wait_max_us,
        rounds: Vec::new(),
    }
}

/// A tier's row: W1 and W2 of lockkit, its floor, its second floor and its peer.
fn tier(
    target: &str,
    w1: [Option<f64>; 4],
    w2: [Option<(f64, f64)>; 4],
    w3: Option<f64>,
) -> TierReport {
    let [lockkit, floor, second_floor, peer] = w2;
    let (lockkit_incr, lockkit_wait) = lockkit.unwrap_or((1.0, 1.0));
    TierReport {
        target: target.to_owned(),
        tier: "single".to_owned(),
        uncontended: w1[0].map(|p50_us| Uncontended {
            cycles: 2000,
            cycles_per_sec: 1e6 / p50_us,
            p50_us,
            p99_us: p50_us * 3.0,
            floor: w1[1].map(|_| "floor".to_owned()),
            floor_p50_us: w1[1],
            vs_floor: w1[1].map(|f| p50_us / f),
            second_floor: w1[2].map(|_| "second floor".to_owned()),
            second_floor_p50_us: w1[2],
            vs_second_floor: w1[2].map(|f| p50_us / f),
            peer: w1[3].map(|_| "rslock 0.10".to_owned()),
            peer_cycles_per_sec: w1[3].map(|p| 1e6 / p),
            peer_p50_us: w1[3],
            peer_p99_us: w1[3],
            vs_peer: w1[3].map(|p| p50_us / p),
            reference: None,
            reference_p50_us: None,
            vs_reference: None,
        }),
        contended: lockkit.map(|_| Contended {
            workers: 8,
            iterations: 250,
            rounds: 3,
            lockkit: side("lockkit", lockkit_incr, lockkit_wait),
            non_fair: None,
            floor: floor.map(|(i, w)| side("floor", i, w)),
            second_floor: second_floor.map(|(i, w)| side("second floor", i, w)),
            peer: peer.map(|(i, w)| side("rslock 0.10", i, w)),
            throughput_vs_floor: None,
            throughput_vs_second_floor: None,
            throughput_vs_peer: None,
            max_wait_vs_floor: None,
            max_wait_vs_second_floor: None,
            max_wait_vs_peer: None,
        }),
        holder_crash: w3.map(|recovery_ms| HolderCrash {
            ttl_ms: 2000,
            recovery_ms,
        }),
        ..TierReport::default()
    }
}

/// A run like the suite's, with a tier whose W2 failed.
fn reports() -> Vec<TierReport> {
    let mut etcd = tier(
        "etcd-3",
        [Some(3223.5), Some(2899.0), None, None],
        [None, None, None, None],
        Some(2120.0),
    );
    etcd.failures.push(Failure {
        workload: "W2",
        error: "a test failure".to_owned(),
    });
    vec![
        tier(
            "memory",
            [Some(15.0), None, None, None],
            [Some((16057.0, 1100.0)), None, None, None],
            None,
        ),
        tier(
            "redis",
            [Some(249.2), Some(208.3), None, Some(216.9)],
            [
                Some((2057.0, 15_800.0)),
                Some((1527.0, 111_200.0)),
                None,
                Some((634.0, 197_400.0)),
            ],
            Some(2004.0),
        ),
        tier(
            "redis-sentinel",
            [Some(315.7), Some(246.6), None, None],
            [
                Some((1072.0, 77_900.0)),
                Some((1199.0, 142_900.0)),
                None,
                None,
            ],
            Some(2010.0),
        ),
        tier(
            "redlock-5",
            [Some(993.4), Some(456.3), None, Some(497.1)],
            [
                Some((436.0, 179_300.0)),
                Some((542.0, 101_000.0)),
                None,
                Some((371.0, 295_000.0)),
            ],
            Some(2033.0),
        ),
        etcd,
        tier(
            "zk-3",
            [Some(2061.0), Some(2064.3), None, None],
            [Some((580.0, 23_000.0)), Some((700.0, 18_000.0)), None, None],
            Some(2400.0),
        ),
        tier(
            "postgres",
            [Some(1450.0), Some(120.0), Some(3100.0), None],
            [
                Some((310.0, 30_000.0)),
                Some((420.0, 25_000.0)),
                Some((95.0, 410_000.0)),
                None,
            ],
            Some(2050.0),
        ),
    ]
}

/// Every `<text>` of the chart: its x, size, anchor and content.
fn texts(svg: &str) -> Vec<(f64, f64, String, String)> {
    svg.split("<text")
        .skip(1)
        .map(|t| {
            let attr = |name: &str| {
                t.split(&format!(" {name}=\""))
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or_default()
                    .to_owned()
            };
            let content = t
                .split_once('>')
                .and_then(|(_, rest)| rest.split_once("</text>"))
                .map_or(String::new(), |(content, _)| content.trim().to_owned());
            let px: f64 = attr("font-size").parse().unwrap_or(f64::NAN);
            (
                attr("x").parse().unwrap_or(f64::NAN),
                px,
                attr("text-anchor"),
                content,
            )
        })
        .collect()
}

#[test]
fn the_chart_shows_every_panel_and_every_tier_within_its_width() {
    let svg = svg(&reports()).expect("the chart is drawn");
    if let Ok(path) = std::env::var("COMPARE_CHART_SAMPLE") {
        std::fs::write(path, &svg).expect("the sample is written");
    }
    let texts = texts(&svg);
    let shown = |s: &str| texts.iter().filter(|(.., t)| t == s).count();
    for title in [
        "W1 uncontended",
        "W2 contended, 8",
        "W2 contended: max",
        "W3 holder",
    ] {
        assert_eq!(
            texts.iter().filter(|(.., t)| t.starts_with(title)).count(),
            1,
            "{title}"
        );
    }
    for name in [
        "memory",
        "redis",
        "redis-sentinel",
        "redlock-5",
        "etcd-3",
        "zk-3",
        "postgres",
    ] {
        assert_eq!(shown(name), 4, "{name} is named in every panel");
    }
    assert_eq!(shown("FAILED"), 2, "etcd's W2 failed, in both W2 panels");
    assert_eq!(shown("not run"), 1, "memory has no W3");
    assert_eq!(shown("2057 /s"), 1, "a value is shown at its bar");
    assert_eq!(shown("3100 µs"), 1, "the second floor's W1 bar");
    assert_eq!(shown("95.0 /s"), 1, "the second floor's W2 bar");
    let legend = [
        "lockkit",
        "lockkit, non-fair",
        "raw floor: the same protocol by hand (floors.rs)",
        "2nd raw floor: a lease table (PostgreSQL)",
        "peer: rslock 0.10",
    ];
    for entry in legend {
        assert_eq!(shown(entry), 1, "{entry:?} is in the colour key");
    }
    for (x, px, anchor, text) in &texts {
        let width = text_width(text, *px) as f64;
        let (left, right) = match anchor.as_str() {
            "middle" => (x - width / 2.0, x + width / 2.0),
            "end" => (x - width, *x),
            _ => (*x, x + width),
        };
        // Within the chart, and within its column but for the legend across the top.
        let column = WIDTH as f64 / 2.0;
        let edge = if left < column && !legend.contains(&text.as_str()) {
            column
        } else {
            WIDTH as f64
        };
        assert!(
            left >= 0.0 && right <= edge,
            "{text:?} at {x} ({anchor}) is cut off"
        );
    }
}

#[test]
fn the_second_floor_has_a_bar_only_where_a_tier_has_one() {
    let mut reports = reports();
    let with = svg(&reports).expect("the chart is drawn");
    reports.retain(|r| r.target != "postgres");
    let without = svg(&reports).expect("the chart is drawn");
    assert!(with.contains("a lease table (PostgreSQL)"));
    assert!(!without.contains("a lease table (PostgreSQL)"));
    let bars = Bars(vec![0, 1, 2, 4]);
    assert_eq!(bars.slots(), 5);
    assert_eq!(bars.slot(0), Some(3), "lockkit on top");
    assert_eq!(bars.slot(4), Some(0), "the peer lowest");
    assert_eq!(bars.slot(SECOND_FLOOR), None);
}

//! The metrics table of the `lockkit::metrics` docs (where the README sends its readers)
//! names every metric lockkit records, and only those.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

#[test]
fn the_metrics_docs_list_every_metric() {
    let docs = include_str!("../lockkit-core/src/metrics.rs");
    let listed: Vec<&str> = docs
        .lines()
        .filter_map(|line| line.strip_prefix("//! | `lockkit_"))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    let all: Vec<String> = lockkit::metrics::ALL
        .iter()
        .map(|name| name.trim_start_matches("lockkit_").to_owned())
        .collect();
    assert_eq!(
        listed, all,
        "the metrics table of lockkit::metrics and metrics::ALL disagree"
    );
}

#[test]
fn the_readme_points_to_the_metrics_docs() {
    let readme = include_str!("../README.md");
    assert!(
        readme.contains("lockkit_core/metrics/"),
        "the README's metrics section no longer links to the full list"
    );
}

//! The core conformance suite against a single Redis node, the Sentinel group, the 5-node
//! Redlock topology and the Redis Cluster (3 primaries, 3 replicas) of `compose/up.sh`.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

mod single {
    lockkit_core::conformance_tests!(crate::common::single);
}

mod sentinel {
    lockkit_core::conformance_tests!(crate::common::sentinel);
}

mod redlock {
    lockkit_core::conformance_tests!(crate::common::redlock);
}

mod cluster {
    lockkit_core::conformance_tests!(crate::common::cluster);
}

//! The compose members that fault tests stop, pause and restart through `compose/member.sh`,
//! and put back afterwards.

/// Puts the named members back when dropped (at the end of a fault test, even by a panic):
/// resumes the paused ones and restarts the ones that are down.
pub struct RestoreMembers(pub &'static [&'static str]);

impl Drop for RestoreMembers {
    fn drop(&mut self) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../compose/member.sh");
        for name in self.0 {
            let _ = std::process::Command::new(&script)
                .args(["resume", name])
                .output();
            let up = std::process::Command::new(&script)
                .args(["status", name])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(" up "));
            if !up {
                let _ = std::process::Command::new(&script)
                    .args(["restart", name])
                    .output();
            }
        }
    }
}

/// Runs `compose/member.sh ACTION NAME` and fails the test if it fails.
pub fn member(action: &str, name: &str) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../compose/member.sh");
    let output = std::process::Command::new(script)
        .args([action, name])
        .output()
        .expect("run compose/member.sh");
    assert!(
        output.status.success(),
        "compose/member.sh {action} {name} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The compose member name (`cluster-N`) of the cluster node at `addr`.
pub fn cluster_member(addr: &str) -> &'static str {
    const MEMBERS: [&str; 6] = [
        "cluster-1",
        "cluster-2",
        "cluster-3",
        "cluster-4",
        "cluster-5",
        "cluster-6",
    ];
    let offset: u16 = std::env::var("LOCKKIT_COMPOSE_PORT_OFFSET")
        .ok()
        .and_then(|o| o.parse().ok())
        .unwrap_or(0);
    let port: u16 = addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("host:port");
    MEMBERS[usize::from(port - offset - 20041)]
}

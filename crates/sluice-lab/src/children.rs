//! Every process the lab starts (sinks, brokers, private servers), so that
//! an interrupted lab leaves none behind.
//!
//! In: each child's pid at its start ([`started`]). Out: [`kill_all`],
//! called when the lab is interrupted. A cell runs in a task of its own;
//! the runtime's shutdown drops the cells' processes (and their `Drop`
//! kills them) only for tasks not blocked in a wait, so a cell waiting on a
//! process at the signal would leave its children running. Pids are never
//! forgotten: a pid is killed only while it is still a child of this
//! process (its parent in `/proc`), so a reaped child's pid, reused by
//! another process, is left alone.

use std::collections::BTreeSet;
use std::sync::Mutex;

static STARTED: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// A child the lab started.
pub(crate) fn started(pid: u32) {
    STARTED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(pid);
}

/// Kills (SIGKILL, after SIGCONT for a frozen one) every started process
/// that is still a child of this one.
pub fn kill_all() {
    let me = std::process::id();
    let pids = std::mem::take(&mut *STARTED.lock().unwrap_or_else(|p| p.into_inner()));
    for pid in pids.into_iter().filter(|&p| parent_of(p) == Some(me)) {
        for sig in ["-CONT", "-KILL"] {
            let _ = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// The parent of `pid`, from `/proc/PID/stat` (`pid (comm) state ppid …`;
/// the name may hold spaces and parentheses).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_child_is_killed_and_a_stranger_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        started(child.id());
        // Not our child: our own parent.
        let stranger = parent_of(std::process::id()).unwrap();
        started(stranger);
        assert_eq!(parent_of(child.id()), Some(std::process::id()));
        kill_all();
        let status = child.wait().unwrap();
        assert!(!status.success(), "{status:?}");
        assert!(parent_of(stranger).is_some(), "the stranger lives");
    }
}

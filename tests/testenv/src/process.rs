//! Child processes that die with their owner: each runs in its own process group, and
//! dropping the guard kills the whole group, so a panicking test leaves nothing behind.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running process (and its process group) with its output going to a log file.
#[derive(Debug)]
pub struct ProcessGuard {
    name: String,
    child: Child,
    log: PathBuf,
}

impl ProcessGuard {
    /// Starts `command` in a new process group, stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> io::Result<Self> {
        let out = File::options().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = command.spawn()?;
        Ok(Self {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }

    /// The process id (also the process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The name given at spawn, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The exit status if the process has ended (reaping it), `None` while it runs.
    /// Sends `signal` to the process's group (what a kubelet's kill of a container does).
    pub fn signal(&self, signal: libc::c_int) {
        signal_group(self.pid(), signal);
    }

    pub fn try_exit_status(&mut self) -> io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// The last `lines` lines of the process log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// Asks the group to stop with SIGTERM, waits up to `grace`, then SIGKILLs it.
    /// Blocking: call it from a blocking context.
    pub fn stop(mut self, grace: Duration) -> Option<ExitStatus> {
        signal_group(self.pid(), libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    // The leader is gone; make sure nothing else of its group lingers.
                    signal_group(self.pid(), libc::SIGKILL);
                    return Some(status);
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break,
            }
        }
        signal_group(self.pid(), libc::SIGKILL);
        self.child.wait().ok()
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        signal_group(self.pid(), libc::SIGKILL);
        let _ = self.child.wait();
    }
}

fn signal_group(pgid: u32, signal: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    // SAFETY: kill(2) has no memory effects; a negative pid addresses the process group
    // this guard created, and an already-gone group only yields ESRCH.
    unsafe {
        libc::kill(-pgid, signal);
    }
}

/// The last `lines` lines of a log file (empty if unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A process's resident memory in KiB (`VmRSS` from /proc), while it runs.
pub fn resident_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// The most resident memory a process has held in KiB (`VmHWM`), since it started or since
/// [`reset_peak_resident`].
pub fn peak_resident_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// Sets a process's peak resident memory back to what it holds now (`clear_refs` 5).
pub fn reset_peak_resident(pid: u32) -> io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

/// A figure of `/proc/<pid>/status` in KiB.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

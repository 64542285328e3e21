//! Pod IPs: one loopback address per Pod, 127.0.0.2 to 127.0.0.254 (127.0.0.1 is the
//! host's). A lease is an exclusive `flock` on a per-address file, so kubelets in other
//! test processes never hand out the same address, and a crashed process frees its
//! leases with its file descriptors.

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Ports a Valkey node binds on its address: the client port and the cluster bus.
const PROBED_PORTS: [u16; 2] = [6379, 16379];

/// An address held for one Pod; dropping it frees the address.
#[derive(Debug)]
pub struct IpLease {
    ip: Ipv4Addr,
    _lock: File,
}

impl IpLease {
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }
}

/// The pool: 127.0.0.2 to 127.0.0.254.
const FIRST: usize = 2;
const POOL: usize = 253;

/// Where the next search starts: addresses are handed out round-robin, as a real node's
/// host-local IPAM does, so a deleted Pod's address is not reused at once. (Reusing it at once
/// would let a client still holding that address reach a Pod of another cluster.)
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Leases the next free address whose Valkey ports nobody listens on (tests that start
/// valkey-server themselves take addresses without leasing them).
pub fn lease() -> Option<IpLease> {
    let dir = std::env::temp_dir().join("valkey-operator-testenv-ips");
    std::fs::create_dir_all(&dir).ok()?;
    let start = NEXT.load(Ordering::Relaxed);
    (0..POOL).find_map(|offset| {
        let index = (start + offset) % POOL;
        let last = u8::try_from(FIRST + index).ok()?;
        let lease = try_lease(dir.join(format!("127.0.0.{last}")), last)?;
        NEXT.store((index + 1) % POOL, Ordering::Relaxed);
        Some(lease)
    })
}

fn try_lease(path: PathBuf, last: u8) -> Option<IpLease> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()?;
    // SAFETY: flock(2) on a descriptor this function owns; no memory is shared.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    let ip = Ipv4Addr::new(127, 0, 0, last);
    let ports_free = || {
        PROBED_PORTS
            .iter()
            .all(|port| TcpListener::bind((ip, *port)).is_ok())
    };
    (locked && ports_free()).then_some(IpLease { ip, _lock: file })
}

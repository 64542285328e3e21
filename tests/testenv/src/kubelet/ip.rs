//! Pod IPs: one loopback address per Pod, from 127.1.0.1 to 127.1.255.254 (65,024 of them,
//! none ending in .0 or .255), apart from 127.0.0.1 (the host's) and from the `127.0.<n>.0/24`
//! subnets the harness's own Valkey runtimes use. A fleet roll needs an address for every old
//! and every new Pod at once: a few hundred addresses would make the test kubelet, not the
//! operator, set the pace. A lease is an exclusive `flock` on a per-address file, so kubelets
//! in other test processes never hand out the same address, and a crashed process frees its
//! leases with its file descriptors.
//!
//! A real CNI hands a Pod's address to the next Pod once the Pod's sandbox is torn down, which
//! for a Pod that will not restart is as soon as its container has exited, while the Pod's
//! status still shows the address: [`lease_address`] takes one given address (the kubelet
//! reusing a freed one at once, or a test putting a stranger there).

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

/// Addresses per /24 of the pool: .1 to .254.
const PER_BLOCK: usize = 254;
/// The pool: 256 blocks of 127.1.0.0/16.
const POOL: usize = 256 * PER_BLOCK;

/// The pool's `index`th address.
fn address(index: usize) -> Option<Ipv4Addr> {
    let block = u8::try_from(index / PER_BLOCK).ok()?;
    let host = u8::try_from(index % PER_BLOCK + 1).ok()?;
    Some(Ipv4Addr::new(127, 1, block, host))
}

/// Where the next search starts: addresses are handed out round-robin, as a real node's
/// host-local IPAM does, so a deleted Pod's address is not reused at once. (Reusing it at once
/// would let a client still holding that address reach a Pod of another cluster.) Unset until
/// the first lease, which starts at this process's own place in the pool (see [`first_index`]).
static NEXT: AtomicUsize = AtomicUsize::new(UNSET);
const UNSET: usize = usize::MAX;

/// Where a process's first search starts: spread by its pid, so that test processes running
/// side by side do not all start at the pool's first address, where a new one would take the
/// address another has just freed while that one's clients may still hold it.
fn first_index() -> usize {
    // 40,009 is prime and above half the pool: consecutive pids land far apart.
    (std::process::id() as usize).wrapping_mul(40_009) % POOL
}

/// Leases the next free address whose Valkey ports nobody listens on (tests that start
/// valkey-server themselves take addresses without leasing them).
pub fn lease() -> Option<IpLease> {
    let dir = std::env::temp_dir().join("valkey-operator-testenv-ips");
    std::fs::create_dir_all(&dir).ok()?;
    let start = match NEXT.load(Ordering::Relaxed) {
        UNSET => first_index(),
        next => next,
    };
    (0..POOL).find_map(|offset| {
        let index = (start + offset) % POOL;
        let ip = address(index)?;
        let lease = try_lease(dir.join(ip.to_string()), ip)?;
        NEXT.store((index + 1) % POOL, Ordering::Relaxed);
        Some(lease)
    })
}

/// Leases `ip` itself, if it is in the pool and free.
pub fn lease_address(ip: Ipv4Addr) -> Option<IpLease> {
    let [127, 1, block, host] = ip.octets() else {
        return None;
    };
    if host == 0 || host == 255 || usize::from(block) * PER_BLOCK >= POOL {
        return None;
    }
    let dir = std::env::temp_dir().join("valkey-operator-testenv-ips");
    std::fs::create_dir_all(&dir).ok()?;
    try_lease(dir.join(ip.to_string()), ip)
}

fn try_lease(path: PathBuf, ip: Ipv4Addr) -> Option<IpLease> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()?;
    // SAFETY: flock(2) on a descriptor this function owns; no memory is shared.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    let ports_free = || {
        PROBED_PORTS
            .iter()
            .all(|port| TcpListener::bind((ip, *port)).is_ok())
    };
    (locked && ports_free()).then_some(IpLease { ip, _lock: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_is_127_1_without_network_or_broadcast_addresses() {
        assert_eq!(address(0), Some(Ipv4Addr::new(127, 1, 0, 1)));
        assert_eq!(address(253), Some(Ipv4Addr::new(127, 1, 0, 254)));
        assert_eq!(address(254), Some(Ipv4Addr::new(127, 1, 1, 1)));
        assert_eq!(address(POOL - 1), Some(Ipv4Addr::new(127, 1, 255, 254)));
        assert_eq!(address(POOL), None);
    }
}

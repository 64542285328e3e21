//! What a Pod reaches, asked from inside it: TCP connections made from a container's network
//! namespace (entered by a thread of the test's own, so the test's other threads stay where they
//! are), as a program in that Pod would make them. A socket belongs to the namespace it was
//! made in, so connections made there stay the Pod's after the thread leaves.

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Whether a TCP connection from the network namespace of process `pid` (a container's) to
/// `to` is accepted within `timeout`.
pub fn connects_from(pid: u32, to: SocketAddr, timeout: Duration) -> io::Result<bool> {
    let namespace = namespace_of(pid)?;
    std::thread::spawn(move || {
        enter(&namespace)?;
        match TcpStream::connect_timeout(&to, timeout) {
            Ok(_) => Ok(true),
            Err(e) if refused(&e) => Ok(false),
            Err(e) => Err(e),
        }
    })
    .join()
    .map_err(|_| io::Error::other("the connecting thread panicked"))?
}

/// A Pod holding as many connections to one address as it can, up to a number, opening new ones
/// as the server closes them, until stopped: what a tenant's program does to take a server's
/// connections.
#[derive(Debug)]
pub struct Flood {
    stop: Arc<AtomicBool>,
    counts: Arc<FloodCounts>,
    thread: Option<JoinHandle<()>>,
}

/// What a flood did so far.
#[derive(Debug, Default)]
pub struct FloodCounts {
    /// Connections the server's kernel accepted.
    pub opened: AtomicU64,
    /// Of those, the ones the server closed.
    pub closed_by_server: AtomicU64,
    /// The most held at once.
    pub most_held: AtomicU64,
}

impl Flood {
    /// From the network namespace of process `pid`, keeps up to `count` connections open to
    /// `to`.
    pub fn start(pid: u32, to: SocketAddr, count: usize) -> io::Result<Self> {
        let namespace = namespace_of(pid)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(FloodCounts::default());
        let (thread_stop, thread_counts) = (stop.clone(), counts.clone());
        let thread = std::thread::spawn(move || {
            if enter(&namespace).is_ok() {
                hold(to, count, &thread_stop, &thread_counts);
            }
        });
        Ok(Self {
            stop,
            counts,
            thread: Some(thread),
        })
    }

    pub fn counts(&self) -> &FloodCounts {
        &self.counts
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Tops the connections up to `count` and drops the ones the server closed, every 50 ms.
fn hold(to: SocketAddr, count: usize, stop: &AtomicBool, counts: &FloodCounts) {
    let mut held: Vec<TcpStream> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let before = held.len();
        held.retain(still_open);
        counts
            .closed_by_server
            .fetch_add((before - held.len()) as u64, Ordering::Relaxed);
        while held.len() < count && !stop.load(Ordering::Relaxed) {
            match TcpStream::connect_timeout(&to, Duration::from_millis(500)) {
                Ok(stream) if stream.set_nonblocking(true).is_ok() => {
                    counts.opened.fetch_add(1, Ordering::Relaxed);
                    held.push(stream);
                }
                _ => break,
            }
        }
        counts
            .most_held
            .fetch_max(held.len() as u64, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A connection the server has not closed: nothing to read yet, or something said; not the
/// end of the stream, nor a reset.
fn still_open(stream: &TcpStream) -> bool {
    match stream.peek(&mut [0u8; 1]) {
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        Ok(read) => read > 0,
    }
}

fn namespace_of(pid: u32) -> io::Result<File> {
    File::open(format!("/proc/{pid}/ns/net"))
}

/// Moves the calling thread into `namespace`.
fn enter(namespace: &File) -> io::Result<()> {
    // SAFETY: setns on this thread only, with a descriptor that outlives the call.
    if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn refused(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::TimedOut
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
    )
}

//! A size limit on what a node may answer. A node is the tenant's: whoever is admin on it can
//! make a username, a key name or a value of hundreds of megabytes, and the `redis` crate buffers
//! a reply whole before handing it over. So the stream under every connection the operator opens
//! counts the bytes it reads since the operator last wrote a command, and fails the read once
//! they pass [`REPLY_LIMIT`]: the connection ends, the call fails with
//! [`EngineError::TooLarge`](super::EngineError::TooLarge), and the operator holds at most about
//! one limit (plus one read buffer) per connection, whatever the node sends.
//!
//! The operator sends one command at a time on a connection and waits for its reply, so "since
//! the last write" is "this reply".

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most bytes one reply may carry: far above what the commands the operator sends return on
/// any cluster it runs (`CLUSTER NODES` of 500 nodes with fragmented slots is a few hundred
/// kilobytes), far below what would threaten the operator's memory limit.
pub const REPLY_LIMIT: usize = 1 << 20;

/// Set once a read passed the limit: how a failed call tells a reply too large from a
/// connection that broke.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overflow(Arc<AtomicBool>);

impl Overflow {
    pub(crate) fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A stream whose reads fail once more than `limit` bytes arrived since the last write.
pub(crate) struct Bounded<S> {
    inner: S,
    limit: usize,
    read_since_write: usize,
    overflow: Overflow,
}

impl<S> Bounded<S> {
    pub(crate) fn new(inner: S, limit: usize) -> (Self, Overflow) {
        let overflow = Overflow::default();
        let stream = Self {
            inner,
            limit,
            read_since_write: 0,
            overflow: overflow.clone(),
        };
        (stream, overflow)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        this.read_since_write += buf.filled().len() - before;
        if this.read_since_write > this.limit {
            this.overflow.0.store(true, Ordering::Relaxed);
            return Poll::Ready(Err(io::Error::other(format!(
                "a reply over its {}-byte limit",
                this.limit
            ))));
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = ready!(Pin::new(&mut this.inner).poll_write(cx, data))?;
        if written > 0 {
            this.read_since_write = 0;
        }
        Poll::Ready(Ok(written))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_reply_past_the_limit_fails_the_read_and_says_so() {
        let (near, mut far) = tokio::io::duplex(64 * 1024);
        let (mut stream, overflow) = Bounded::new(near, 1000);
        stream.write_all(b"PING\r\n").await.unwrap();
        far.write_all(&[b'x'; 900]).await.unwrap();
        let mut buf = vec![0; 4096];
        let mut got = 0;
        while got < 900 {
            got += stream.read(&mut buf).await.unwrap();
        }
        assert!(
            !overflow.happened(),
            "900 bytes are within a 1000-byte limit"
        );
        far.write_all(&[b'x'; 200]).await.unwrap();
        let error = stream.read(&mut buf).await.unwrap_err();
        assert!(overflow.happened());
        assert!(error.to_string().contains("1000-byte limit"), "{error}");
    }

    #[tokio::test]
    async fn each_command_gets_the_whole_limit_again() {
        let (near, mut far) = tokio::io::duplex(64 * 1024);
        let (mut stream, overflow) = Bounded::new(near, 1000);
        let mut buf = vec![0; 4096];
        for _ in 0..5 {
            stream.write_all(b"PING\r\n").await.unwrap();
            far.write_all(&[b'x'; 800]).await.unwrap();
            let mut got = 0;
            while got < 800 {
                got += stream.read(&mut buf).await.unwrap();
            }
        }
        assert!(
            !overflow.happened(),
            "five 800-byte replies, one per command"
        );
    }
}

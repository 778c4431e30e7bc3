//! Chapter 6.3: a connection whose client stops reading. A write that stays pending for the
//! idle timeout fails, and hyper closes the connection; the handler's answer is dropped with
//! it, which is how the engine learns that nobody listens any more.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Sleep, sleep};

/// An I/O stream whose writes fail with `TimedOut` after `limit` without progress.
pub struct StallGuard<IO> {
    io: IO,
    limit: Duration,
    /// Running while a write is pending; reset by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<IO> StallGuard<IO> {
    pub fn new(io: IO, limit: Duration) -> Self {
        Self {
            io,
            limit,
            stalled: None,
        }
    }

    /// Passes a write's outcome on; a pending one starts (or checks) the stall clock.
    fn watch<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let clock = self.stalled.get_or_insert_with(|| Box::pin(sleep(limit)));
        ready!(clock.as_mut().poll(cx));
        self.stalled = None;
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client accepted no byte for {limit:?}"),
        )))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for StallGuard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for StallGuard<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_reader_that_stops_fails_the_write_after_the_limit() {
        let (near, _far) = tokio::io::duplex(64);
        let mut guarded = StallGuard::new(near, Duration::from_millis(200));
        let started = tokio::time::Instant::now();
        let err = guarded.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    #[tokio::test]
    async fn a_reader_that_keeps_up_is_never_cut() {
        let (near, mut far) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut far, &mut all)
                .await
                .unwrap();
            all.len()
        });
        let mut guarded = StallGuard::new(near, Duration::from_millis(200));
        guarded.write_all(&[1u8; 4096]).await.unwrap();
        guarded.shutdown().await.unwrap();
        drop(guarded);
        assert_eq!(reader.await.unwrap(), 4096);
    }
}

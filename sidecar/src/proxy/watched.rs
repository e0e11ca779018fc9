//! A client connection on the hyper path ([`super::fallback`]), held to the client timeouts hyper has
//! no setting for. hyper's one head timer also runs while a kept-alive connection waits for its next
//! request, and HTTP/2 has no idle timeout at all; so hyper's is off, and the connection's reads and
//! writes are watched here instead:
//!
//! - with no request in flight, a connection that stays quiet for `clientTimeouts.idle` fails (an
//!   HTTP/2 client's pings do not count as requests);
//! - an HTTP/1 head must arrive whole within `clientTimeouts.requestHead` of its first byte, and what it
//!   holds beyond [`HEAD_FREE`] is drawn from the budget for heads;
//! - a write the client takes nothing of for `clientTimeouts.send` fails.
//!
//! A request body's pauses are [`super::client_body`]'s to time (`clientTimeouts.body`). Which requests
//! are in flight the service tells [`Activity`] ([`Activity::begin`]; the returned guard travels with the
//! response body). An upgraded connection (a WebSocket tunnel) is the app's and the client's: only the
//! write timeout still applies.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use sluice_crds::sidecar_config::ClientTimeouts;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};

use super::capacity::{Admitted, HEAD_FREE, HeadShare};

/// What the service tells the connection's watch: requests in flight, and whether the connection has
/// left HTTP/1 heads behind (HTTP/2, or an upgrade).
#[derive(Debug, Default)]
pub struct Activity {
    in_flight: AtomicUsize,
    http2: AtomicBool,
    upgraded: AtomicBool,
}

impl Activity {
    /// A request's head has arrived (whole): it is in flight until the returned guard drops.
    pub fn begin(self: &Arc<Self>, version: http::Version) -> InFlight {
        if version == http::Version::HTTP_2 {
            self.http2.store(true, Ordering::Relaxed);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }

    /// The connection switched protocols: it is a tunnel from now on.
    pub fn upgraded(&self) {
        self.upgraded.store(true, Ordering::Relaxed);
    }

    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0 || self.upgraded.load(Ordering::Relaxed)
    }
}

/// One request in flight; ends when dropped.
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request in flight until it is sent (or dropped).
#[derive(Debug)]
pub struct Tracked<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B> Tracked<B> {
    /// `inner`, keeping `in_flight` alive as long as it lasts.
    pub fn new(inner: B, in_flight: InFlight) -> Self {
        Self {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A client connection watched for the client timeouts (see the module docs).
pub struct Watched<I> {
    io: I,
    activity: Arc<Activity>,
    idle: Duration,
    request_head: Duration,
    send: Duration,
    /// Since when no request has been in flight.
    quiet_since: Instant,
    /// When the first byte of the head being read arrived.
    head_since: Option<Instant>,
    /// Bytes read since then.
    head_bytes: usize,
    head_share: HeadShare,
    /// A request was in flight when the connection was last read.
    was_busy: bool,
    read_timer: Option<Pin<Box<Sleep>>>,
    /// Armed while a write waits for the client.
    write_timer: Option<Pin<Box<Sleep>>>,
    write_waiting: bool,
    slow_clients: Counter,
    /// The connection's place under `limits.maxConnections`, held as long as the socket (a tunnel too).
    _admitted: Option<Admitted>,
}

impl<I> Watched<I> {
    /// `io`, whose requests `activity` reports, held to `timeouts`; long heads draw on `head_share`;
    /// connections closed for their client's slowness are counted in `slow_clients`.
    pub fn new(
        io: I,
        timeouts: &ClientTimeouts,
        activity: Arc<Activity>,
        head_share: HeadShare,
        slow_clients: Counter,
    ) -> Self {
        Self {
            io,
            activity,
            idle: timeouts.idle.get(),
            request_head: timeouts.request_head.get(),
            send: timeouts.send.get(),
            quiet_since: Instant::now(),
            head_since: None,
            head_bytes: 0,
            head_share,
            was_busy: false,
            read_timer: None,
            write_timer: None,
            write_waiting: false,
            slow_clients,
            _admitted: None,
        }
    }

    /// Holds `admitted` for as long as the connection lasts.
    pub fn holding(mut self, admitted: Admitted) -> Self {
        self._admitted = Some(admitted);
        self
    }

    /// A read found nothing: fails it once the connection has been quiet (or its head slow) too long.
    fn read_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let deadline = match self.head_since {
            Some(since) => since + self.request_head,
            None => self.quiet_since + self.idle,
        };
        let timer = self
            .read_timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        ready!(timer.as_mut().poll(cx));
        if self.head_since.is_some() {
            self.slow_clients.inc();
        }
        tracing::debug!(
            head = self.head_since.is_some(),
            "closing a client connection that stayed quiet"
        );
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }

    /// A write found no room: fails it once the client has taken nothing for `send`.
    fn write_pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let deadline = Instant::now() + self.send;
        let timer = self
            .write_timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.write_waiting {
            self.write_waiting = true;
            timer.as_mut().reset(deadline);
        }
        ready!(timer.as_mut().poll(cx));
        self.slow_clients.inc();
        tracing::debug!("closing a client connection that stopped taking its response");
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }

    fn wrote<T>(&mut self, result: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match result {
            Poll::Pending => self.write_pending(cx),
            ready => {
                self.write_waiting = false;
                ready
            }
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.activity.busy() {
            if !this.was_busy {
                this.was_busy = true;
                this.head_since = None;
                this.head_bytes = 0;
                this.head_share.release();
            }
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        if this.was_busy {
            this.was_busy = false;
            this.quiet_since = Instant::now();
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n > 0 && !this.activity.http2.load(Ordering::Relaxed) {
                    this.head_since.get_or_insert_with(Instant::now);
                    this.head_bytes += n;
                    if this.head_bytes > HEAD_FREE && !this.head_share.cover(this.head_bytes) {
                        this.slow_clients.inc();
                        return Poll::Ready(Err(io::Error::other(
                            "a long request head while the memory kept for heads is taken",
                        )));
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => this.read_pending(cx),
            failed => failed,
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(result, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_flush(cx);
        self.wrote(result, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::proxy::capacity::HeadBudget;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn timeouts(idle: u64, head: u64, send: u64) -> ClientTimeouts {
        let d = sluice_crds::Duration::from_millis;
        ClientTimeouts {
            idle: d(idle),
            request_head: d(head),
            body: d(60_000),
            send: d(send),
        }
    }

    /// Whether `took` is `at_least` and not much more (a loaded machine schedules late, never early).
    fn about(took: Duration, at_least: u64) -> bool {
        took >= ms(at_least) && took < ms(at_least) + Duration::from_secs(2)
    }

    fn watched<I>(io: I, t: &ClientTimeouts, activity: &Arc<Activity>) -> Watched<I> {
        let share = Arc::new(HeadBudget::new(1 << 20)).share();
        Watched::new(io, t, Arc::clone(activity), share, Counter::default())
    }

    #[tokio::test]
    async fn a_quiet_connection_fails_after_idle_and_a_slow_head_after_request_head() {
        let activity = Arc::new(Activity::default());
        let (_client, server) = tokio::io::duplex(1024);
        let mut w = watched(server, &timeouts(600, 200, 60_000), &activity);
        let mut buf = [0u8; 64];
        let start = Instant::now();
        let err = w.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(about(start.elapsed(), 600), "{:?}", start.elapsed());

        let (mut client, server) = tokio::io::duplex(1024);
        let mut w = watched(server, &timeouts(600, 200, 60_000), &activity);
        client.write_all(b"GET / HTTP/1.0\r\n").await.unwrap();
        let start = Instant::now();
        assert_eq!(w.read(&mut buf).await.unwrap(), 16);
        let err = w.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(about(start.elapsed(), 200), "{:?}", start.elapsed());
    }

    #[tokio::test]
    async fn no_clock_runs_while_a_request_is_in_flight_and_idle_counts_from_its_end() {
        let activity = Arc::new(Activity::default());
        let (mut client, server) = tokio::io::duplex(1024);
        let mut w = watched(server, &timeouts(600, 200, 60_000), &activity);
        client.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(w.read(&mut buf).await.unwrap(), 18);
        let in_flight = activity.begin(http::Version::HTTP_11);
        // The app takes longer than every client timeout; nothing times out meanwhile.
        let read = tokio::time::timeout(ms(900), w.read(&mut buf)).await;
        assert!(read.is_err(), "the read was still waiting");
        drop(in_flight);
        let start = Instant::now();
        let err = w.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            about(start.elapsed(), 600),
            "idle, not requestHead: {:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn a_client_that_takes_nothing_fails_the_write_after_send() {
        let activity = Arc::new(Activity::default());
        let (_client, server) = tokio::io::duplex(16);
        let mut w = watched(server, &timeouts(60_000, 60_000, 300), &activity);
        let start = Instant::now();
        let err = w.write_all(&[0u8; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(about(start.elapsed(), 300), "{:?}", start.elapsed());
    }

    #[tokio::test]
    async fn a_long_head_over_the_budget_fails() {
        let activity = Arc::new(Activity::default());
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let share = Arc::new(HeadBudget::new(1024)).share();
        let mut w = Watched::new(
            server,
            &timeouts(60_000, 60_000, 60_000),
            activity,
            share,
            Counter::default(),
        );
        client.write_all(&[b'a'; HEAD_FREE + 2048]).await.unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let err = w.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Other);
    }
}

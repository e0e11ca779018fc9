//! A client's request body on its way to the app on the hyper path ([`super::forward`]): capped at
//! `limits.maxRequestBody`, with a deadline between two pieces of it (`clientTimeouts.body`, so a client
//! trickling a body cannot hold an app connection for ever), and cut off the moment the app has answered
//! (so bytes the app did not wait for never reach it, where it could read them as a request of their
//! own). Its errors say whose fault a failed exchange was: a malformed or oversized body or a stalled
//! client is answered 400, 413 or 408, not 502.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{LengthLimitError, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Sleep;

/// Why a client's body stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClientBodyError {
    /// It grew past `limits.maxRequestBody`.
    #[error("the request body is over limits.maxRequestBody")]
    TooLarge,
    /// The client sent nothing for `clientTimeouts.body`.
    #[error("the client sent no part of its body for {0:?}")]
    TimedOut(Duration),
    /// The client's framing is broken (a bad chunk size, a connection closed mid-body).
    #[error("the request body could not be read: {0}")]
    Malformed(Box<dyn std::error::Error + Send + Sync>),
    /// The app answered before the whole body was sent; the rest is not sent.
    #[error("the app answered before the whole request body was sent")]
    AppAnswered,
}

/// Marks that the app has answered a request, so its body stops (see [`ClientBody`]).
#[derive(Clone, Debug, Default)]
pub struct Answered(Arc<AtomicBool>);

impl Answered {
    /// The app's response head has arrived.
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The body a request forwarded on the hyper path carries.
pub struct ClientBody {
    inner: Limited<Incoming>,
    between_reads: Duration,
    /// Armed while the client owes the next piece.
    timer: Option<Pin<Box<Sleep>>>,
    answered: Answered,
}

impl ClientBody {
    /// `body`, capped at `max` bytes, failing when the client sends nothing for `between_reads`, and
    /// stopping once `answered` is set.
    pub fn new(body: Incoming, max: u64, between_reads: Duration, answered: Answered) -> Self {
        Self {
            inner: Limited::new(body, usize::try_from(max).unwrap_or(usize::MAX)),
            between_reads,
            timer: None,
            answered,
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.answered.get() {
            return Poll::Ready(Some(Err(ClientBodyError::AppAnswered)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.timer = None;
                Poll::Ready(frame.map(|f| {
                    f.map_err(|e| {
                        if e.is::<LengthLimitError>() {
                            ClientBodyError::TooLarge
                        } else {
                            ClientBodyError::Malformed(e)
                        }
                    })
                }))
            }
            Poll::Pending => {
                let wait = this.between_reads;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
                ready!(timer.as_mut().poll(cx));
                Poll::Ready(Some(Err(ClientBodyError::TimedOut(wait))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

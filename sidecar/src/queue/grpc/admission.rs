//! How a new `Work` stream is let in ([`Admitter::admit`]): who is calling (TokenReview), `subscribe`
//! read and checked, the caller authorized on its queues (SubjectAccessReviews), the room to wait
//! ([`Pending`]) and the stream slot, all under one deadline ([`Admission`]); and why a stream was
//! refused ([`RefuseReason`], counted by [`Admitting`]). The rules are in the parent module's doc.
//!
//! Nothing here knows the stream engine: a stream let in leaves as [`Admitted`] (what it subscribed
//! to, its [`Guard`] to check again, its slot), and serving it is the parent module's.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Status, Streaming};

use sluice_crds::sidecar_config::queue_in_namespace;

use super::{
    GrpcOptions,
    proto::{self, WorkerMessage, worker_message::Msg as In},
};
use crate::queue::{
    auth::{Access, Authenticator, Origin, Refusal, User},
    metrics::QueueMetrics,
};

/// Most kinds one stream may name (`subscribe.kinds`).
pub const MAX_KINDS: usize = 100;
/// Most jobs one stream may run at once (`subscribe.slots`).
pub const MAX_SLOTS: u32 = 1024;
/// How long a new stream's admission may take, from its start until it is let in: the TokenReview,
/// `subscribe`, the SubjectAccessReviews (default of [`Admission::timeout`]).
pub const ADMISSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Most streams of one caller that may be pending at once (default of
/// [`Admission::pending_per_caller`]): opened, and not yet subscribed and authorized.
pub const MAX_PENDING_PER_CALLER: usize = 2;

/// How a new stream is let in before it holds one of [`GrpcOptions::max_streams`]: it is *pending*
/// from authentication until its `subscribe` is read and its caller authorized on the queues it names.
/// At most `max_streams` streams are pending at once, and at most `pending_per_caller` of one caller
/// (the user the TokenReview named; with callers unchecked, only the total applies), so that a caller
/// with no right on the queues can hold neither the stream slots nor all the room to wait for one.
#[derive(Clone, Copy, Debug)]
pub struct Admission {
    /// How long a new stream's admission may take, from the stream's start (TokenReview, `subscribe`,
    /// SubjectAccessReviews) before it ends `DEADLINE_EXCEEDED`.
    pub timeout: Duration,
    /// Most streams of one caller pending at once.
    pub pending_per_caller: usize,
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            timeout: ADMISSION_TIMEOUT,
            pending_per_caller: MAX_PENDING_PER_CALLER,
        }
    }
}

/// The streams pending ([`Admission`]), in total and by checked caller.
#[derive(Default)]
struct Pending {
    /// Streams pending in all, and per checked caller (unchecked callers count in the total only).
    counts: Mutex<(usize, HashMap<String, usize>)>,
}

impl Pending {
    /// Counts a new stream of `caller` as pending until the slot returned is dropped (the stream
    /// subscribed and was authorized, was refused, timed out or went away); `UNAVAILABLE` naming the cap
    /// (a moment's refusal: the caller tries again) when `total` streams, or `per_caller` of this
    /// caller's, are pending already.
    fn enter(
        self: &Arc<Self>,
        caller: Option<String>,
        total: usize,
        per_caller: usize,
    ) -> std::result::Result<PendingSlot, Refused> {
        let mut counts = self.counts.lock().expect("pending lock");
        let (all, by_caller) = &mut *counts;
        if *all >= total {
            return Err(Refused::pending_full(total));
        }
        // Unchecked callers have no identity to tell apart: the total alone bounds them (a cap of one
        // "caller" would refuse a pod's own workers starting at once).
        if let Some(user) = &caller {
            let mine = by_caller.entry(user.clone()).or_default();
            if *mine >= per_caller {
                return Err(Refused::caller_pending_full(per_caller, user, *mine));
            }
            *mine += 1;
        }
        *all += 1;
        Ok(PendingSlot {
            pending: self.clone(),
            caller,
        })
    }
}

/// One pending stream, counted until dropped.
struct PendingSlot {
    pending: Arc<Pending>,
    caller: Option<String>,
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        let mut counts = self.pending.counts.lock().expect("pending lock");
        let (all, by_caller) = &mut *counts;
        *all -= 1;
        if let Some(user) = &self.caller
            && let Some(mine) = by_caller.get_mut(user)
        {
            *mine -= 1;
            if *mine == 0 {
                by_caller.remove(user);
            }
        }
    }
}

/// Why a stream was not let in (or, `Database`, could not start once let in): the `reason` label of
/// `sluice_grpc_streams_refused_total` (a fixed set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RefuseReason {
    /// No token, or one the TokenReview did not accept (`UNAUTHENTICATED`).
    Unauthenticated,
    /// The caller may not take jobs of a queue it named (`PERMISSION_DENIED`).
    Forbidden,
    /// The API server could not be asked, or too many reviews were in flight (`UNAVAILABLE`).
    Unavailable,
    /// A review did not come back within the admission's deadline (`DEADLINE_EXCEEDED`).
    ReviewTimeout,
    /// As many streams as `max_streams` were waiting already (`UNAVAILABLE`).
    PendingFull,
    /// The caller had as many streams waiting as one may (`UNAVAILABLE`).
    CallerPendingFull,
    /// Every stream slot was taken (`RESOURCE_EXHAUSTED`).
    StreamsFull,
    /// The stream ended, broke or sent nothing readable before `subscribe` within the deadline (a worker
    /// that goes away while its `subscribe` is awaited breaks the stream: counted here, not `Gone`).
    NoSubscribe,
    /// The first message was not a valid `subscribe` (`INVALID_ARGUMENT`), bytes that decode to no
    /// message (`INTERNAL`), or too large to read.
    Invalid,
    /// After the stream was let in, its engine could not start: the database pool, or its queues'
    /// settings could not be read (`INTERNAL`, `UNAVAILABLE`).
    Database,
    /// The worker went away (its call was dropped) while the stream waited for something other than
    /// the worker: a review.
    Gone,
}

impl RefuseReason {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden => "forbidden",
            Self::Unavailable => "unavailable",
            Self::ReviewTimeout => "review_timeout",
            Self::PendingFull => "pending_full",
            Self::CallerPendingFull => "caller_pending_full",
            Self::StreamsFull => "streams_full",
            Self::NoSubscribe => "no_subscribe",
            Self::Invalid => "invalid",
            Self::Database => "database",
            Self::Gone => "gone",
        }
    }
}

/// A stream refused before it was let in: why (for the metric) and the status it ends with.
#[derive(Debug)]
pub(super) struct Refused {
    /// Why, as a metric label.
    pub(super) reason: RefuseReason,
    /// What the worker is told.
    pub(super) status: Status,
}

impl Refused {
    pub(super) fn new(reason: RefuseReason, status: Status) -> Self {
        Self { reason, status }
    }

    /// `total` streams are waiting already.
    fn pending_full(total: usize) -> Self {
        Self::new(
            RefuseReason::PendingFull,
            Status::unavailable(format!(
                "at most {total} worker streams may wait for subscribe and authorization at once"
            )),
        )
    }

    /// `caller` has `per_caller` streams waiting already (`mine`).
    fn caller_pending_full(per_caller: usize, caller: &str, mine: usize) -> Self {
        Self::new(
            RefuseReason::CallerPendingFull,
            Status::unavailable(format!(
                "at most {per_caller} worker streams of one caller may wait for subscribe and \
                 authorization at once; {caller} has {mine}"
            )),
        )
    }

    /// The API server did not answer the `review` (of `what`) within the admission's deadline.
    fn review_timeout(what: &str, review: &str, within: Duration) -> Self {
        Self::new(
            RefuseReason::ReviewTimeout,
            Status::deadline_exceeded(format!(
                "{what} within {within:?}: the API server did not answer the {review} in time"
            )),
        )
    }

    /// The gatekeeper's refusal.
    fn of(refusal: Refusal) -> Self {
        let reason = match refusal {
            Refusal::Unauthenticated(_) => RefuseReason::Unauthenticated,
            Refusal::Forbidden(_) => RefuseReason::Forbidden,
            Refusal::Unavailable(_) => RefuseReason::Unavailable,
        };
        Self::new(reason, refusal_status(refusal))
    }

    /// A bad first message.
    fn invalid(status: Status) -> Self {
        Self::new(RefuseReason::Invalid, status)
    }
}

/// One stream in admission, from its start until it is let in or refused: counted in
/// `sluice_grpc_streams_pending` while it lives; dropped unsettled (the worker went away while it
/// waited), it counts as refused `gone`.
pub(super) struct Admitting {
    metrics: Arc<QueueMetrics>,
    settled: bool,
}

impl Admitting {
    pub(super) fn start(metrics: &Arc<QueueMetrics>) -> Self {
        metrics.grpc_stream_admitting();
        Self {
            metrics: metrics.clone(),
            settled: false,
        }
    }

    /// The stream was let in (`None`) or refused.
    pub(super) fn settle(mut self, refused: Option<RefuseReason>) {
        if let Some(reason) = refused {
            self.metrics.grpc_refused(reason.as_str());
        }
        self.settled = true;
    }
}

impl Drop for Admitting {
    fn drop(&mut self) {
        self.metrics.grpc_stream_settled();
        if !self.settled {
            self.metrics.grpc_refused(RefuseReason::Gone.as_str());
        }
    }
}

/// A stream let in: what it subscribed to, what to check again while it is open, and its stream slot.
pub(super) struct Admitted {
    pub(super) inbound: Streaming<WorkerMessage>,
    pub(super) sub: proto::Subscribe,
    pub(super) queues: Vec<String>,
    pub(super) kinds: Vec<String>,
    /// Who, for the log (`None`: callers are not checked).
    pub(super) caller: Option<String>,
    pub(super) guard: Option<Guard>,
    pub(super) permit: OwnedSemaphorePermit,
}

/// The verb on `jobqueues/jobs` a gRPC worker needs on each queue it takes jobs from (the verb of the
/// HTTP API's job-changing calls: taking, completing and retrying jobs changes them).
pub const WORK_VERB: &str = "update";

/// The gRPC code of a refusal, with its message.
pub fn refusal_status(refusal: Refusal) -> Status {
    match refusal {
        Refusal::Unauthenticated(m) => Status::unauthenticated(m),
        Refusal::Forbidden(m) => Status::permission_denied(m),
        Refusal::Unavailable(m) => Status::unavailable(m),
    }
}

/// Who opened a stream: authenticated once, at the start (as the Kubernetes API server does for a long
/// watch), so that a projected token the kubelet rotates while the stream is open does not end it.
struct Caller {
    user: User,
    /// Let in by a token (else: tokenless, from loopback).
    token: bool,
    /// The worker pod itself: allowed on the queues this sidecar serves without a SubjectAccessReview.
    own_pod: bool,
}

impl Caller {
    /// Who, and how they were let in, for the log: `<user> (tokenless, loopback)`, `<user> (token bound
    /// to this pod)` or `<user> (token)`.
    fn describe(&self) -> String {
        let how = match (self.token, self.own_pod) {
            (false, _) => "tokenless, loopback",
            (true, true) => "token bound to this pod",
            (true, false) => "token",
        };
        format!("{} ({how})", self.user.name)
    }
}

/// What an open stream's caller (other than the worker pod itself) was authorized for, authorized
/// again every [`Authenticator::recheck_every`] for the user authenticated at the start (no new
/// TokenReview: the token may have been rotated since).
pub(super) struct Guard {
    pub(super) auth: Arc<Authenticator>,
    user: User,
    /// One per queue subscribed to.
    accesses: Vec<Access>,
}

impl Guard {
    /// `Ok` while the caller is still authorized on every queue; the first refusal; else, when the API
    /// server could not be asked about some queue (the others were), `Refusal::Unavailable`.
    pub(super) async fn recheck(&self) -> std::result::Result<(), Refusal> {
        let mut unavailable = None;
        for access in &self.accesses {
            match self.auth.authorize(&self.user, access).await {
                Ok(()) => {}
                Err(Refusal::Unavailable(why)) => unavailable = Some(Refusal::Unavailable(why)),
                Err(refusal) => return Err(refusal),
            }
        }
        unavailable.map_or(Ok(()), Err)
    }
}

/// Lets new streams in: what they are checked against, the room to wait it gives out, and the stream
/// slots (one per stream let in, held until the stream ends).
pub(super) struct Admitter {
    admission: Admission,
    /// Queues the sidecar serves.
    queues: Vec<String>,
    /// The namespace a `subscribe.queues` name without one is in.
    namespace: Option<String>,
    /// Checks callers; `None`: callers are not checked.
    auth: Option<Arc<Authenticator>>,
    /// The worker pod's name: a caller whose token is bound to it is the pod itself.
    pod_name: Option<String>,
    /// The address the listener is bound to (`0.0.0.0:9903` is not loopback, even for a connection that
    /// reached it on 127.0.0.1); unknown: not loopback.
    bound: SocketAddr,
    max_streams: u32,
    /// One per stream let in.
    streams: Arc<Semaphore>,
    pending: Arc<Pending>,
}

impl Admitter {
    /// Lets streams in to the service `opts` describes by `admission`, on a listener bound to `bound`.
    pub(super) fn new(opts: &GrpcOptions, admission: Admission, bound: Option<SocketAddr>) -> Self {
        Self {
            admission,
            queues: opts.queues.clone(),
            namespace: opts.namespace.clone(),
            auth: opts.auth.clone(),
            pod_name: opts.pod_name.clone(),
            bound: bound.unwrap_or_else(|| ([0, 0, 0, 0], 0).into()),
            max_streams: opts.max_streams,
            streams: Arc::new(Semaphore::new(opts.max_streams.max(1) as usize)),
            pending: Arc::default(),
        }
    }

    /// Checks a `subscribe`; the queues and kinds the stream takes (no kinds: all of them).
    fn subscription(
        &self,
        sub: &proto::Subscribe,
    ) -> std::result::Result<(Vec<String>, Vec<String>), Status> {
        let served = &self.queues;
        if sub.kinds.len() > MAX_KINDS {
            return Err(Status::invalid_argument(format!(
                "subscribe.kinds: {} kinds is over the limit of {MAX_KINDS}",
                sub.kinds.len()
            )));
        }
        let mut kinds: Vec<String> = Vec::new();
        for k in &sub.kinds {
            if k.is_empty() || k.len() > 200 {
                return Err(Status::invalid_argument(format!(
                    "subscribe.kinds: {k:?} is not a kind (1-200 characters)"
                )));
            }
            if !kinds.contains(k) {
                kinds.push(k.clone());
            }
        }
        if sub.slots == 0 || sub.slots > MAX_SLOTS {
            return Err(Status::invalid_argument(format!(
                "subscribe.slots: {} is not between 1 and {MAX_SLOTS}",
                sub.slots
            )));
        }
        if sub.queues.is_empty() {
            return Ok((served.clone(), kinds));
        }
        let mut queues = Vec::new();
        for q in &sub.queues {
            let q = &queue_in_namespace(self.namespace.as_deref(), q);
            if !served.contains(q) {
                // With callers checked, the queues served are named to nobody before they are
                // authorized.
                let serves = if self.auth.is_some() {
                    String::new()
                } else {
                    format!(" (it serves {})", served.join(", "))
                };
                return Err(Status::invalid_argument(format!(
                    "subscribe.queues: this sidecar does not serve queue {q:?}{serves}"
                )));
            }
            if !queues.contains(q) {
                queues.push(q.clone());
            }
        }
        Ok((queues, kinds))
    }

    /// Who opened the stream (`None` when callers are not checked): `UNAUTHENTICATED` without a valid
    /// token unless a tokenless caller is let in from loopback.
    async fn authenticate<T>(&self, request: &Request<T>) -> std::result::Result<Option<Caller>, Refused> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let authorization = request.metadata().get("authorization").map(|v| v.as_bytes());
        let user = auth
            .authenticate(Origin {
                authorization,
                peer: request.remote_addr().unwrap_or_else(|| ([0, 0, 0, 0], 0).into()),
                local: self.bound,
            })
            .await
            .map_err(Refused::of)?;
        let own_pod = match authorization {
            // Let in without a token: the pod's own loopback.
            None => true,
            Some(_) => {
                auth.pod_account().is_some_and(|pod| pod.name == user.name)
                    && self
                        .pod_name
                        .as_deref()
                        .is_some_and(|pod| user.is_bound_to_pod(pod))
            }
        };
        Ok(Some(Caller {
            user,
            token: authorization.is_some(),
            own_pod,
        }))
    }

    /// Whether `caller` may take jobs from `queues` (served by this sidecar): what to authorize again
    /// while the stream is open (nothing for the worker pod itself: its identity cannot change, and the
    /// pod's deletion stops this sidecar), or `PERMISSION_DENIED` naming the user, the verb and the
    /// first JobQueue refused.
    async fn authorize(
        &self,
        caller: Caller,
        queues: &[String],
    ) -> std::result::Result<Option<Guard>, Refused> {
        let auth = self
            .auth
            .clone()
            .expect("a caller is authenticated only with an authenticator");
        if caller.own_pod {
            return Ok(None);
        }
        let mut accesses = Vec::with_capacity(queues.len());
        for q in queues {
            let access = Access::jobs(WORK_VERB, self.short_name(q));
            auth.authorize(&caller.user, &access).await.map_err(Refused::of)?;
            accesses.push(access);
        }
        Ok(Some(Guard {
            auth,
            user: caller.user,
            accesses,
        }))
    }

    /// `queue`'s name within the sidecar's namespace (its JobQueue's `queueName`), as the HTTP API names
    /// it to authorize.
    fn short_name(&self, queue: &str) -> String {
        self.namespace
            .as_deref()
            .and_then(|ns| queue.strip_prefix(ns)?.strip_prefix('/'))
            .unwrap_or(queue)
            .to_owned()
    }

    /// Lets a new stream in, or says why not. All of it, from the stream's start, is under
    /// [`Admission::timeout`] (`DEADLINE_EXCEEDED` naming the step that was slow). The order, never
    /// taking room before the caller is known (so unauthenticated streams cannot take room from
    /// authenticated ones, nor from the worker pod itself):
    ///
    /// 1. Who is calling (a TokenReview, unless cached or tokenless).
    /// 2. Room to wait, taken: in total and per caller (none for the worker pod itself).
    /// 3. `subscribe`, read and checked.
    /// 4. Whether the caller may take jobs of the queues it named (SubjectAccessReviews, unless cached or
    ///    the worker pod itself).
    /// 5. A stream slot.
    ///
    /// The room taken at 2 is given back when this returns (or the worker goes away: the future is
    /// dropped), whatever the outcome; the slot is the stream's until it ends.
    pub(super) async fn admit(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> std::result::Result<Admitted, Refused> {
        let admission = self.admission;
        let within = admission.timeout;
        let deadline = tokio::time::Instant::now() + within;
        let total = self.max_streams.max(1) as usize;
        let caller = tokio::time::timeout_at(deadline, self.authenticate(&request))
            .await
            .map_err(|_| {
                Refused::review_timeout("the caller's token was not checked", "TokenReview", within)
            })??;
        // Until its caller is authorized on the queues its subscribe names, the stream is only pending
        // (capped in total and per caller): a caller with no right on them must not hold a stream slot,
        // else it keeps the sidecar's workers out by opening streams it never subscribes on or that are
        // refused. `pending` counts it until dropped. The worker pod itself is let in on its queues
        // without a review: it waits for nothing but its own `subscribe`, and others' waiting streams
        // must not keep it out.
        let pending = match &caller {
            Some(c) if c.own_pod => None,
            _ => Some(self.pending.enter(
                caller.as_ref().map(|c| c.user.name.clone()),
                total,
                admission.pending_per_caller.max(1),
            )?),
        };
        let mut inbound = request.into_inner();
        let first = match tokio::time::timeout_at(deadline, inbound.message()).await {
            Err(_) => {
                return Err(Refused::new(
                    RefuseReason::NoSubscribe,
                    Status::deadline_exceeded(format!("no subscribe within {within:?}")),
                ));
            }
            // Bytes that are no message: too large to read (`OUT_OF_RANGE`, `RESOURCE_EXHAUSTED` past
            // the decompression limit) or not a protobuf `WorkerMessage` (`INTERNAL`), statuses made by
            // tonic's decoder, with no error under them. Anything else: the stream broke (a reset, an
            // HTTP/2 error, which tonic gives with the h2 error as source, the connection lost).
            Ok(Err(status))
                if matches!(
                    status.code(),
                    tonic::Code::OutOfRange | tonic::Code::ResourceExhausted | tonic::Code::Internal
                ) && std::error::Error::source(&status).is_none() =>
            {
                return Err(Refused::invalid(status));
            }
            Ok(Err(status)) => return Err(Refused::new(RefuseReason::NoSubscribe, status)),
            Ok(Ok(None)) => {
                return Err(Refused::new(
                    RefuseReason::NoSubscribe,
                    Status::invalid_argument("the stream ended before subscribe"),
                ));
            }
            Ok(Ok(Some(m))) => m,
        };
        let Some(In::Subscribe(sub)) = first.msg else {
            return Err(Refused::invalid(Status::invalid_argument(
                "the first message must be subscribe",
            )));
        };
        let (queues, kinds) = self.subscription(&sub).map_err(Refused::invalid)?;
        let caller_name = caller.as_ref().map(Caller::describe);
        let guard = match caller {
            Some(caller) => tokio::time::timeout_at(deadline, self.authorize(caller, &queues))
                .await
                .map_err(|_| {
                    Refused::review_timeout("the caller was not authorized", "SubjectAccessReview", within)
                })??,
            None => None,
        };
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            Refused::new(
                RefuseReason::StreamsFull,
                Status::resource_exhausted(format!(
                    "this sidecar serves at most {} worker streams at once",
                    self.max_streams
                )),
            )
        })?;
        drop(pending);
        Ok(Admitted {
            inbound,
            sub,
            queues,
            kinds,
            caller: caller_name,
            guard,
            permit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_caller_waits_with_at_most_its_share_and_everyone_with_at_most_the_total() {
        let pending = Arc::new(Pending::default());
        let enter = |caller: &str| pending.enter(Some(caller.into()), 3, 2);
        let first = enter("a").unwrap();
        let _second = enter("a").unwrap();
        let refused = enter("a").err().expect("a caller's third is refused");
        assert_eq!(refused.reason, RefuseReason::CallerPendingFull);
        assert_eq!(refused.status.code(), tonic::Code::Unavailable);
        let _other = enter("b").unwrap();
        let refused = enter("c").err().expect("past the total, anyone is refused");
        assert_eq!(refused.reason, RefuseReason::PendingFull);
        assert_eq!(refused.status.code(), tonic::Code::Unavailable);
        drop(first);
        enter("a").expect("the room given back is the caller's again");
    }

    #[test]
    fn unchecked_callers_are_bounded_by_the_total_alone_and_give_their_room_back() {
        let pending = Arc::new(Pending::default());
        let waiting: Vec<_> = (0..3).map(|_| pending.enter(None, 3, 1).unwrap()).collect();
        let refused = pending.enter(None, 3, 1).err().expect("past the total");
        assert_eq!(refused.reason, RefuseReason::PendingFull);
        drop(waiting);
        assert_eq!(*pending.counts.lock().unwrap(), (0, HashMap::new()));
    }
}

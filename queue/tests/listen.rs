//! The LISTEN loop against a real PostgreSQL: a connection whose server goes silent is found out by its
//! probe and made again, and a quiet connection that still answers is kept.

use std::{ops::ControlFlow, time::Duration};

use sluice_queue::listen::{self, Event, Liveness};
use sluice_testsupport::{PgServer, wait_for_async};
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const CHANNEL: &str = "sluice_listen_test";
/// The listener pool's `application_name`, to find its backend.
const APP: &str = "sluice-listen-test";
const DEADLINE: Duration = Duration::from_secs(20);
/// A probe after 100 ms of quiet: many probes within a test.
const PROBED_OFTEN: Liveness = Liveness {
    quiet: Duration::from_millis(100),
    deadline: Duration::from_secs(3),
};
/// A probe after 1 s of quiet: a backend frozen right after the first `Listening` is idle, not in
/// the middle of a probe holding a lock others need.
const PROBED_LATER: Liveness = Liveness {
    quiet: Duration::from_secs(1),
    deadline: Duration::from_secs(3),
};

/// What the listener reported, owned.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Listening,
    Enqueued(String),
}

/// A listener on [`CHANNEL`] checked as `liveness` says, with the settings of a pool named [`APP`];
/// stopped on drop.
struct Listener {
    events: mpsc::UnboundedReceiver<Seen>,
    stop: CancellationToken,
}

impl Listener {
    fn start(pg: &PgServer, liveness: Liveness) -> Self {
        // One connection: a listener that took its connection from this pool, and left a frozen one
        // pinned in it, would never get another.
        let pool = sluice_queue::pool::options(1)
            .connect_lazy(&format!("{}?application_name={APP}", pg.url()))
            .unwrap();
        let (tx, events) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            listen::listen_with(&pool, CHANNEL, "test", liveness, &token, |event| {
                let _ = tx.send(match event {
                    Event::Listening => Seen::Listening,
                    Event::Enqueued(payload) => Seen::Enqueued(payload.to_owned()),
                });
                ControlFlow::Continue(())
            })
            .await
        });
        Self { events, stop }
    }

    async fn next(&mut self) -> Seen {
        tokio::time::timeout(DEADLINE, self.events.recv())
            .await
            .expect("an event within the deadline")
            .expect("the listener runs")
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The pids of the listener's backends that ran a statement (not a connection attempt given up
/// before its `LISTEN`), oldest first.
async fn listener_backends(admin: &PgPool) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query <> '' \
         ORDER BY backend_start",
    )
    .bind(APP)
    .fetch_all(admin)
    .await
    .unwrap()
}

async fn notify(admin: &PgPool, payload: &str) {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(payload)
        .execute(admin)
        .await
        .unwrap();
}

// A server that goes silent under the LISTEN connection (its backend frozen: the socket stays open and
// nothing answers, as a failover or a dropped NAT entry leaves it) raises no error on a connection that
// only reads. The probe after a quiet spell goes unanswered, the connection is given up and made
// again (reported as `Listening`: notifications may have been missed), and a notification sent after
// that arrives.
#[tokio::test]
async fn a_listen_connection_gone_silent_is_made_again() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let admin = sluice_queue::pool::options(2).connect(&pg.url()).await.unwrap();
    let mut listener = Listener::start(&pg, PROBED_LATER);
    assert_eq!(listener.next().await, Seen::Listening);
    let backends = listener_backends(&admin).await;
    assert_eq!(backends.len(), 1, "{backends:?}");
    let silent = u32::try_from(backends[0]).unwrap();
    let _thaw = pg.freeze_backends([silent]);

    assert_eq!(listener.next().await, Seen::Listening);
    let now = listener_backends(&admin).await;
    assert!(now.len() == 2 && now[0] == backends[0], "{now:?}");
    notify(&admin, "after").await;
    assert_eq!(listener.next().await, Seen::Enqueued("after".into()));
}

// A quiet connection that answers its probe is kept: the probe ran on it (`SELECT 1` is its last
// statement), it is still the only one, nothing but the first `Listening` was reported, and it still
// delivers.
#[tokio::test]
async fn a_quiet_listen_connection_that_answers_is_kept() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let admin = sluice_queue::pool::options(2).connect(&pg.url()).await.unwrap();
    let mut listener = Listener::start(&pg, PROBED_OFTEN);
    assert_eq!(listener.next().await, Seen::Listening);
    let backends = listener_backends(&admin).await;
    wait_for_async("a probe on the LISTEN connection", DEADLINE, || async {
        let last: Option<String> =
            sqlx::query_scalar("SELECT query FROM pg_stat_activity WHERE application_name = $1")
                .bind(APP)
                .fetch_optional(&admin)
                .await
                .unwrap();
        (last.as_deref() == Some("SELECT 1")).then_some(())
    })
    .await;
    notify(&admin, "still").await;
    assert_eq!(listener.next().await, Seen::Enqueued("still".into()));
    assert_eq!(listener_backends(&admin).await, backends);
    assert!(listener.events.try_recv().is_err(), "nothing else was reported");
}

// A LISTEN connection the server ends (a restart, an administrator's `pg_terminate_backend`) is made
// again by the loop and reported as `Listening` (notifications may have been missed), and a
// notification sent after that arrives.
#[tokio::test]
async fn a_listen_connection_the_server_ends_is_made_again_and_reported() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let admin = sluice_queue::pool::options(2).connect(&pg.url()).await.unwrap();
    let mut listener = Listener::start(&pg, PROBED_OFTEN);
    assert_eq!(listener.next().await, Seen::Listening);
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(listener_backends(&admin).await[0])
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(ended);
    assert_eq!(listener.next().await, Seen::Listening);
    notify(&admin, "after").await;
    assert_eq!(listener.next().await, Seen::Enqueued("after".into()));
}

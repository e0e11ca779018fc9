//! Periodic jobs on a real PostgreSQL: a schedule makes exactly one job per fire time however many
//! workers run its scheduler at once, none for the time before it existed, and catches up on missed
//! fire times only as `missedRuns` says.

mod support;

use serde_json::json;
use sluice_queue::{
    NewJob, QueueStore,
    schedule::MissedRuns,
    store::{Schedule, ScheduleRun},
};
use sluice_testsupport::PgServer;

async fn setup() -> (PgServer, QueueStore) {
    let (server, _, store) = support::server_with_queue(20).await;
    (server, store)
}

fn every_minute(name: &str, missed: MissedRuns) -> Schedule {
    Schedule::new(
        name,
        "* * * * *",
        Some("Europe/Berlin"),
        NewJob::new("tick", json!({})),
        missed,
    )
    .unwrap()
}

/// Moves the schedule's watermark back by `minutes` (as if no scheduler had run for that long).
async fn rewind(store: &QueueStore, name: &str, minutes: i32) {
    sqlx::query(
        "UPDATE sluice.schedules SET handled_until = handled_until - make_interval(mins => $2) WHERE name = $1",
    )
    .bind(name)
    .bind(minutes)
    .execute(store.pool())
    .await
    .unwrap();
}

async fn jobs_of(store: &QueueStore, name: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT unique_key FROM sluice.jobs WHERE unique_key LIKE $1 ORDER BY unique_key")
        .bind(format!("schedule:{name}:%"))
        .fetch_all(store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_schedulers_make_one_job_per_fire_time() {
    let (_pg, store) = setup().await;
    let s = every_minute("tick", MissedRuns::All);
    let first = store
        .fire_schedule("q", &s)
        .await
        .unwrap()
        .expect("not contended");
    assert!(
        first.fired.is_empty(),
        "a new schedule does not fire for the past"
    );
    assert!(first.next_fire_at.is_some());

    rewind(&store, "tick", 10).await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (store, s) = (store.clone(), s.clone());
            tokio::spawn(async move { store.fire_schedule("q", &s).await.unwrap() })
        })
        .collect();
    let mut runs: Vec<ScheduleRun> = Vec::new();
    for t in tasks {
        runs.extend(t.await.unwrap());
    }
    let fired: usize = runs.iter().map(|r| r.fired.len()).sum();
    assert!(
        (10..=11).contains(&fired),
        "ten minutes of fire times, once: {fired}"
    );
    assert_eq!(
        runs.iter().filter(|r| !r.fired.is_empty()).count(),
        1,
        "one pass fired them"
    );
    let keys = jobs_of(&store, "tick").await;
    assert_eq!(keys.len(), fired);
    let mut distinct = keys.clone();
    distinct.dedup();
    assert_eq!(distinct, keys, "one job per fire time");

    let state = &store.schedules("q").await.unwrap()[0];
    assert_eq!(state.name, "tick");
    assert!(state.last_fire_at.is_some() && state.next_fire_at > state.last_fire_at);
    // Nothing new until the next minute.
    let again = store.fire_schedule("q", &s).await.unwrap().unwrap();
    assert!(again.fired.len() <= 1);
}

#[tokio::test]
async fn missed_fire_times_are_skipped_or_run_once_as_the_schedule_says() {
    let (_pg, store) = setup().await;
    for (name, missed, want) in [
        ("skip", MissedRuns::Skip, 0..=1),
        ("once", MissedRuns::RunOnce, 1..=2),
    ] {
        let s = every_minute(name, missed);
        store.fire_schedule("q", &s).await.unwrap();
        rewind(&store, name, 30).await;
        let run = store.fire_schedule("q", &s).await.unwrap().unwrap();
        assert!(want.contains(&run.fired.len()), "{name}: {:?}", run.fired);
        assert_eq!(jobs_of(&store, name).await.len(), run.fired.len());
    }
}

#[test]
fn bad_schedules_are_refused_naming_the_field() {
    let job = NewJob::new("k", json!({}));
    let e = Schedule::new("bad name", "* * * * *", None, job.clone(), MissedRuns::Skip).unwrap_err();
    assert!(e.to_string().contains("schedule name"), "{e}");
    let e = Schedule::new("s", "every day", None, job.clone(), MissedRuns::Skip).unwrap_err();
    assert!(e.to_string().contains("cron \"every day\""), "{e}");
    let e = Schedule::new(
        "s",
        "* * * * *",
        Some("Nowhere/Land"),
        job.clone(),
        MissedRuns::Skip,
    )
    .unwrap_err();
    assert!(e.to_string().contains("timeZone"), "{e}");
    let keyed = job.idempotency_key("k");
    assert!(Schedule::new("s", "* * * * *", None, keyed, MissedRuns::Skip).is_err());
}

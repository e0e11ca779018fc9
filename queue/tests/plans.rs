//! Query plans of the worker's hot statements, and of the depth every worker and the operator read, on a
//! table the size of a real backlog.
//!
//! The bug this guards against: with 100k jobs, completing a batch of 1,000 took over a second because
//! the planner scanned the partial running index (statistics said almost nothing runs) and filtered every
//! running job against the whole id array, instead of looking the ids up by primary key. Plans are taken
//! from statistics gathered while nothing was running, which is what a worker meets after a bulk
//! enqueue. The by-id batch statements must look ids up by primary key in their generic plan, and the
//! store must run them with it (their custom plans scan the table below a few hundred thousand rows:
//! see `sluice_queue::sql`); the claim must do so in both plans. EXPLAIN only: nothing is timed.

use sluice_queue::{
    NewJob, QueueSettings, QueueStore, schema, sql,
    store::{Finish, Finished},
};
use sluice_testsupport::PgServer;
// Statements are built from the crate's own SQL constants and numbers and ids the test made: no input
// from outside reaches them.
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

/// A server with the queue schema and a pool on it.
async fn pg() -> (PgServer, PgPool) {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = connect(&server.url(), 20).await;
    schema::migrate(&pool).await.expect("migrate");
    (server, pool)
}

/// A pool of `size` connections, connected now.
async fn connect(url: &str, size: u32) -> PgPool {
    sluice_queue::pool::options(size)
        .connect(url)
        .await
        .expect("connect")
}

/// Creates queue `name` with default settings.
async fn queue(store: &QueueStore, name: &str) {
    store.upsert_queue(&QueueSettings::defaults(name)).await.unwrap();
}

/// Jobs waiting in the queue, and as many finished ones beside them.
const BACKLOG: usize = 100_000;
/// Ids in each batch statement: the completer's largest batch.
const BATCH: usize = 1_000;

/// How PostgreSQL plans a prepared statement: its first executions, then after five.
const PLAN_MODES: [&str; 2] = ["force_custom_plan", "force_generic_plan"];

/// One scan of `sluice.jobs` in a plan: the node type and the index it reads, if any.
#[derive(Debug, PartialEq)]
struct Scan {
    node: String,
    index: Option<String>,
}

fn scans_of_jobs(plan: &serde_json::Value, out: &mut Vec<Scan>) {
    scans_of("jobs", plan, out)
}

/// The scans of `relation` in a plan. A bitmap heap scan is named with the index of its bitmap index
/// scan (the child that names the index; the heap scan names the relation).
fn scans_of(relation: &str, plan: &serde_json::Value, out: &mut Vec<Scan>) {
    if plan["Relation Name"] == relation && plan["Node Type"] != "ModifyTable" {
        let index = plan["Index Name"].as_str().or_else(|| {
            plan["Plans"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|c| c["Index Name"].as_str())
        });
        out.push(Scan {
            node: plan["Node Type"].as_str().unwrap_or_default().to_owned(),
            index: index.map(str::to_owned),
        });
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        scans_of(relation, child, out);
    }
}

fn node_types(plan: &serde_json::Value, out: &mut Vec<String>) {
    out.push(plan["Node Type"].as_str().unwrap_or_default().to_owned());
    for child in plan["Plans"].as_array().into_iter().flatten() {
        node_types(child, out);
    }
}

/// EXPLAIN (FORMAT JSON) of prepared statement `name` executed with `args`, planned in `mode`.
async fn explain(conn: &mut PgConnection, mode: &str, name: &str, args: &str) -> serde_json::Value {
    sqlx::raw_sql(AssertSqlSafe(format!("SET plan_cache_mode = {mode}")))
        .execute(&mut *conn)
        .await
        .unwrap();
    let row = sqlx::raw_sql(AssertSqlSafe(format!(
        "EXPLAIN (FORMAT JSON) EXECUTE {name}({args})"
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let doc: serde_json::Value = row.get(0);
    doc[0]["Plan"].clone()
}

fn array_literal(items: impl IntoIterator<Item = String>) -> String {
    format!("'{{{}}}'", items.into_iter().collect::<Vec<_>>().join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_statements_look_jobs_up_by_primary_key_in_a_large_table() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "plans").await;
    // Loaded in two statements so the test stays fast; ANALYZE sees no running job.
    sqlx::query(
        "INSERT INTO sluice.jobs (id, queue, kind, payload, max_attempts) \
         SELECT sluice.uuid_v7(), 'plans', 'k', jsonb_build_object('i', i), 3 FROM generate_series(1, $1) i",
    )
    .bind(BACKLOG as i32)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO sluice.jobs (id, queue, kind, payload, max_attempts, state, attempt, finished_at) \
         SELECT sluice.uuid_v7(), 'plans', 'k', '{}', 3, 'succeeded', 1, now() FROM generate_series(1, $1)",
    )
    .bind(BACKLOG as i32)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE sluice.jobs").execute(&pool).await.unwrap();
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM sluice.jobs ORDER BY id LIMIT $1")
        .bind(BATCH as i64)
        .fetch_all(&pool)
        .await
        .unwrap();
    let ids = array_literal(ids.iter().map(ToString::to_string));
    let ones = array_literal((0..BATCH).map(|_| "1".to_owned()));
    let s = array_literal((0..BATCH).map(|_| "s".to_owned()));
    let zeros = array_literal((0..BATCH).map(|_| "0".to_owned()));
    let empty = array_literal((0..BATCH).map(|_| "\"\"".to_owned()));

    let mut conn = pool.acquire().await.unwrap();
    let by_id = [
        (
            "finish",
            "uuid[], integer[], text[], bigint[], text[], text",
            sql::JOB_FINISH_FENCED,
            format!("{ids}, {ones}, {s}, {zeros}, {empty}, 'w'"),
        ),
        (
            "release",
            "uuid[], integer[], text",
            sql::JOB_RELEASE_FENCED,
            format!("{ids}, {ones}, 'w'"),
        ),
    ];
    for (name, types, statement, args) in &by_id {
        sqlx::raw_sql(AssertSqlSafe(format!("PREPARE {name}({types}) AS {statement}")))
            .execute(&mut *conn)
            .await
            .unwrap();
        {
            let mode = "force_generic_plan";
            let plan = explain(&mut conn, mode, name, args).await;
            let mut scans = Vec::new();
            scans_of_jobs(&plan, &mut scans);
            assert_eq!(
                scans,
                vec![Scan {
                    node: "Index Scan".into(),
                    index: Some("jobs_pkey".into()),
                }],
                "{name} ({mode}) must look its {BATCH} ids up by primary key, not scan \
                 sluice.jobs or the running index: {plan:#}"
            );
        }
    }

    // The heartbeats lock their jobs (skipping rows others hold), then write them; the running jobs'
    // also reads those it skipped: every scan by primary key.
    for (name, statement) in [
        ("heartbeat", sql::JOB_HEARTBEAT),
        ("heartbeat_finishing", sql::JOB_HEARTBEAT_FINISHING),
    ] {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "PREPARE {name}(uuid[], integer[], text, bigint) AS {statement}"
        )))
        .execute(&mut *conn)
        .await
        .unwrap();
        let plan = explain(
            &mut conn,
            "force_generic_plan",
            name,
            &format!("{ids}, {ones}, 'w', 30000"),
        )
        .await;
        let mut scans = Vec::new();
        scans_of_jobs(&plan, &mut scans);
        assert!(
            !scans.is_empty()
                && scans.iter().all(|s| *s
                    == Scan {
                        node: "Index Scan".into(),
                        index: Some("jobs_pkey".into()),
                    }),
            "{name} must look its {BATCH} ids up by primary key: {plan:#}"
        );
    }

    // The finish's look for children waiting on the batch: the partial index of unresolved edges, not
    // the resolved ones a graph-heavy queue keeps beside its finished jobs (here one per finished job).
    sqlx::query(
        "INSERT INTO sluice.job_dependencies (job_id, parent_id, resolved) \
         SELECT j.id, j.id, true FROM sluice.jobs j WHERE j.state = 'succeeded'",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE sluice.job_dependencies")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "PREPARE open_parents(uuid[]) AS {}",
        sql::JOB_OPEN_PARENTS
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    let plan = explain(&mut conn, "force_generic_plan", "open_parents", &ids).await;
    let mut scans = Vec::new();
    scans_of("job_dependencies", &plan, &mut scans);
    assert!(
        !scans.is_empty()
            && scans
                .iter()
                .all(|s| s.index.as_deref() == Some("job_dependencies_parent_idx")),
        "open parents must probe the index of unresolved edges: {plan:#}"
    );

    // The finish's locks, run only when some job of the batch has waiting children: every job of the
    // batch and every waiting child by primary key, the children found in the index of unresolved edges,
    // in one statement. In the function `v_parents` is a variable; here it is the seventh parameter.
    let finish_types = "uuid[], integer[], text[], bigint[], text[], text, uuid[], uuid[]";
    let finish_args = format!("{ids}, {ones}, {s}, {zeros}, {empty}, 'w', {ids}, {ids}");
    for (name, statement) in [
        ("lock_finishing", sql::JOB_LOCK_FINISHING),
        ("lock_finishing_failing", sql::JOB_LOCK_FINISHING_FAILING),
    ] {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "PREPARE {name}({finish_types}) AS {}",
            statement.replace("v_parents", "$7").replace("v_roots", "$8")
        )))
        .execute(&mut *conn)
        .await
        .unwrap();
        let plan = explain(&mut conn, "force_generic_plan", name, &finish_args).await;
        let mut scans = Vec::new();
        scans_of_jobs(&plan, &mut scans);
        assert_eq!(
            scans,
            vec![Scan {
                node: "Index Scan".into(),
                index: Some("jobs_pkey".into()),
            }],
            "{name} must look its jobs up by primary key: {plan:#}"
        );
        let mut edges = Vec::new();
        scans_of("job_dependencies", &plan, &mut edges);
        assert!(
            edges
                .iter()
                .all(|s| s.index.as_deref() == Some("job_dependencies_parent_idx")),
            "{name} must probe the index of unresolved edges: {plan:#}"
        );
    }

    // The locks the other paths that write several jobs take first, in one statement in id order (the
    // trigger releasing children, an enqueue naming parents, a graph naming parents outside it): the
    // jobs by primary key, children found in the index of unresolved edges, unique keys' holders in
    // the unique-key index and idempotency keys' holders in the idempotency-key index. In the functions
    // the parameters are variables; here they are parameters. Both plans: these functions run with
    // PostgreSQL's default plan cache mode.
    for (name, statement, types, variables, args, holders) in [
        (
            "lock_children",
            sql::JOB_LOCK_CHILDREN,
            "uuid[]",
            &["v_parents"][..],
            ids.clone(),
            &[][..],
        ),
        (
            "lock_parents",
            sql::JOB_LOCK_PARENTS,
            "uuid[], text, text, text",
            &["v_parents", "p_queue", "p_unique_key", "p_idempotency_key"][..],
            format!("{ids}, 'plans', 'k', 'i'"),
            &["jobs_unique_idx", "jobs_idempotency_idx"][..],
        ),
        (
            "lock_graph_parents",
            sql::JOB_LOCK_GRAPH_PARENTS,
            "uuid[], text, text[], text[]",
            &["v_outside", "v_queue", "v_keys", "v_ikeys"][..],
            format!("{ids}, 'plans', '{{k}}', '{{i}}'"),
            &["jobs_unique_idx", "jobs_idempotency_idx"][..],
        ),
        (
            "lock_batch_holders",
            sql::JOB_LOCK_BATCH_HOLDERS,
            "text, text[], text[]",
            &["$8", "$9"][..],
            "'plans', '{i}', '{k}'".to_owned(),
            &["jobs_unique_idx", "jobs_idempotency_idx"][..],
        ),
        (
            "job_cascade",
            sql::JOB_CASCADE,
            "uuid[]",
            &["p_roots"][..],
            ids.clone(),
            &[][..],
        ),
        (
            "lock_rescuing",
            sql::JOB_LOCK_RESCUING,
            "uuid[]",
            &["v_ending"][..],
            ids.clone(),
            &[][..],
        ),
        (
            "lock_releasing",
            sql::JOB_LOCK_RELEASING,
            "uuid[], text",
            &[][..],
            format!("{ids}, 'w'"),
            &[][..],
        ),
    ] {
        let mut statement = statement.to_owned();
        // The batch's statement names its parameters by position already: `$1` stays, the others
        // follow it.
        let first = usize::from(name == "lock_batch_holders");
        for (n, variable) in variables.iter().enumerate() {
            statement = statement.replace(variable, &format!("${}", n + 1 + first));
        }
        sqlx::raw_sql(AssertSqlSafe(format!("PREPARE {name}({types}) AS {statement}")))
            .execute(&mut *conn)
            .await
            .unwrap();
        for mode in PLAN_MODES {
            let plan = explain(&mut conn, mode, name, &args).await;
            let mut scans = Vec::new();
            scans_of_jobs(&plan, &mut scans);
            assert!(
                scans.iter().any(|s| s.index.as_deref() == Some("jobs_pkey"))
                    && scans.iter().all(|s| {
                        s.node.starts_with("Index")
                            && matches!(
                                s.index.as_deref(),
                                Some("jobs_pkey" | "jobs_unique_idx" | "jobs_idempotency_idx")
                            )
                    }),
                "{name} ({mode}) must look its jobs up by primary key (holders by their key's index): \
                 {plan:#}"
            );
            for index in holders {
                assert!(
                    scans.iter().any(|s| s.index.as_deref() == Some(*index)),
                    "{name} ({mode}) must look its holders up in {index}: {plan:#}"
                );
            }
            let mut edges = Vec::new();
            scans_of("job_dependencies", &plan, &mut edges);
            assert!(
                edges
                    .iter()
                    .all(|s| s.index.as_deref() == Some("job_dependencies_parent_idx")),
                "{name} ({mode}) must probe the index of unresolved edges: {plan:#}"
            );
        }
    }

    sqlx::raw_sql(AssertSqlSafe(format!(
        "PREPARE claim(text, text, bigint, bigint) AS {}",
        sql::JOB_CLAIM_BATCH
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    for mode in PLAN_MODES {
        let plan = explain(&mut conn, mode, "claim", "'plans', 'w', 200, 30000").await;
        let mut scans = Vec::new();
        scans_of_jobs(&plan, &mut scans);
        let mut nodes = Vec::new();
        node_types(&plan, &mut nodes);
        assert_eq!(
            scans,
            vec![
                Scan {
                    node: "Index Scan".into(),
                    index: Some("jobs_claim_idx".into()),
                },
                Scan {
                    node: "Index Scan".into(),
                    index: Some("jobs_pkey".into()),
                },
            ],
            "claim ({mode}) must pick from the claim index in order and update by primary key: {plan:#}"
        );
        assert!(
            !nodes.iter().any(|n| n == "Sort"),
            "claim ({mode}) reads the claim index in order, without sorting the backlog: {plan:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_counts_dead_jobs_without_reading_the_finished_ones() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "depth").await;
    sqlx::query(
        "INSERT INTO sluice.jobs (id, queue, kind, payload, max_attempts, state, attempt, finished_at) \
         SELECT sluice.uuid_v7(), 'depth', 'k', '{}', 3, CASE WHEN i % 1000 = 0 THEN 'dead' ELSE 'succeeded' END, \
                1, now() FROM generate_series(1, $1) i",
    )
    .bind(BACKLOG as i32)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE sluice.jobs").execute(&pool).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "PREPARE depth(text) AS {}",
        sql::QUEUE_DEPTH
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    for mode in PLAN_MODES {
        let plan = explain(&mut conn, mode, "depth", "'depth'").await;
        let mut scans = Vec::new();
        scans_of_jobs(&plan, &mut scans);
        assert!(
            scans
                .iter()
                .all(|s| s.index.as_deref() != Some("jobs_finished_idx") && s.node != "Seq Scan"),
            "depth ({mode}) must not read the finished jobs: {plan:#}"
        );
        assert!(
            scans.iter().any(|s| s.index.as_deref() == Some("jobs_dead_idx")),
            "depth ({mode}) counts dead jobs from their own index: {plan:#}"
        );
    }
    let depth = store.depth("depth").await.unwrap().unwrap();
    assert_eq!(depth.dead, (BACKLOG / 1000) as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_runs_the_batch_statements_with_their_generic_plan() {
    let (pg, pool) = pg().await;
    // One connection, so the statements the store prepares are visible to the checking query.
    let one = connect(&pg.url(), 1).await;
    let store = QueueStore::new(one.clone());
    queue(&store, "generic").await;
    let jobs: Vec<_> = (0..3)
        .map(|i| NewJob::new("k", serde_json::json!({ "i": i })))
        .collect();
    store.enqueue_many("generic", &jobs).await.unwrap();
    let lease = std::time::Duration::from_secs(30);
    let claimed = store.claim_batch("generic", "w", 3, lease).await.unwrap();
    let held: Vec<(uuid::Uuid, i32)> = claimed.iter().map(|j| (j.id, j.attempt)).collect();
    assert_eq!(store.heartbeat("w", &held, lease).await.unwrap().len(), 3);
    assert_eq!(
        store.heartbeat_finishing("w", &held, lease).await.unwrap().len(),
        3
    );
    let done = [Finished {
        id: held[0].0,
        attempt: held[0].1,
        finish: Finish::Succeeded,
    }];
    assert_eq!(store.finish_batch("w", &done).await.unwrap().len(), 1);
    assert_eq!(store.release("w", &held[1..]).await.unwrap().len(), 2);

    for (name, statement) in [
        ("heartbeat", sql::JOB_HEARTBEAT),
        ("heartbeat_finishing", sql::JOB_HEARTBEAT_FINISHING),
        ("release", sql::JOB_RELEASE_FENCED),
    ] {
        let (generic, custom): (i64, i64) = sqlx::query_as(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
        )
        .bind(statement)
        .fetch_one(&one)
        .await
        .unwrap_or_else(|e| panic!("{name} was prepared on the store's connection: {e}"));
        assert_eq!(
            (generic, custom),
            (1, 0),
            "{name} runs with its generic plan from the first execution"
        );
    }

    // The finish runs in `sluice.finish_jobs`, whose statements PostgreSQL plans generically because
    // the function says so; the checks above are of the same statements' generic plans.
    let (config, body): (Vec<String>, String) = sqlx::query_as(
        "SELECT proconfig, prosrc FROM pg_proc \
          WHERE oid = 'sluice.finish_jobs(uuid[], integer[], text[], bigint[], text[], text)'::regprocedure",
    )
    .fetch_one(&one)
    .await
    .unwrap();
    assert_eq!(
        config,
        [
            "plan_cache_mode=force_generic_plan",
            "search_path=pg_catalog, pg_temp"
        ]
    );
    for (name, statement) in [
        ("finish", sql::JOB_FINISH_FENCED),
        ("open_parents", sql::JOB_OPEN_PARENTS),
        ("lock_finishing", sql::JOB_LOCK_FINISHING),
        ("lock_finishing_failing", sql::JOB_LOCK_FINISHING_FAILING),
    ] {
        assert!(
            runs_statement(&body, statement),
            "sluice.finish_jobs runs sql::{name} as the plan checks know it: {body}"
        );
    }
    drop(pool);
}

/// The functions run the lock statements the plan checks above know, word for word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_functions_take_their_locks_with_the_statements_whose_plans_are_checked() {
    let (_pg, pool) = pg().await;
    for (function, name, statement) in [
        (
            "sluice.release_dependents",
            "lock_children",
            sql::JOB_LOCK_CHILDREN,
        ),
        ("sluice.enqueue_job", "lock_parents", sql::JOB_LOCK_PARENTS),
        (
            "sluice.enqueue_graph",
            "lock_graph_parents",
            sql::JOB_LOCK_GRAPH_PARENTS,
        ),
        (
            "sluice.enqueue_many",
            "lock_batch_holders",
            sql::JOB_LOCK_BATCH_HOLDERS,
        ),
        ("sluice.job_cascade", "job_cascade", sql::JOB_CASCADE),
        ("sluice.rescue_expired", "lock_rescuing", sql::JOB_LOCK_RESCUING),
    ] {
        let body: String = sqlx::query_scalar("SELECT prosrc FROM pg_proc WHERE oid = $1::regproc")
            .bind(function)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(
            runs_statement(&body, statement),
            "{function} runs sql::{name} as the plan checks know it: {body}"
        );
    }
}

/// Whether the function body `body` runs `statement` whole: its words in order, followed by the end of
/// the statement (`;`, the `)` closing the subquery it is in, or the end of the body), so that a
/// statement that is only the start of what the function runs (one missing a `SKIP LOCKED`, say) does
/// not pass for it.
fn runs_statement(body: &str, statement: &str) -> bool {
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (body, statement) = (words(body), words(statement));
    body.match_indices(&statement).any(|(at, _)| {
        let rest = body[at + statement.len()..].trim_start();
        rest.is_empty() || rest.starts_with(';') || rest.starts_with(')')
    })
}

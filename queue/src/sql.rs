//! The queue's SQL, one named statement each, entity first (`job_claim_batch`, `job_finish_fenced`, ...).
//!
//! Every statement that changes a running job is fenced on (id, state running, lease owner, attempt):
//! a job rescued after its lease expired has another owner or a higher attempt, so the late worker's
//! write matches no row and the worker learns it lost the lease (River #1302 is the bug this prevents).
//!
//! The by-id batch statements (finish, heartbeat, release) join `unnest` of the ids to the table on the
//! primary key and write the fence's "running" as `lease_owner = $me AND lease_expires_at IS NOT NULL`,
//! which the table's CHECK makes equivalent to `state = 'running'` (a job is leased exactly while it
//! runs). They deliberately do not say `state = 'running'`: that would let the planner scan the partial
//! running index instead of looking the ids up. Statistics usually say almost no job is running (they are
//! taken between bursts), so both custom and generic plans then chose that index and filtered every
//! running job against the whole id array: O(running × batch) per statement. Found by the 100k-job
//! benchmark, where completing 1,000 jobs took 0.3-1.4 s; `tests/plans.rs` keeps it fixed.
//!
//! The store runs heartbeat and release under [`PLAN_GENERIC`], and finish through `sluice.finish_jobs`,
//! whose `SET plan_cache_mode` does the same. Their generic plan (the planner expects ~10 ids)
//! is always a nested loop from the ids into the primary key. A custom plan sees the 1,000 ids, prices
//! 1,000 index probes above one sequential scan of a table of ~100k rows, and — misled by statistics
//! saying no job has an owner — filters that scan into a nested loop against the id list: 0.4 s per batch
//! instead of 10 ms, measured. sqlx prepares each statement per connection and PostgreSQL plans the first
//! five executions custom, so every new pool connection paid that five times.
//!
//! Names. The statements Sluice sends itself resolve names through the session's `search_path`, which
//! Sluice does not set (a pinned path does not survive PgBouncer in transaction mode). PostgreSQL
//! searches pg_catalog first, but a function or operator elsewhere on the path whose argument types
//! match exactly beats a built-in that needs a cast or is polymorphic: a tenant that may create in
//! `public` could define `public.unnest(uuid[])` or `public.* (bigint, interval)`, and it would run as
//! whichever login sent the statement (another namespace's worker, the operator's owner login). So
//! these statements call every function as `pg_catalog.f(...)`, and write every operator that
//! pg_catalog does not have for its exact operand types as `OPERATOR(pg_catalog.op)` (`bigint *
//! interval`, `numeric * integer`, `uuid[] || uuid[]`; parenthesised, as `OPERATOR(...)` binds like any
//! other operator, tighter than `<` but looser than `+`). An `unnest` of two arrays is written as what
//! PostgreSQL turns it into, `ROWS FROM (pg_catalog.unnest(a), pg_catalog.unnest(b))`. Left as they
//! are: operators whose operands pg_catalog matches exactly (`uuid = uuid`, `text = text`,
//! `timestamptz + interval`) and built-in type names, which pg_catalog, searched first, always
//! supplies; a `search_path` that names pg_catalog after a schema others may create in would hand
//! those over too, and is not supported. `tests/row_level_security.rs` plants the overloads that would
//! win and checks that none runs.
//!
//! The statements that are bodies of `sluice` functions ([`JOB_FINISH_FENCED`], [`JOB_OPEN_PARENTS`],
//! [`JOB_CASCADE`] and the `JOB_LOCK_*` statements the functions run) are not qualified: they run under
//! the functions' pinned `search_path = pg_catalog, pg_temp` (migration 0025), where nothing outside
//! pg_catalog resolves, and `tests/plans.rs` compares them word for word with those bodies.

/// Makes the rest of the transaction use generic plans (`SET LOCAL`: it ends with the transaction, so a
/// pooled connection goes back unchanged). For heartbeat and release; see the module docs.
pub const PLAN_GENERIC: &str = "SET LOCAL plan_cache_mode = force_generic_plan";

/// Claims up to `$3` ready jobs of queue `$1` for owner `$2` with a lease of `$4` ms. Highest priority
/// first, then oldest `run_at`; rows other workers hold are skipped, not waited for; a paused queue
/// yields nothing.
///
/// The picked ids are handed to the UPDATE as an array (`id = ANY (ARRAY(...))`), not joined: a join's
/// plan depends on how many rows the planner expects from `LIMIT $3`, and the generic plan, which cannot
/// see `$3`, expects a tenth of the queue and hash-joins it against a sequential scan of the table
/// (200 ms instead of 2 ms at 100k jobs). An array of ids is always an index lookup.
pub const JOB_CLAIM_BATCH: &str = r#"
WITH picked AS (
    SELECT j.id
      FROM sluice.jobs j
     WHERE j.queue = $1
       AND j.state IN ('pending', 'retrying')
       AND j.run_at <= pg_catalog.now()
       AND NOT EXISTS (SELECT 1 FROM sluice.queues q WHERE q.name = $1 AND q.paused)
     ORDER BY j.priority DESC, j.run_at
     LIMIT $3
       FOR UPDATE SKIP LOCKED
)
UPDATE sluice.jobs j
   SET state = 'running',
       attempt = j.attempt + 1,
       lease_owner = $2,
       lease_expires_at = pg_catalog.now() + ($4 OPERATOR(pg_catalog.*) interval '1 millisecond'),
       started_at = pg_catalog.now()
 WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempt, j.max_attempts, j.lease_expires_at,
          j.created_at
"#;

/// [`JOB_CLAIM_BATCH`] for jobs of the kinds `$5` only (a worker that handles some kinds). A statement of
/// its own, so that the claim of a whole queue keeps its plan. The claim index does not hold the kind:
/// the scan walks the queue's ready jobs in claim order and skips other kinds, so a worker taking a
/// rare kind behind a long backlog of others reads through that backlog on each claim.
pub const JOB_CLAIM_BATCH_OF_KINDS: &str = r#"
WITH picked AS (
    SELECT j.id
      FROM sluice.jobs j
     WHERE j.queue = $1
       AND j.state IN ('pending', 'retrying')
       AND j.run_at <= pg_catalog.now()
       AND j.kind = ANY ($5::text[])
       AND NOT EXISTS (SELECT 1 FROM sluice.queues q WHERE q.name = $1 AND q.paused)
     ORDER BY j.priority DESC, j.run_at
     LIMIT $3
       FOR UPDATE SKIP LOCKED
)
UPDATE sluice.jobs j
   SET state = 'running',
       attempt = j.attempt + 1,
       lease_owner = $2,
       lease_expires_at = pg_catalog.now() + ($4 OPERATOR(pg_catalog.*) interval '1 millisecond'),
       started_at = pg_catalog.now()
 WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempt, j.max_attempts, j.lease_expires_at,
          j.created_at
"#;

/// Finishes a batch of running jobs in one call (`sluice.finish_jobs`, migration 0020), an
/// autocommit statement. Per job (`$1`-`$5`): id, attempt (the fence), outcome (`s` succeeded, `r` retry,
/// `p` permanent failure, `c` cancelled by its handler), retry delay in ms and error text; `$6` the owner.
/// Returns the rows that matched the fence with their new state.
///
/// The function runs [`JOB_FINISH_FENCED`] with its generic plan (`SET plan_cache_mode` on the function).
/// Before it, only when some of the jobs have children still waiting on them ([`JOB_OPEN_PARENTS`], one
/// probe each of the small partial index of unresolved edges), it locks the jobs of the batch the owner
/// holds and those waiting children in one statement, in one id order ([`JOB_LOCK_FINISHING`]): the
/// update's trigger releases children parent by parent, and two batches finishing parents of shared
/// children reached them in opposite orders and deadlocked; an enqueue locks the parents it names in id
/// order too, and so meets the finish in the same order whichever of its parents are batch jobs and
/// which are waiting children. The probe itself takes no lock, so a child enqueued between it and the
/// update can still meet the finish in another order: the store retries a deadlock once.
pub const JOB_FINISH: &str = "SELECT id, state FROM sluice.finish_jobs($1, $2, $3, $4, $5, $6)";

/// The fenced update [`JOB_FINISH`] runs (its text is part of `sluice.finish_jobs`). A retry past
/// `max_attempts` or a permanent failure makes the job `dead`; a failing job whose cancellation was
/// requested becomes `cancelled`.
pub const JOB_FINISH_FENCED: &str = r#"
UPDATE sluice.jobs j
   SET state = CASE
           WHEN f.outcome = 's' THEN 'succeeded'
           WHEN f.outcome = 'c' OR j.cancel_requested THEN 'cancelled'
           WHEN f.outcome = 'p' OR j.attempt >= j.max_attempts THEN 'dead'
           ELSE 'retrying'
       END,
       run_at = CASE
           WHEN f.outcome = 'r' AND NOT j.cancel_requested AND j.attempt < j.max_attempts
           THEN now() + f.delay_ms * interval '1 millisecond'
           ELSE j.run_at
       END,
       finished_at = CASE
           WHEN f.outcome = 'r' AND NOT j.cancel_requested AND j.attempt < j.max_attempts THEN NULL
           ELSE now()
       END,
       last_error = CASE WHEN f.outcome = 's' THEN j.last_error ELSE f.error END,
       lease_owner = NULL,
       lease_expires_at = NULL
  FROM unnest($1::uuid[], $2::integer[], $3::text[], $4::bigint[], $5::text[])
       AS f(id, attempt, outcome, delay_ms, error)
 WHERE j.id = f.id
   AND j.lease_owner = $6
   AND j.lease_expires_at IS NOT NULL
   AND j.attempt = f.attempt
RETURNING j.id, j.state
"#;

/// The jobs among `$1` with children still waiting on them: how `sluice.finish_jobs` decides whether a
/// batch needs its locks (its first statement). A lookup of each id in the partial index of unresolved
/// edges, which is small (edges are resolved when their parent finishes).
pub const JOB_OPEN_PARENTS: &str = r#"
SELECT DISTINCT d.parent_id
  FROM sluice.job_dependencies d
 WHERE d.parent_id = ANY ($1) AND NOT d.resolved
"#;

/// Locks, in one id order, the owner's running jobs among `$1` (a finish batch, `$6` the owner: the
/// parameters of `sluice.finish_jobs`), the children waiting (with an unresolved edge) on the jobs
/// `v_parents` (the function's variable: the result of [`JOB_OPEN_PARENTS`]), and returns the jobs among
/// `v_parents` it locked: migration 0020's statement, run when no job of the batch with waiting
/// children ends failed (a batch of successes, or of retries that are not the last attempt). Run only
/// when `v_parents` is not empty. One statement, so that its locks follow one id order, the order an
/// enqueue locks the parents it names in: the batch's jobs and the children never share a row (a job
/// with an unresolved edge is blocked or cancelled, never running). The children
/// of a batch job the owner does not hold are locked too, which the update then does not write.
/// `MATERIALIZED` keeps the filter on `v_parents` out of the locking scan: every row is locked, not just
/// the parents.
///
/// The deeper levels (migration 0024): a failed job's trigger cancels its children and then the
/// children of those, level by level; locked only as the trigger reached them, a grandchild G with a
/// smaller id than its parent C was taken after C, crossing an enqueue naming G and C. A batch some of
/// whose jobs end failed runs [`JOB_LOCK_FINISHING_FAILING`] instead, which locks those cascades too.
///
/// The children are not filtered by `state = 'blocked'` (the only children the finish's trigger writes):
/// that let the planner scan the partial index of blocked jobs, which statistics taken between bursts
/// make look empty, and filter every blocked job against the edges. A child with an unresolved edge that
/// is not blocked (one a failed parent already cancelled) is locked too: not free, a row lock writes the
/// row's header (and WAL) each time another of that child's parents finishes in a batch.
pub const JOB_LOCK_FINISHING: &str = r#"
WITH locked AS MATERIALIZED (
    SELECT j.id
      FROM sluice.jobs j
     WHERE j.id = ANY ($1 || ARRAY(SELECT d.job_id FROM sluice.job_dependencies d
                                    WHERE d.parent_id = ANY (v_parents) AND NOT d.resolved))
       AND (j.id <> ALL ($1) OR (j.lease_owner = $6 AND j.lease_expires_at IS NOT NULL))
     ORDER BY j.id
       FOR NO KEY UPDATE
)
SELECT locked.id FROM locked WHERE locked.id = ANY (v_parents)
"#;

/// [`JOB_LOCK_FINISHING`] for a batch some of whose jobs with waiting children end failed (`v_roots`:
/// outcome `p` or `c`, or `r` on the last attempt or with a cancellation requested): it also locks their
/// deeper cascades ([`JOB_CASCADE`]), in the same statement in id order (migration 0024).
pub const JOB_LOCK_FINISHING_FAILING: &str = r#"
WITH locked AS MATERIALIZED (
    SELECT j.id
      FROM sluice.jobs j
     WHERE j.id = ANY ($1 || ARRAY(SELECT d.job_id FROM sluice.job_dependencies d
                                    WHERE d.parent_id = ANY (v_parents) AND NOT d.resolved)
                          || sluice.job_cascade(v_roots))
       AND (j.id <> ALL ($1) OR (j.lease_owner = $6 AND j.lease_expires_at IS NOT NULL))
     ORDER BY j.id
       FOR NO KEY UPDATE
)
SELECT locked.id FROM locked WHERE locked.id = ANY (v_parents)
"#;

/// The jobs a cascade from the jobs `p_roots` can reach when they end failed (`dead` or `cancelled`):
/// the body of `sluice.job_cascade(uuid[]) → uuid[]` (migration 0024), which the lock statements of the
/// paths ending jobs with dependents call ([`JOB_CANCEL`], [`JOB_LOCK_FINISHING_FAILING`],
/// [`JOB_LOCK_RESCUING`], [`JOB_LOCK_RELEASING`]). Their waiting children, and, below each child a
/// failed parent cancels (blocked, not `on_parent_failure = run`, with dependents), its waiting
/// children, to the bottom: what
/// `sluice.release_dependents` locks level by level, so that those locks are taken already, in the
/// same statement and id order as the ending jobs. Edges from the partial index of unresolved edges,
/// children by primary key.
pub const JOB_CASCADE: &str = r#"
WITH RECURSIVE reached(id, deeper) AS (
    SELECT c.id, c.state = 'blocked' AND c.has_dependents AND c.on_parent_failure IS DISTINCT FROM 'run'
      FROM sluice.job_dependencies d
      JOIN sluice.jobs c ON c.id = d.job_id
     WHERE d.parent_id = ANY (p_roots) AND NOT d.resolved
    UNION
    SELECT c.id, c.state = 'blocked' AND c.has_dependents AND c.on_parent_failure IS DISTINCT FROM 'run'
      FROM reached r
      JOIN sluice.job_dependencies d ON d.parent_id = r.id AND NOT d.resolved
      JOIN sluice.jobs c ON c.id = d.job_id
     WHERE r.deeper
)
SELECT coalesce(array_agg(DISTINCT reached.id), '{}') FROM reached
"#;

/// Locks the children waiting on the jobs `v_parents` (with an unresolved edge), in one statement in id
/// order: the first statement of each level of `sluice.release_dependents` (migration 0021), the trigger
/// that releases or cancels the children of a job that finished (finish, cancel, lease rescue, shutdown
/// release). Its update then writes them in whatever order its plan reads them (with statistics, a hash
/// join reading the table in its physical order), which used to be the order it locked them in: a cancel
/// cascade met an enqueue naming two of the children, or a batch finishing another of their parents, in
/// the other order, and PostgreSQL aborted one of them as a deadlock. Every path ending a job with
/// dependents now holds these locks already, taken with the ending job in one id order
/// ([`JOB_CASCADE`], migration 0024): this statement waits only for a job that joined the cascade since.
pub const JOB_LOCK_CHILDREN: &str = r#"
SELECT c.id
  FROM sluice.jobs c
 WHERE c.id = ANY (ARRAY(SELECT d.job_id FROM sluice.job_dependencies d
                          WHERE d.parent_id = ANY (v_parents) AND NOT d.resolved))
 ORDER BY c.id
   FOR NO KEY UPDATE
"#;

/// Locks the parents an enqueue names (`v_parents`), the current holder of its unique key (`p_queue`,
/// `p_unique_key`) and the current holder of its idempotency key (`p_idempotency_key`), each when there
/// is one, in one statement in id order: `sluice.enqueue_job`'s first lock when the job has parents or
/// both keys (migrations 0021, 0022). The unique key's holder used to be locked after the parents, so a
/// job naming A as parent and replacing holder H < A crossed an enqueue naming H and A; so did an
/// expired idempotency key cleared on its holder H after the parents were locked.
pub const JOB_LOCK_PARENTS: &str = r#"
SELECT j.id
  FROM sluice.jobs j
 WHERE j.id = ANY (v_parents
                   || ARRAY(SELECT h.id FROM sluice.jobs h
                             WHERE h.queue = p_queue AND h.unique_key = p_unique_key)
                   || ARRAY(SELECT h.id FROM sluice.jobs h
                             WHERE h.queue = p_queue AND h.idempotency_key = p_idempotency_key))
 ORDER BY j.id
   FOR NO KEY UPDATE
"#;

/// Locks the jobs outside a graph that it names as parents (`v_outside`), the current holders of its
/// unique keys (`v_queue`, `v_keys`) and those of its idempotency keys (`v_ikeys`), in one statement in
/// id order: `sluice.enqueue_graph`'s first lock, before its first job (migrations 0021, 0022). Each
/// job's own locks are then locks the call holds already. They used to be taken job by job: a graph
/// naming B for one job and A < B for a later one crossed an enqueue naming A and B, and so did a graph
/// sent again whose idempotency keys found A and B, with a job depending on B's ref before one depending
/// on A's.
pub const JOB_LOCK_GRAPH_PARENTS: &str = r#"
SELECT o.id
  FROM sluice.jobs o
 WHERE o.id = ANY (v_outside
                   || ARRAY(SELECT h.id FROM sluice.jobs h
                             WHERE h.queue = v_queue AND h.unique_key = ANY (v_keys))
                   || ARRAY(SELECT h.id FROM sluice.jobs h
                             WHERE h.queue = v_queue AND h.idempotency_key = ANY (v_ikeys)))
 ORDER BY o.id
   FOR NO KEY UPDATE
"#;

/// Locks the current holders of a batch's unique keys (`$9`) and idempotency keys (`$8`) in queue `$1`,
/// in one statement in id order: `sluice.enqueue_many`'s first lock when its jobs carry keys, before its
/// first job (migration 0023). The batch enqueues its keyed jobs in key order, and each used to lock its
/// key's holder as it came, in the order of the keys: holders H1 of key `a` and H2 < H1 of key `b` were
/// locked H1, then H2, crossing an enqueue naming H2 and H1.
pub const JOB_LOCK_BATCH_HOLDERS: &str = r#"
SELECT h.id
  FROM sluice.jobs h
 WHERE h.id = ANY (ARRAY(SELECT k.id FROM sluice.jobs k
                          WHERE k.queue = $1 AND k.unique_key = ANY ($9))
                   || ARRAY(SELECT k.id FROM sluice.jobs k
                             WHERE k.queue = $1 AND k.idempotency_key = ANY ($8)))
 ORDER BY h.id
   FOR NO KEY UPDATE
"#;

/// Extends the leases of the owner's (`$3`) running jobs (`$1` ids, `$2` attempts) by `$4` ms from now,
/// skipping any row another transaction holds. Returns every job the owner still holds at that attempt,
/// with its cancellation flag and whether its lease was renewed now; a job missing from the result was
/// lost. Skipping, not waiting: a running job's row can be held for as long as an application likes
/// (a transaction enqueueing a child under it locks it until it commits, as does a completion write of
/// a job that finished meanwhile waiting for a child), and a heartbeat waiting for one row would leave
/// every other lease of its statement unrenewed until then: other workers would rescue those jobs and
/// run them a second time. A job skipped is still the owner's (its committed row says so: it is
/// reported held, not lost) and is renewed by the next heartbeat that finds its row free. Locks in id
/// order, waits for nobody. Only `lease_expires_at` changes, which no index covers: a HOT update.
pub const JOB_HEARTBEAT: &str = r#"
WITH renewed AS (
UPDATE sluice.jobs j
   SET lease_expires_at = pg_catalog.now() + ($4 OPERATOR(pg_catalog.*) interval '1 millisecond')
 WHERE j.id = ANY (ARRAY(
           SELECT l.id
             FROM sluice.jobs l
             JOIN ROWS FROM (pg_catalog.unnest($1::uuid[]), pg_catalog.unnest($2::integer[]))
                  AS h(id, attempt) ON l.id = h.id
            WHERE l.lease_owner = $3
              AND l.lease_expires_at IS NOT NULL
              AND l.attempt = h.attempt
            ORDER BY l.id
              FOR NO KEY UPDATE OF l SKIP LOCKED))
RETURNING j.id, j.cancel_requested
)
SELECT renewed.id, renewed.cancel_requested, true AS renewed
  FROM renewed
UNION ALL
SELECT s.id, s.cancel_requested, false
  FROM sluice.jobs s
  JOIN ROWS FROM (pg_catalog.unnest($1::uuid[]), pg_catalog.unnest($2::integer[]))
       AS h(id, attempt) ON s.id = h.id
 WHERE s.lease_owner = $3
   AND s.lease_expires_at IS NOT NULL
   AND s.attempt = h.attempt
   AND s.id <> ALL (ARRAY(SELECT renewed.id FROM renewed))
"#;

/// [`JOB_HEARTBEAT`] for one running job (`$1`, attempt `$2`) whose row it skipped: waits for the row (as
/// long as the transaction's `lock_timeout` allows), then extends the lease if the owner (`$3`) still holds
/// the job. Returns the job with its cancellation flag; no row when it is no longer the owner's (a rescue
/// that held the row took it). A row is mostly held for a moment (an enqueue naming the job as a parent
/// or finding it the holder of its key locks it until it commits), and a job skipped at every heartbeat
/// would never be renewed: a stream of such enqueues would let its lease lapse.
pub const JOB_HEARTBEAT_WAITING: &str = r#"
UPDATE sluice.jobs j
   SET lease_expires_at = pg_catalog.now() + ($4 OPERATOR(pg_catalog.*) interval '1 millisecond')
 WHERE j.id = $1
   AND j.lease_owner = $3
   AND j.lease_expires_at IS NOT NULL
   AND j.attempt = $2
RETURNING j.id, j.cancel_requested
"#;

/// [`JOB_HEARTBEAT`] for jobs whose handler returned and whose outcome the owner has not written yet
/// (they are still running in the database): extends the leases of those of them the owner (`$3`)
/// still holds at attempt `$2` by `$4` ms, skipping any row another transaction holds, and returns the
/// jobs renewed. Skipping, not waiting: such a row is almost always held by the owner's own completion
/// write, which is writing the job's outcome (and which may itself wait for a child's lock for long);
/// a heartbeat waiting for it would hold up the leases of the owner's running jobs. A job skipped is
/// renewed on the next heartbeat if it still needs it. Locks in id order, waits for nobody.
pub const JOB_HEARTBEAT_FINISHING: &str = r#"
UPDATE sluice.jobs j
   SET lease_expires_at = pg_catalog.now() + ($4 OPERATOR(pg_catalog.*) interval '1 millisecond')
 WHERE j.id = ANY (ARRAY(
           SELECT l.id
             FROM sluice.jobs l
             JOIN ROWS FROM (pg_catalog.unnest($1::uuid[]), pg_catalog.unnest($2::integer[]))
                  AS h(id, attempt) ON l.id = h.id
            WHERE l.lease_owner = $3
              AND l.lease_expires_at IS NOT NULL
              AND l.attempt = h.attempt
            ORDER BY l.id
              FOR NO KEY UPDATE OF l SKIP LOCKED))
RETURNING j.id
"#;

/// Locks, in one statement in id order, the owner's (`$2`) running jobs among `$1` and the cascades
/// ([`JOB_CASCADE`]) of those whose cancellation was requested: the release's first statement, in its
/// transaction, before [`JOB_RELEASE_FENCED`] (migration 0024). The release cancels such a job, and its
/// trigger used to lock the job's waiting children only after the update had locked the job; a child
/// can have a smaller id than its parent, and an enqueue naming child C and parent P locked C, then
/// waited for P, which the release held while it waited for C. Without a requested cancellation with
/// dependents the cascade is empty and only the jobs are locked (once more than before: a shutdown's
/// cost, not a hot path's).
pub const JOB_LOCK_RELEASING: &str = r#"
SELECT j.id
  FROM sluice.jobs j
 WHERE j.id = ANY ($1 OPERATOR(pg_catalog.||) sluice.job_cascade(ARRAY(
           SELECT r.id
             FROM sluice.jobs r
            WHERE r.id = ANY ($1) AND r.lease_owner = $2 AND r.lease_expires_at IS NOT NULL
              AND r.cancel_requested AND r.has_dependents)))
   AND (j.id <> ALL ($1) OR (j.lease_owner = $2 AND j.lease_expires_at IS NOT NULL))
 ORDER BY j.id
   FOR NO KEY UPDATE
"#;

/// Hands running jobs back at once (shutdown): the attempt is not counted and the job is ready again.
/// A job whose cancellation was requested is cancelled instead, with its dependents (locked first,
/// [`JOB_LOCK_RELEASING`]).
pub const JOB_RELEASE_FENCED: &str = r#"
UPDATE sluice.jobs j
   SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                    WHEN j.attempt = 1 THEN 'pending' ELSE 'retrying' END,
       attempt = CASE WHEN j.cancel_requested THEN j.attempt ELSE j.attempt - 1 END,
       finished_at = CASE WHEN j.cancel_requested THEN pg_catalog.now() END,
       run_at = pg_catalog.now(),
       lease_owner = NULL,
       lease_expires_at = NULL
  FROM ROWS FROM (pg_catalog.unnest($1::uuid[]), pg_catalog.unnest($2::integer[])) AS r(id, attempt)
 WHERE j.id = r.id
   AND j.lease_owner = $3
   AND j.lease_expires_at IS NOT NULL
   AND j.attempt = r.attempt
RETURNING j.id
"#;

/// Hands back the running jobs of queues `$2` leased to owner `$1` that the owner does not hold (not at
/// an (id, attempt) of `$3`, `$4`): jobs a claim the owner gave up unanswered leased to it when it
/// committed after all (`sluice.return_unknown_claims`, migration 0029). The attempt is taken back, the
/// job is `pending` or `retrying` again and its queue's workers are woken; a job whose lease lapsed, or
/// whose cancellation was requested, is left to the rescue. Locks in id order, skipping held rows:
/// waits for nobody. Returns the jobs handed back (id, attempt, queue).
pub const JOB_RETURN_UNKNOWN: &str =
    "SELECT id, attempt, queue FROM sluice.return_unknown_claims($1, $2, $3, $4)";

/// Rescues up to `$2` jobs of queues `$1` whose lease expired (worker crashed, node lost): they become
/// ready again at once, or `dead` when that was their last attempt, or `cancelled` when asked to
/// (`sluice.rescue_expired`, migration 0024). Jobs whose rescue does not end them with dependents (almost
/// all) are taken with `FOR UPDATE SKIP LOCKED`, as the statement this function replaced did; the
/// others are locked first with their cascades, skipping held rows ([`JOB_LOCK_RESCUING`]), rescued
/// first, and only when the job and its whole cascade were locked: the rescue never waits.
pub const JOB_RESCUE_EXPIRED: &str = "SELECT id FROM sluice.rescue_expired($1, $2)";

/// Locks the expired jobs `v_ending` that a rescue ends (`dead` or `cancelled`) while they have
/// dependents, with their cascades ([`JOB_CASCADE`]), in one statement in id order: the first lock of
/// `sluice.rescue_expired` when there are any (migration 0024). The rescue used to take such a job with
/// `SKIP LOCKED` and its trigger then waited for the job's children: with child C < P, it held P and
/// waited for C while an enqueue naming C and P held C and waited for P. Now the whole cascade is taken
/// with the job before any is written, and rows another transaction holds are skipped: the rescue never
/// waits (an application transaction enqueueing a child under the job can hold it for as long as it
/// likes), and rescues a job only when it locked the job and its whole cascade; the others are left
/// for the next rescue.
pub const JOB_LOCK_RESCUING: &str = r#"
SELECT j.id
  FROM sluice.jobs j
 WHERE j.id = ANY (v_ending || sluice.job_cascade(v_ending))
 ORDER BY j.id
   FOR NO KEY UPDATE SKIP LOCKED
"#;

/// Enqueues one job through the SQL API (`sluice.enqueue_job`): returns (id, created). `$11` (unique for)
/// and `$12` (debounce) are milliseconds; `$13` the parents, `$14` what their failure does. A job with
/// parents (or both keys) locks them and its keys' holders first, in id order ([`JOB_LOCK_PARENTS`]).
pub const JOB_ENQUEUE: &str = r#"
SELECT id, created
  FROM sluice.enqueue_job($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
                          $11 OPERATOR(pg_catalog.*) interval '1 millisecond',
                          $12 OPERATOR(pg_catalog.*) interval '1 millisecond', $13, $14)
"#;

/// Enqueues a graph of jobs through the SQL API (`sluice.enqueue_graph`, `$2` a JSON array of jobs with
/// refs): returns (ref, id, created) in input order. The jobs outside the graph it names as parents and
/// its unique and idempotency keys' holders are locked first, in id order ([`JOB_LOCK_GRAPH_PARENTS`]).
pub const JOB_ENQUEUE_GRAPH: &str = "SELECT ref, id, created FROM sluice.enqueue_graph($1, $2)";

/// The jobs job `$1` depends on, with their states (NULL: deleted by retention), in id order.
pub const JOB_PARENTS: &str = r#"
SELECT d.parent_id AS id, p.state
  FROM sluice.job_dependencies d
  LEFT JOIN sluice.jobs p ON p.id = d.parent_id
 WHERE d.job_id = $1
 ORDER BY d.parent_id
"#;

/// Enqueues many jobs in one statement through the SQL API (`sluice.enqueue_many`): returns the ids.
/// `$8`-`$10` the idempotency keys, unique keys and unique modes, `$11` (unique for) and `$12` (debounce)
/// in milliseconds; all NULL for a batch without keys.
/// A batch with keys locks its keys' holders first, in id order ([`JOB_LOCK_BATCH_HOLDERS`]).
pub const JOB_ENQUEUE_MANY: &str = r#"
SELECT id
  FROM sluice.enqueue_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
         (SELECT pg_catalog.array_agg(u.ms OPERATOR(pg_catalog.*) interval '1 millisecond' ORDER BY u.n)
            FROM pg_catalog.unnest($11::bigint[]) WITH ORDINALITY AS u(ms, n)),
         (SELECT pg_catalog.array_agg(u.ms OPERATOR(pg_catalog.*) interval '1 millisecond' ORDER BY u.n)
            FROM pg_catalog.unnest($12::bigint[]) WITH ORDINALITY AS u(ms, n))) AS id
"#;

/// The queues of the jobs `$1` (ids that are no job are left out).
pub const JOB_QUEUES: &str = "SELECT id, queue FROM sluice.jobs WHERE id = ANY ($1)";

/// One job by id.
pub const JOB_GET: &str = "SELECT * FROM sluice.jobs WHERE id = $1";

/// Jobs of a queue (optionally in one state), in id order (UUIDv7: creation order), after cursor `$3`.
pub const JOB_LIST: &str = r#"
SELECT * FROM sluice.jobs
 WHERE queue = $1
   AND ($2::text IS NULL OR state = $2)
   AND ($3::uuid IS NULL OR id > $3)
 ORDER BY id
 LIMIT $4
"#;

/// Cancels a job: waiting (and blocked) jobs at once, running jobs by request (the worker delivers it).
/// Returns the state before and after; no row when the job does not exist. Cancelling a job with
/// dependents cancels them too (the `jobs_release_dependents` trigger).
///
/// A waiting job is locked together with the jobs its cancel cascades to (its waiting children, theirs
/// when those are cancelled, and so on: [`JOB_CASCADE`]), in one statement in id order (`locked`),
/// before it is written: a child can have a smaller id than its parent (an explicit id, or a graph
/// listing the child first), and locking the parent first, then the child in the trigger, crossed an
/// enqueue or a finishing batch locking that child and then the parent; the cascade's deeper levels
/// were locked level by level as the trigger reached them until migration 0024, crossing an enqueue
/// naming a grandchild with a smaller id and its parent. A running job's children are not locked: its
/// cancel only sets the request. The job's state in `locked` is read under its lock.
pub const JOB_CANCEL: &str = r#"
WITH locked AS MATERIALIZED (
    SELECT j.id, j.state
      FROM sluice.jobs j
     WHERE j.id = ANY (ARRAY[$1::uuid]
                       OPERATOR(pg_catalog.||) CASE WHEN EXISTS (SELECT 1 FROM sluice.jobs w
                                             WHERE w.id = $1 AND w.state IN ('blocked', 'pending', 'retrying'))
                               THEN sluice.job_cascade(ARRAY[$1::uuid]) END)
     ORDER BY j.id
       FOR UPDATE
), before AS (
    SELECT l.id, l.state FROM locked l WHERE l.id = $1
), changed AS (
    UPDATE sluice.jobs j
       SET state = CASE WHEN b.state IN ('blocked', 'pending', 'retrying') THEN 'cancelled' ELSE j.state END,
           finished_at = CASE WHEN b.state IN ('blocked', 'pending', 'retrying') THEN pg_catalog.now()
                              ELSE j.finished_at END,
           blocked_by = 0,
           cancel_requested = CASE WHEN b.state = 'running' THEN true ELSE j.cancel_requested END
      FROM before b
     WHERE j.id = b.id AND b.state IN ('blocked', 'pending', 'retrying', 'running')
    RETURNING j.id, j.state
)
SELECT b.state AS before, coalesce(c.state, b.state) AS after
  FROM before b LEFT JOIN changed c ON c.id = b.id
"#;

/// Retries a dead job: it gets one more attempt and is ready at once. Returns the new state; no row when
/// the job does not exist or is not dead.
pub const JOB_RETRY_DEAD: &str = r#"
UPDATE sluice.jobs
   SET state = 'retrying',
       max_attempts = greatest(max_attempts, attempt + 1),
       run_at = pg_catalog.now(),
       finished_at = NULL,
       cancel_requested = false
 WHERE id = $1 AND state = 'dead'
RETURNING state
"#;

/// Deletes up to `$3` finished jobs of queue `$1` older than their retention (`$2`: the queue row's
/// settings are read in the statement). Pending, retrying and running jobs are never touched.
pub const JOB_DELETE_EXPIRED: &str = r#"
WITH q AS (
    SELECT retention_succeeded_ms, retention_dead_ms FROM sluice.queues WHERE name = $1
), doomed AS (
    SELECT j.id
      FROM sluice.jobs j, q
     WHERE j.queue = $1
       AND j.state IN ('succeeded', 'cancelled', 'dead')
       AND j.finished_at < pg_catalog.now() - (CASE WHEN j.state = 'dead' THEN q.retention_dead_ms
                                                    ELSE q.retention_succeeded_ms END
                                               OPERATOR(pg_catalog.*) interval '1 millisecond')
     ORDER BY j.finished_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
DELETE FROM sluice.jobs j
 USING doomed
 WHERE j.id = doomed.id
   AND j.state IN ('succeeded', 'cancelled', 'dead')
"#;

/// Running jobs of queue `$1` per lease owner: which worker process holds how many leases.
pub const JOB_COUNT_RUNNING_BY_OWNER: &str = r#"
SELECT lease_owner, pg_catalog.count(*) AS running
  FROM sluice.jobs
 WHERE queue = $1 AND state = 'running'
 GROUP BY lease_owner
"#;

/// Depth of queues (`$1` one queue, or NULL for all), from the partial indexes: ready = waiting and due
/// now; blocked = waiting for parents; scheduled = pending, due later; retrying = waiting out a backoff;
/// running; dead; age in ms of the oldest ready job. Autoscaling reads ready + running.
pub const QUEUE_DEPTH: &str = r#"
SELECT q.name AS queue,
       w.ready, w.scheduled, w.retrying,
       (SELECT pg_catalog.count(*) FROM sluice.jobs b WHERE b.queue = q.name AND b.state = 'blocked') AS blocked,
       (SELECT pg_catalog.count(*) FROM sluice.jobs r WHERE r.queue = q.name AND r.state = 'running') AS running,
       (SELECT pg_catalog.count(*) FROM sluice.jobs d WHERE d.queue = q.name AND d.state = 'dead') AS dead,
       coalesce((extract(epoch FROM pg_catalog.now() - w.oldest_ready) OPERATOR(pg_catalog.*) 1000)::bigint, 0) AS oldest_ready_age_ms,
       q.paused
  FROM sluice.queues q
 CROSS JOIN LATERAL (
    SELECT pg_catalog.count(*) FILTER (WHERE j.run_at <= pg_catalog.now()) AS ready,
           pg_catalog.count(*) FILTER (WHERE j.run_at > pg_catalog.now() AND j.state = 'pending') AS scheduled,
           pg_catalog.count(*) FILTER (WHERE j.run_at > pg_catalog.now() AND j.state = 'retrying') AS retrying,
           pg_catalog.min(j.run_at) FILTER (WHERE j.run_at <= pg_catalog.now()) AS oldest_ready
      FROM sluice.jobs j
     WHERE j.queue = q.name AND j.state IN ('pending', 'retrying')
 ) w
 WHERE $1::text IS NULL OR q.name = $1
 ORDER BY q.name
"#;

/// Creates a queue with default settings unless it exists.
pub const QUEUE_ENSURE: &str = "INSERT INTO sluice.queues (name) VALUES ($1) ON CONFLICT DO NOTHING";

/// Creates or updates a queue's settings (not its paused flag). Returns whether it was created.
pub const QUEUE_UPSERT: &str = r#"
INSERT INTO sluice.queues AS q (name, max_attempts, backoff_base_ms, backoff_cap_ms, backoff_multiplier,
                                lease_ms, retention_succeeded_ms, retention_dead_ms, idempotency_window_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (name) DO UPDATE
   SET max_attempts = EXCLUDED.max_attempts,
       backoff_base_ms = EXCLUDED.backoff_base_ms,
       backoff_cap_ms = EXCLUDED.backoff_cap_ms,
       backoff_multiplier = EXCLUDED.backoff_multiplier,
       lease_ms = EXCLUDED.lease_ms,
       retention_succeeded_ms = EXCLUDED.retention_succeeded_ms,
       retention_dead_ms = EXCLUDED.retention_dead_ms,
       idempotency_window_ms = EXCLUDED.idempotency_window_ms,
       updated_at = pg_catalog.now()
RETURNING (xmax = 0) AS created
"#;

/// One queue's settings.
pub const QUEUE_GET: &str = "SELECT * FROM sluice.queues WHERE name = $1";

/// Pauses or resumes a queue. No row when it does not exist.
pub const QUEUE_SET_PAUSED: &str =
    "UPDATE sluice.queues SET paused = $2, updated_at = pg_catalog.now() WHERE name = $1 RETURNING name";

/// Ready + running jobs of `queue` (what autoscaling reads, [`crate::Depth::demand`]) as one
/// self-contained statement, for KEDA's `postgresql` trigger, which runs a query without parameters. Queue
/// names are `[A-Za-z0-9._-]` (a CHECK in the schema and the CRD's pattern), so the literal needs no
/// escaping; quotes are doubled anyway.
pub fn queue_demand_statement(queue: &str) -> String {
    let q = queue.replace('\'', "''");
    format!(
        "SELECT pg_catalog.count(*) FROM sluice.jobs WHERE queue = '{q}' AND (state = 'running' OR (state IN ('pending', 'retrying') AND run_at <= pg_catalog.now()))"
    )
}

/// Renames queue `$1` to `$2` with its jobs and schedules (`sluice.adopt_queue`): jobs moved, NULL when
/// there is no queue `$1`.
pub const QUEUE_ADOPT: &str = "SELECT sluice.adopt_queue($1, $2)";

/// Creates or updates tenant role `$1` of namespace `$2` with password `$3` (`sluice.ensure_tenant`).
pub const TENANT_ENSURE: &str = "SELECT sluice.ensure_tenant($1, $2, $3)";

/// The tenant role registered for namespace `$1` (NULL when it has none) and the database's key for
/// naming new tenant roles (`sluice.tenant_naming`, migration 0017; NULL when its row was deleted). For
/// the schema's owner: the key is not readable by other logins (`42501`).
pub const TENANT_ROLE_AND_NAMING_KEY: &str = "SELECT (SELECT role_name FROM sluice.tenants WHERE namespace = $1), \
                                                   (SELECT key::text FROM sluice.tenant_naming)";

/// The tenant role and namespace of the login running it (its own row of `sluice.tenants`, the only
/// one a tenant can see; no row for a login that is no tenant), and whether row-level security fails to
/// limit it: a superuser, a `BYPASSRLS` role, or a member of the owner of a table of the schema. The
/// operator's check of a connection it is given for a namespace. `relnamespace` (an oid) against a
/// `regnamespace` has no exact pg_catalog operator, hence `OPERATOR(pg_catalog.=)`.
pub const TENANT_OF_LOGIN: &str = r#"
SELECT t.role_name, t.namespace,
       r.rolsuper OR r.rolbypassrls OR EXISTS (
           SELECT 1 FROM pg_catalog.pg_class c
            WHERE c.relnamespace OPERATOR(pg_catalog.=) 'sluice'::pg_catalog.regnamespace
              AND pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER'))
  FROM sluice.tenants t JOIN pg_catalog.pg_roles r ON r.rolname = t.role_name
 WHERE t.role_name = current_user
"#;

/// Creates the row of schedule (`$1` queue, `$2` name) unless it exists: a new schedule has handled every
/// fire time up to its creation.
pub const SCHEDULE_ENSURE: &str = r#"
INSERT INTO sluice.schedules (queue, name, handled_until) VALUES ($1, $2, pg_catalog.now())
ON CONFLICT (queue, name) DO NOTHING
"#;

/// Locks a schedule's row for one scheduler pass and reads its watermark and the database's now (the
/// clock every worker shares). No row when another worker holds it (it is firing the schedule now).
pub const SCHEDULE_LOCK: &str = r#"
SELECT handled_until, pg_catalog.now() AS now
  FROM sluice.schedules
 WHERE queue = $1 AND name = $2
   FOR UPDATE SKIP LOCKED
"#;

/// Moves a schedule's watermark forward to `$3` after a pass (never back: a pass whose transaction began
/// before another worker's pass committed reads an older `now()`), with the latest fire time enqueued (`$4`, `$5` its
/// job; NULL keeps the earlier ones) and the next fire time `$6`.
pub const SCHEDULE_ADVANCE: &str = r#"
UPDATE sluice.schedules
   SET handled_until = greatest(handled_until, $3),
       last_fire_at = coalesce($4, last_fire_at),
       last_job_id = coalesce($5, last_job_id),
       next_fire_at = $6,
       updated_at = pg_catalog.now()
 WHERE queue = $1 AND name = $2
"#;

/// The schedules of queue `$1`, by name.
pub const SCHEDULE_LIST: &str = r#"
SELECT queue, name, handled_until, last_fire_at, last_job_id, next_fire_at
  FROM sluice.schedules
 WHERE queue = $1
 ORDER BY name
"#;

/// Renews the event subscriptions of subscriber `$2` (one sidecar process) to queues `$1` until `$3` ms
/// from now: while a queue has a live row, its jobs' state changes are notified (migration 0011).
pub const EVENT_SUBSCRIBE: &str = r#"
INSERT INTO sluice.event_subscriptions (queue, subscriber, expires_at)
SELECT q, $2, pg_catalog.now() + ($3 OPERATOR(pg_catalog.*) interval '1 millisecond') FROM pg_catalog.unnest($1::text[]) AS q
ON CONFLICT (queue, subscriber) DO UPDATE SET expires_at = EXCLUDED.expires_at
"#;

/// Drops subscriber `$2`'s rows for queues other than `$1`, and every row expired a minute ago or more
/// (left by a process that stopped without dropping them).
pub const EVENT_UNSUBSCRIBE_OTHERS: &str = r#"
DELETE FROM sluice.event_subscriptions
 WHERE (subscriber = $2 AND NOT (queue = ANY ($1::text[])))
    OR expires_at < pg_catalog.now() - interval '1 minute'
"#;

/// A job's queue, state and attempt, with the snapshot of the read (`pg_current_snapshot()`, which in
/// an autocommit statement is the statement's own).
pub const JOB_STATUS: &str = r#"
SELECT queue, state, attempt, pg_catalog.pg_current_snapshot()::text AS snapshot FROM sluice.jobs WHERE id = $1
"#;

// Revoking tenants (migration 0028). Built-ins are schema-qualified: these run as the schema's owner.

/// Every registered tenant (role, namespace), whether QueueDatabase `$1` admitted its namespace (a row
/// of `sluice.tenant_admissions`), whether it revoked it completely since and the role still cannot log
/// in (given `LOGIN` again, through another QueueDatabase or by hand, it is decided anew: released to a
/// QueueDatabase that admits it, or revoked again), and whether the role, unable
/// to log in, still has sessions (one that passed the login check as LOGIN was taken, and was not listed
/// yet when the sessions were ended), by namespace.
pub const TENANT_REGISTRY: &str = r#"
SELECT t.role_name, t.namespace,
       a.namespace IS NOT NULL AS admitted_by,
       coalesce(a.revocation_complete, false)
         AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                          WHERE r.rolname OPERATOR(pg_catalog.=) t.role_name AND r.rolcanlogin) AS revoked,
       EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                 JOIN pg_catalog.pg_stat_activity s ON s.usesysid OPERATOR(pg_catalog.=) r.oid
                WHERE r.rolname OPERATOR(pg_catalog.=) t.role_name AND NOT r.rolcanlogin) AS sessions_left
  FROM sluice.tenants t
  LEFT JOIN sluice.tenant_admissions a
         ON a.namespace OPERATOR(pg_catalog.=) t.namespace
        AND a.queue_database OPERATOR(pg_catalog.=) $1
 ORDER BY t.namespace
"#;

/// Records that QueueDatabase `$2` admits each namespace of `$1`, as its own pass finds: a revocation's
/// mark is cleared. Only that QueueDatabase's own pass runs it (passes of one QueueDatabase run one at a
/// time, each reading the labels anew).
pub const TENANT_ADMISSIONS_RECORD: &str = r#"
INSERT INTO sluice.tenant_admissions (namespace, queue_database)
SELECT n, $2 FROM pg_catalog.unnest($1::text[]) AS n
ON CONFLICT (namespace, queue_database) DO UPDATE
   SET revoked_at = NULL, revocation_complete = false
 WHERE sluice.tenant_admissions.revoked_at IS NOT NULL
"#;

/// Records that QueueDatabase `$2` admitted namespace `$1`, in the provisioning transaction after
/// [`TENANT_ADMISSION_REVOKED`] found no mark, or when another QueueDatabase's pass passes the
/// namespace on to it: an existing row, and its mark, is left as it is.
pub const TENANT_ADMISSION_PROVISIONED: &str = r#"
INSERT INTO sluice.tenant_admissions (namespace, queue_database) VALUES ($1, $2)
ON CONFLICT (namespace, queue_database) DO NOTHING
"#;

/// Whether QueueDatabase `$2` revoked namespace `$1`, still registered, and has not found it admitted
/// since: provisioning through it refuses the namespace (read under the namespace's provisioning lock).
/// A mark outlives nothing an admin removed: once the namespace's row of `sluice.tenants` is deleted (a
/// namespace deleted for good, its role dropped), the namespace is a new tenant.
pub const TENANT_ADMISSION_REVOKED: &str = r#"
SELECT EXISTS (SELECT 1 FROM sluice.tenant_admissions a
                WHERE a.namespace OPERATOR(pg_catalog.=) $1 AND a.queue_database OPERATOR(pg_catalog.=) $2
                  AND a.revoked_at IS NOT NULL
                  AND EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.namespace OPERATOR(pg_catalog.=) $1))
"#;

/// Marks QueueDatabase `$2`'s admission of namespace `$1` revoked (in the transaction taking LOGIN,
/// under the namespace's provisioning lock); its revocation is not complete yet.
pub const TENANT_ADMISSION_MARK_REVOKED: &str = r#"
UPDATE sluice.tenant_admissions
   SET revoked_at = coalesce(revoked_at, pg_catalog.now()), revocation_complete = false
 WHERE namespace OPERATOR(pg_catalog.=) $1 AND queue_database OPERATOR(pg_catalog.=) $2
"#;

/// Records that the revocation of QueueDatabase `$2`'s admission of namespace `$1` is complete (its
/// sessions ended and Secrets deleted after the LOGIN), unless a pass cleared the mark since.
pub const TENANT_ADMISSION_REVOCATION_COMPLETE: &str = r#"
UPDATE sluice.tenant_admissions SET revocation_complete = true
 WHERE namespace OPERATOR(pg_catalog.=) $1 AND queue_database OPERATOR(pg_catalog.=) $2
   AND revoked_at IS NOT NULL
"#;

/// Forgets that QueueDatabase `$2` admitted namespace `$1` (its Secret released: another
/// QueueDatabase on the database admits the namespace, whose role keeps its login).
pub const TENANT_ADMISSION_FORGET: &str = r#"
DELETE FROM sluice.tenant_admissions
 WHERE namespace OPERATOR(pg_catalog.=) $1 AND queue_database OPERATOR(pg_catalog.=) $2
"#;

/// Registers QueueDatabase uid `$1`, named `$2`, the first time a provisioning goes through it.
pub const QUEUE_DATABASE_REGISTER: &str = r#"
INSERT INTO sluice.queue_databases (uid, name) VALUES ($1, $2)
ON CONFLICT (uid) DO NOTHING
"#;

/// Whether QueueDatabase uid `$1` is retired, holding its row until the transaction ends: provisioning
/// through it reads this before it gives LOGIN, so a retirement ([`QUEUE_DATABASE_RETIRE`]) waits for
/// the provisionings under way to commit, and those after it see it.
pub const QUEUE_DATABASE_HELD_RETIRED: &str = r#"
SELECT retired_at IS NOT NULL FROM sluice.queue_databases
 WHERE uid OPERATOR(pg_catalog.=) $1
   FOR SHARE
"#;

/// Whether QueueDatabase uid `$1` is retired (no row: it is not).
pub const QUEUE_DATABASE_RETIRED: &str = r#"
SELECT EXISTS (SELECT 1 FROM sluice.queue_databases
                WHERE uid OPERATOR(pg_catalog.=) $1 AND retired_at IS NOT NULL)
"#;

/// Retires QueueDatabase uid `$1`, named `$2` (it is being deleted); waits for the provisionings
/// through it under way.
pub const QUEUE_DATABASE_RETIRE: &str = r#"
INSERT INTO sluice.queue_databases AS q (uid, name, retired_at) VALUES ($1, $2, pg_catalog.now())
ON CONFLICT (uid) DO UPDATE SET retired_at = coalesce(q.retired_at, pg_catalog.now())
"#;

/// Takes LOGIN from role `$1`, namespace `$2`'s registered tenant; whether the role exists.
pub const TENANT_REVOKE_LOGIN: &str = "SELECT sluice.revoke_tenant_login($1, $2)";

/// Terminates the sessions of role `$1`, namespace `$2`'s registered tenant; how many.
pub const TENANT_END_SESSIONS: &str = "SELECT sluice.end_tenant_sessions($1, $2)";

/// Whether role `$1` may log in (NULL when there is no such role).
pub const TENANT_CAN_LOG_IN: &str =
    "SELECT r.rolcanlogin FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) $1";

#[cfg(test)]
mod tests {
    use super::*;

    /// The statements Sluice sends itself (not the bodies of `sluice` functions).
    fn sent() -> Vec<(&'static str, String)> {
        let consts = [
            ("PLAN_GENERIC", PLAN_GENERIC),
            ("JOB_CLAIM_BATCH", JOB_CLAIM_BATCH),
            ("JOB_CLAIM_BATCH_OF_KINDS", JOB_CLAIM_BATCH_OF_KINDS),
            ("JOB_FINISH", JOB_FINISH),
            ("JOB_HEARTBEAT", JOB_HEARTBEAT),
            ("JOB_HEARTBEAT_WAITING", JOB_HEARTBEAT_WAITING),
            ("JOB_HEARTBEAT_FINISHING", JOB_HEARTBEAT_FINISHING),
            ("JOB_LOCK_RELEASING", JOB_LOCK_RELEASING),
            ("JOB_RELEASE_FENCED", JOB_RELEASE_FENCED),
            ("JOB_RETURN_UNKNOWN", JOB_RETURN_UNKNOWN),
            ("JOB_RESCUE_EXPIRED", JOB_RESCUE_EXPIRED),
            ("JOB_ENQUEUE", JOB_ENQUEUE),
            ("JOB_ENQUEUE_GRAPH", JOB_ENQUEUE_GRAPH),
            ("JOB_PARENTS", JOB_PARENTS),
            ("JOB_ENQUEUE_MANY", JOB_ENQUEUE_MANY),
            ("JOB_QUEUES", JOB_QUEUES),
            ("JOB_GET", JOB_GET),
            ("JOB_LIST", JOB_LIST),
            ("JOB_CANCEL", JOB_CANCEL),
            ("JOB_RETRY_DEAD", JOB_RETRY_DEAD),
            ("JOB_DELETE_EXPIRED", JOB_DELETE_EXPIRED),
            ("JOB_COUNT_RUNNING_BY_OWNER", JOB_COUNT_RUNNING_BY_OWNER),
            ("QUEUE_DEPTH", QUEUE_DEPTH),
            ("QUEUE_ENSURE", QUEUE_ENSURE),
            ("QUEUE_UPSERT", QUEUE_UPSERT),
            ("QUEUE_GET", QUEUE_GET),
            ("QUEUE_SET_PAUSED", QUEUE_SET_PAUSED),
            ("QUEUE_ADOPT", QUEUE_ADOPT),
            ("TENANT_ENSURE", TENANT_ENSURE),
            ("TENANT_ROLE_AND_NAMING_KEY", TENANT_ROLE_AND_NAMING_KEY),
            ("TENANT_OF_LOGIN", TENANT_OF_LOGIN),
            ("TENANT_REGISTRY", TENANT_REGISTRY),
            ("TENANT_ADMISSIONS_RECORD", TENANT_ADMISSIONS_RECORD),
            ("TENANT_ADMISSION_FORGET", TENANT_ADMISSION_FORGET),
            ("TENANT_ADMISSION_PROVISIONED", TENANT_ADMISSION_PROVISIONED),
            ("TENANT_ADMISSION_REVOKED", TENANT_ADMISSION_REVOKED),
            ("TENANT_ADMISSION_MARK_REVOKED", TENANT_ADMISSION_MARK_REVOKED),
            (
                "TENANT_ADMISSION_REVOCATION_COMPLETE",
                TENANT_ADMISSION_REVOCATION_COMPLETE,
            ),
            ("TENANT_REVOKE_LOGIN", TENANT_REVOKE_LOGIN),
            ("TENANT_END_SESSIONS", TENANT_END_SESSIONS),
            ("TENANT_CAN_LOG_IN", TENANT_CAN_LOG_IN),
            ("QUEUE_DATABASE_REGISTER", QUEUE_DATABASE_REGISTER),
            ("QUEUE_DATABASE_HELD_RETIRED", QUEUE_DATABASE_HELD_RETIRED),
            ("QUEUE_DATABASE_RETIRED", QUEUE_DATABASE_RETIRED),
            ("QUEUE_DATABASE_RETIRE", QUEUE_DATABASE_RETIRE),
            ("SCHEDULE_ENSURE", SCHEDULE_ENSURE),
            ("SCHEDULE_LOCK", SCHEDULE_LOCK),
            ("SCHEDULE_ADVANCE", SCHEDULE_ADVANCE),
            ("SCHEDULE_LIST", SCHEDULE_LIST),
            ("EVENT_SUBSCRIBE", EVENT_SUBSCRIBE),
            ("EVENT_UNSUBSCRIBE_OTHERS", EVENT_UNSUBSCRIBE_OTHERS),
            ("JOB_STATUS", JOB_STATUS),
        ];
        let mut all: Vec<_> = consts.into_iter().map(|(n, s)| (n, s.to_string())).collect();
        all.push(("queue_demand_statement", queue_demand_statement("q")));
        all
    }

    /// The calls of `statement` that name no schema: a word directly followed by `(` that is not
    /// `schema.`-qualified, not SQL syntax that looks like a call (`coalesce`, `greatest`, `extract`,
    /// `ARRAY(...)`), and not a column list after `AS` (`AS h(id, attempt)`).
    fn unqualified_calls(statement: &str) -> Vec<String> {
        let syntax = ["coalesce", "greatest", "extract", "ARRAY", "OPERATOR"];
        let bytes = statement.as_bytes();
        let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let mut found = Vec::new();
        for (at, _) in statement.match_indices('(') {
            let start = (0..at).rev().take_while(|&i| word(bytes[i])).last();
            let Some(start) = start else { continue };
            let name = &statement[start..at];
            let before = statement[..start].trim_end();
            if (start > 0 && bytes[start - 1] == b'.') || syntax.contains(&name) || before.ends_with(" AS") {
                continue;
            }
            found.push(name.to_string());
        }
        found
    }

    /// Every function the statements Sluice sends call is named with its schema, and the operators
    /// pg_catalog has no exact match for are written `OPERATOR(pg_catalog.…)` (module docs, "Names").
    /// `tests/row_level_security.rs` shows on a server what an unqualified one lets a tenant do; this
    /// keeps a new statement from bringing one back unnoticed.
    #[test]
    fn the_statements_sluice_sends_name_pg_catalogs_functions_and_operators() {
        for (name, statement) in sent() {
            assert_eq!(
                unqualified_calls(&statement),
                Vec::<String>::new(),
                "{name} calls functions without their schema"
            );
            let bare = statement
                .replace("OPERATOR(pg_catalog.*)", "")
                .replace("OPERATOR(pg_catalog.||)", "")
                .replace("(*)", "")
                .replace("SELECT *", "");
            assert!(
                !bare.contains('*') && !bare.contains("||"),
                "{name}: `*` and `||` resolve through the session's path; write OPERATOR(pg_catalog.…)"
            );
        }
        assert_eq!(
            unqualified_calls("SELECT now(), h(x) AS h(id), pg_catalog.count(*)"),
            ["now", "h"],
            "the check finds what it looks for"
        );
    }
}

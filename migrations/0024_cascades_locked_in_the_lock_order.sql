-- Why: every path that locks several jobs takes its locks in one statement in id order (migrations
-- 0020-0023), except for two that ended a job with dependents and then let the
-- `jobs_release_dependents` trigger lock the rest:
--
-- * A lease rescue ending a job `dead` (its last attempt) or `cancelled` (cancellation requested) locked
--   the job with `FOR UPDATE SKIP LOCKED`, and the trigger then waited for its waiting children. A child
--   can have a smaller id than its parent (an explicit id, or a graph listing the child first): an
--   enqueue naming child C and parent P, C < P, locked C, then waited for P, which the rescue held while
--   it waited for C. PostgreSQL aborted one of them as a deadlock (40P01). A rescue of several such jobs
--   locked the children of each in turn, so it crossed two children of two of them the same way. A
--   shutdown release cancelling a job whose cancellation was requested did the same (its statement is
--   the store's, not a function; it now locks first, see `sql::JOB_LOCK_RELEASING`).
-- * A cascade's deeper levels (the children of children a failed job cancelled) were locked level by
--   level as the trigger reached them, after the level above: with grandchild G < child C, a cancel, a
--   rescue, a release or a finishing batch ending C's parent held C and waited for G, while an enqueue
--   naming G and C held G and waited for C.
--
-- Now the jobs a cascade can reach are locked together with the jobs that end, in one statement in id
-- order, before any of them is written: `sluice.job_cascade` lists them (the waiting children of the
-- ending jobs, then, below each child a failed parent cancels, its waiting children, to the bottom). The
-- trigger's own locks, level by level, are then locks the transaction holds already. `sluice.rescue_expired`
-- rescues as the store's statement did, except for the expired jobs whose rescue ends them with
-- dependents: those are locked together with their cascades in one statement in id order with `SKIP
-- LOCKED` (the rescue never waits: every worker's maintenance runs it, and an application transaction
-- enqueueing a child under such a job holds it until it commits), rescued first, and only when the job
-- and its whole cascade were locked; the others are left for the next rescue. `sluice.finish_jobs`
-- locks, with the batch and the waiting children it locked already, the deeper cascade of each job of
-- the batch with waiting children that its outcome ends failed (`p`, `c`, or `r` on the last attempt or
-- with a cancellation requested); any other batch (all successes, retries that are not the last
-- attempt) runs migration 0020's lock statement unchanged. The cancel locks the cascade in its first
-- statement (`sql::JOB_CANCEL`, the store's).
--
-- What remains: a job that joins a cascade after its lock statement read it (a child enqueued under a
-- job just then) is still locked as the trigger reaches it, and so is the cascade of a job a release or
-- a cancel ends although its snapshot said it would not (a cancellation requested, or a first child
-- enqueued, just then); the store runs a statement PostgreSQL aborted as a deadlock once more. The
-- rescue reads each cascade again under its locks and leaves a job whose cascade grew for the next pass.
--
-- Physical design: `sluice.job_cascade` walks the partial index of unresolved edges and looks the
-- children up by primary key; the lock statements look every job up by primary key. Same signature for
-- `sluice.finish_jobs`, whose body is migration 0020's but for the choice of its lock statement. Both new
-- functions pin `search_path`, as migrations 0014 and 0020 do.

-- The jobs a cascade from `p_roots` can reach if they end failed: their waiting children (with an
-- unresolved edge), and the waiting children of every such child that a failed parent cancels (blocked,
-- not `on_parent_failure = run`, with dependents), level by level to the bottom. A superset of what
-- `sluice.release_dependents` writes (a child whose edges all say any outcome is not cancelled, yet it
-- is walked), never less, except for jobs that join it later.
CREATE FUNCTION sluice.job_cascade(p_roots uuid[]) RETURNS uuid[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
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
$$;

-- The rescue of expired leases (`sql::JOB_RESCUE_EXPIRED` calls it): up to `p_limit` jobs of queues
-- `p_queues` whose lease expired become ready again, or `dead` after their last attempt, or `cancelled`
-- when asked to. Returns their ids.
CREATE FUNCTION sluice.rescue_expired(p_queues text[], p_limit bigint)
RETURNS TABLE (id uuid)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_ending uuid[];
    v_locked uuid[];
    v_rescued bigint := 0;
BEGIN
    -- The expired jobs whose rescue ends them with dependents (the trigger then writes their cascades).
    v_ending := ARRAY(
SELECT j.id
  FROM sluice.jobs j
 WHERE j.queue = ANY (p_queues)
   AND j.state = 'running'
   AND j.lease_expires_at < now()
   AND j.has_dependents
   AND (j.cancel_requested OR j.attempt >= j.max_attempts)
 ORDER BY j.id
 LIMIT p_limit
    );
    IF cardinality(v_ending) > 0 THEN
        -- Never waits: a job held by another transaction (an enqueue naming it as a parent, its own
        -- outcome write, another rescue) is skipped, and so is an ending job any job of whose cascade
        -- was skipped; the next rescue tries again.
        v_locked := ARRAY(
SELECT j.id
  FROM sluice.jobs j
 WHERE j.id = ANY (v_ending || sluice.job_cascade(v_ending))
 ORDER BY j.id
   FOR NO KEY UPDATE SKIP LOCKED
        );
        -- Rescued first, so that the limit does not put them off: the ending jobs whose own row and
        -- whole cascade (read again, so a job that joined it since counts) are locked, looked at again
        -- under their locks (one finished or renewed meanwhile is not rescued).
        RETURN QUERY
UPDATE sluice.jobs j
   SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                    WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'retrying' END,
       finished_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN now() END,
       run_at = now(),
       last_error = 'lease expired: worker ' || j.lease_owner || ' stopped heartbeating',
       lease_owner = NULL,
       lease_expires_at = NULL
 WHERE j.id = ANY (v_ending)
   AND j.id = ANY (v_locked)
   AND sluice.job_cascade(ARRAY[j.id]) <@ v_locked
   AND j.state = 'running'
   AND j.lease_expires_at < now()
RETURNING j.id;
        GET DIAGNOSTICS v_rescued = ROW_COUNT;
    END IF;
    IF v_rescued >= p_limit THEN
        RETURN;
    END IF;
    -- The other expired jobs are taken as before, skipping those another transaction holds. A job
    -- ending with dependents is never taken here: one that was not rescued above (held, or its cascade
    -- partly held) or came to end with dependents since (a child enqueued, a cancellation requested)
    -- is left for the next rescue, which locks it with its cascade.
    RETURN QUERY
WITH expired AS (
    SELECT j.id
      FROM sluice.jobs j
     WHERE j.queue = ANY (p_queues)
       AND j.state = 'running'
       AND j.lease_expires_at < now()
       AND NOT (j.has_dependents AND (j.cancel_requested OR j.attempt >= j.max_attempts))
     LIMIT p_limit - v_rescued
       FOR UPDATE SKIP LOCKED
)
UPDATE sluice.jobs j
   SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                    WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'retrying' END,
       finished_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN now() END,
       run_at = now(),
       last_error = 'lease expired: worker ' || j.lease_owner || ' stopped heartbeating',
       lease_owner = NULL,
       lease_expires_at = NULL
  FROM expired
 WHERE j.id = expired.id
RETURNING j.id;
END;
$$;

-- As migration 0020, with the deeper cascades of the batch's failing jobs in the lock statement.
CREATE OR REPLACE FUNCTION sluice.finish_jobs(uuid[], integer[], text[], bigint[], text[], text)
RETURNS TABLE (id uuid, state text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_parents uuid[];
    v_roots uuid[];
BEGIN
    v_parents := ARRAY(
SELECT DISTINCT d.parent_id
  FROM sluice.job_dependencies d
 WHERE d.parent_id = ANY ($1) AND NOT d.resolved
    );
    IF cardinality(v_parents) > 0 THEN
        -- The jobs of the batch with waiting children that this outcome ends failed (`dead` or
        -- `cancelled`): their cascades go deeper than their children. None in a batch of successes,
        -- which then runs migration 0020's lock statement and nothing more.
        IF NOT ($3 <@ ARRAY['s']) THEN
            v_roots := ARRAY(
SELECT f.id
  FROM unnest($1, $3) AS f(id, outcome)
  JOIN sluice.jobs r ON r.id = f.id
 WHERE f.id = ANY (v_parents)
   AND f.outcome <> 's'
   AND (f.outcome <> 'r' OR r.cancel_requested OR r.attempt >= r.max_attempts)
            );
        END IF;
        IF cardinality(v_roots) > 0 THEN
            v_parents := ARRAY(
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
            );
        ELSE
            v_parents := ARRAY(
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
            );
        END IF;
    END IF;
    RETURN QUERY
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
RETURNING j.id, j.state;
END;
$$;

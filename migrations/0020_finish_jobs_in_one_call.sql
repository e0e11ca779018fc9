-- Why: a worker recorded each batch of finished jobs in a transaction of five round trips: BEGIN,
-- `SET LOCAL plan_cache_mode = force_generic_plan` (the fenced update's custom plans scan the table; see
-- the worker's SQL docs), a statement locking every job of the batch in id order (so that two batches
-- releasing shared children lock those children in one order), the fenced update itself, and COMMIT.
-- The lock wrote every row of the batch once more before the update wrote it again, although almost
-- no batch has a job with children waiting on it.
--
-- Now one call: `sluice.finish_jobs` runs as its own statement, with the generic plans set on the
-- function (`SET plan_cache_mode`, which ends with the call). It first looks for the batch's jobs with
-- open edges in the small partial index of unresolved dependencies. Only when there are any does it lock,
-- in one statement and one id order (the order an enqueue locks the parents it names, 0010), the jobs of
-- the batch this owner holds and the children waiting on the batch's jobs. Two rounds (the batch, then
-- the children) could cross an enqueue: with a batch {P, X}, a child Y waiting on P and ids P < Y < X,
-- an enqueue naming Y and X would lock Y while the finish held X. The two sets never share a row: a job
-- with an unresolved edge is blocked (or cancelled), never running, so it is not a job of the batch the
-- owner holds. A child of a batch job the owner does not hold is locked too (the update then does not
-- write that parent); `v_parents` keeps only the parents the statement locked. Then the fenced update,
-- which returns the jobs it wrote with their new state. The probe for waiting children takes no lock,
-- so a child enqueued between it and the update can still meet the finish in another order; the store
-- retries a batch PostgreSQL aborts as a deadlock once.
--
-- Parameters: the ids, the attempts (the fence), the outcomes (`s` succeeded, `r` retry, `p` permanent
-- failure, `c` cancelled by its handler), the retry delays in ms, the error texts, and the lease owner.
-- Runs as the caller (row-level security applies as to the statements it replaces), with a fixed
-- search path (every name in it and in the triggers it fires is qualified).

CREATE FUNCTION sluice.finish_jobs(uuid[], integer[], text[], bigint[], text[], text)
RETURNS TABLE (id uuid, state text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_parents uuid[];
BEGIN
    v_parents := ARRAY(
SELECT DISTINCT d.parent_id
  FROM sluice.job_dependencies d
 WHERE d.parent_id = ANY ($1) AND NOT d.resolved
    );
    IF cardinality(v_parents) > 0 THEN
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

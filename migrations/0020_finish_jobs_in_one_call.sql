-- Why: a worker recorded each batch of finished jobs in a transaction of five round trips: BEGIN,
-- `SET LOCAL plan_cache_mode = force_generic_plan` (the fenced update's custom plans scan the table; see
-- the worker's SQL docs), a statement locking every job of the batch in id order (so that two batches
-- releasing shared children lock those children in one order), the fenced update itself, and COMMIT.
-- The lock wrote every row of the batch once more before the update wrote it again, although almost
-- no batch has a job with children waiting on it.
--
-- Now one call: `sluice.finish_jobs` runs as its own statement, with the generic plans set on the
-- function (`SET plan_cache_mode`, which ends with the call). It first looks for the batch's jobs with
-- open edges in the small partial index of unresolved dependencies; only when there are any does it lock
-- those jobs, then their waiting children, each in id order, as before. Then the fenced update (the same
-- statement as before), which returns the jobs it wrote with their new state.
--
-- Parameters: the ids, the attempts (the fence), the outcomes (`s` succeeded, `r` retry, `p` permanent
-- failure, `c` cancelled by its handler), the retry delays in ms, the error texts, and the lease owner.
-- Runs as the caller (row-level security applies as to the statements it replaces).

CREATE FUNCTION sluice.finish_jobs(uuid[], integer[], text[], bigint[], text[], text)
RETURNS TABLE (id uuid, state text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
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
        PERFORM j.id
           FROM sluice.jobs j
          WHERE j.id = ANY (v_parents)
            AND j.lease_owner = $6
            AND j.lease_expires_at IS NOT NULL
          ORDER BY j.id
            FOR NO KEY UPDATE;
        PERFORM c.id
           FROM sluice.jobs c
          WHERE c.id IN (SELECT d.job_id FROM sluice.job_dependencies d
                          WHERE d.parent_id = ANY (v_parents) AND NOT d.resolved)
            AND c.state = 'blocked'
          ORDER BY c.id
            FOR NO KEY UPDATE;
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

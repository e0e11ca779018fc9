-- Why: `sluice.finish_jobs` (0020) locked only the batch's jobs with children waiting on them before its
-- update. An enqueue naming two jobs of one batch as parents locks them in id order (0010); when only
-- the later of the two had a waiting child, the finish held it and waited for the earlier one, which the
-- enqueue held while it waited for the later one: a deadlock, which PostgreSQL broke after
-- `deadlock_timeout` by aborting one of the two.
--
-- Now, when some of the batch's jobs have children waiting on them, the function first locks every job
-- of the batch this owner holds, in id order (the order an enqueue locks parents in), then the waiting
-- children of those it locked, in id order. The common batch, with no waiting children, is still the
-- fenced update alone. The children are found by primary key from the unresolved edges whatever their
-- state (0020 said `state = 'blocked'`, which let the planner scan the partial index of blocked jobs,
-- empty by the statistics, and filter every blocked job). The function also sets its `search_path`:
-- every name in it is schema-qualified.
-- The check for waiting children takes no lock, so a child enqueued between it and the update can still
-- meet the finish in another order; the store retries a batch PostgreSQL aborts as a deadlock once.

CREATE OR REPLACE FUNCTION sluice.finish_jobs(uuid[], integer[], text[], bigint[], text[], text)
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
     WHERE j.id = ANY ($1)
       AND j.lease_owner = $6
       AND j.lease_expires_at IS NOT NULL
     ORDER BY j.id
       FOR NO KEY UPDATE
)
SELECT locked.id FROM locked WHERE locked.id = ANY (v_parents)
        );
        PERFORM 1 FROM (
SELECT c.id
  FROM sluice.jobs c
 WHERE c.id IN (SELECT d.job_id FROM sluice.job_dependencies d
                 WHERE d.parent_id = ANY (v_parents) AND NOT d.resolved)
 ORDER BY c.id
   FOR NO KEY UPDATE
        ) children;
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

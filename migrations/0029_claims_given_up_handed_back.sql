-- Why: a worker gives up a claim the database has not answered within its answer deadline, but a
-- server that was only slow (overloaded, a claim held up behind a lock) carries on with it and commits:
-- its jobs are then leased to the worker, which does not know them. Until now they were rescued only
-- once the lease lapsed, each having spent an attempt although no handler ran it (on its last attempt:
-- `dead`, "lease expired"). A worker that gave up a claim now calls `sluice.return_unknown_claims` for a
-- while (see docs/queue.md, "Silent connections"), which hands such jobs back as if they had never been
-- claimed: the attempt the claim counted is taken back, the job is `pending` (no attempt left counted)
-- or `retrying` again, its lease cleared, and the workers of its queue are woken.
--
-- The fence: only jobs leased to `p_owner` (the caller's own lease owner, unique per worker process or
-- gRPC stream), running, whose lease has not lapsed, and not at an (id, attempt) the caller names as
-- held (`p_held`, `p_attempts`: every job it has claimed and not yet written, running or finishing, and
-- those whose outcome it gave up writing, which ran). A job another worker holds has another owner; a
-- job this worker is running is named. A lapsed lease is the rescue's (which counts the attempt), and
-- a job whose cancellation was requested is left to it too (the rescue cancels it with its
-- dependents). The caller must name its jobs while none of its claims is under way (the worker holds
-- its claims back meanwhile), or a job claimed just then would be handed back while it starts.
--
-- Locks: the jobs are locked in one statement in id order (the order every other path takes,
-- migrations 0021-0024), skipping rows another transaction holds (a rescue, an enqueue naming the job
-- as a parent, the job's own outcome write): a skipped job is left for the next call or the rescue.
-- The statement never waits, so it cannot deadlock with anything. Handing a job back to `pending` or
-- `retrying` ends no job, so no dependent is touched (the dependents trigger fires on finished states
-- only).
--
-- Runs as the caller (row-level security applies: a tenant hands back only its namespace's jobs), with
-- a pinned search path (migration 0025); nothing it names lies outside pg_catalog and `sluice`.
--
-- Physical design: the running jobs of the caller's queues are found through the partial running index
-- (`jobs_running_idx`, small: the running set) and filtered by owner; the held set is a hashed
-- anti-join. A call is made only after a claim was given up, not on every heartbeat.

CREATE FUNCTION sluice.return_unknown_claims(p_owner text, p_queues text[], p_held uuid[], p_attempts integer[])
RETURNS TABLE (id uuid, attempt integer, queue text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[];
    v_attempts integer[];
    v_queues text[];
    v_ready text[];
    v_queue text;
BEGIN
    WITH unknown AS (
        SELECT j.id
          FROM sluice.jobs j
         WHERE j.queue = ANY (p_queues)
           AND j.state = 'running'
           AND j.lease_owner = p_owner
           AND j.lease_expires_at > now()
           AND NOT j.cancel_requested
           AND NOT EXISTS (SELECT 1
                             FROM unnest(p_held, p_attempts) AS h(id, attempt)
                            WHERE h.id = j.id AND h.attempt = j.attempt)
         ORDER BY j.id
           FOR NO KEY UPDATE SKIP LOCKED
    ), returned AS (
        UPDATE sluice.jobs j
           SET state = CASE WHEN j.attempt = 1 THEN 'pending' ELSE 'retrying' END,
               attempt = j.attempt - 1,
               started_at = CASE WHEN j.attempt = 1 THEN NULL ELSE j.started_at END,
               lease_owner = NULL,
               lease_expires_at = NULL
          FROM unknown
         WHERE j.id = unknown.id
           AND j.lease_owner = p_owner
           AND j.lease_expires_at IS NOT NULL
        RETURNING j.id, j.attempt, j.queue
    )
    SELECT coalesce(array_agg(returned.id ORDER BY returned.id), '{}'),
           coalesce(array_agg(returned.attempt ORDER BY returned.id), '{}'),
           coalesce(array_agg(returned.queue ORDER BY returned.id), '{}'),
           coalesce(array_agg(DISTINCT returned.queue), '{}')
      INTO v_ids, v_attempts, v_queues, v_ready
      FROM returned;
    -- Ready again at once: the workers of their queues claim them now, not at their next poll.
    FOREACH v_queue IN ARRAY v_ready LOOP
        PERFORM sluice.notify_ready(v_queue, now());
    END LOOP;
    RETURN QUERY SELECT r.id, r.attempt, r.queue FROM unnest(v_ids, v_attempts, v_queues) AS r(id, attempt, queue);
END;
$$;

-- Why: in a cluster the tenant is the namespace. JobQueues `a/thumbnails` and `b/thumbnails` pointing at
-- one database were one queue `thumbnails`, and each namespace's workers took the other's jobs. A
-- JobQueue's queue is now named `<namespace>/<queueName>` in the database: the queue column stays one
-- text key (every claim, enqueue and index keeps working on it unchanged), and names without a
-- namespace stay valid for queues used outside Kubernetes (the Rust library, a sidecar without a
-- namespace).
--
-- `sluice.adopt_queue(from, to)` moves a queue under a new name with everything it holds (settings,
-- jobs in every state, schedules): the operator uses it to adopt a queue an earlier version named
-- `thumbnails` into `shop/thumbnails`, and it is the documented SQL step where the operator cannot tell
-- which JobQueue a queue belongs to (see docs/queue.md, "Queue names and namespaces").

ALTER TABLE sluice.queues DROP CONSTRAINT IF EXISTS queues_name_check;
ALTER TABLE sluice.queues ADD CONSTRAINT queues_name_check
    CHECK (name ~ '^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[A-Za-z0-9][A-Za-z0-9._-]{0,99}$');

-- Renames queue `p_from` to `p_to` and moves its jobs and schedules along; returns how many jobs moved,
-- or NULL when there is no queue `p_from` (nothing to adopt). `p_to` may exist already (the operator
-- registers its settings) but must hold no job and no schedule yet (SL409 otherwise: two queues' keys
-- could collide); its settings are kept, else those of `p_from` are copied.
--
-- It takes SHARE ROW EXCLUSIVE on `sluice.jobs` and `sluice.schedules` for its transaction: it waits for
-- enqueues, claims and completions in flight to commit and holds new ones back until it commits (a job
-- enqueued under the old name concurrently would otherwise be left behind without its queue). Running
-- jobs keep their leases: workers complete and heartbeat them by id, whatever the queue is called.
-- Afterwards the old name does not exist: an enqueue naming it fails with SL404.
CREATE FUNCTION sluice.adopt_queue(p_from text, p_to text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_moved bigint;
BEGIN
    IF p_from = p_to THEN
        RAISE EXCEPTION 'adopt_queue: the old and the new name are both "%"', p_from USING ERRCODE = '22023';
    END IF;
    LOCK TABLE sluice.jobs, sluice.schedules IN SHARE ROW EXCLUSIVE MODE;
    PERFORM 1 FROM sluice.queues q WHERE q.name = p_from FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM sluice.jobs j WHERE j.queue = p_to)
       OR EXISTS (SELECT 1 FROM sluice.schedules s WHERE s.queue = p_to) THEN
        RAISE EXCEPTION 'queue "%" holds jobs or schedules already; adopting "%" into it could mix their keys',
            p_to, p_from USING ERRCODE = 'SL409';
    END IF;
    INSERT INTO sluice.queues (name, max_attempts, backoff_base_ms, backoff_cap_ms, backoff_multiplier,
                               lease_ms, retention_succeeded_ms, retention_dead_ms, idempotency_window_ms,
                               paused)
    SELECT p_to, q.max_attempts, q.backoff_base_ms, q.backoff_cap_ms, q.backoff_multiplier, q.lease_ms,
           q.retention_succeeded_ms, q.retention_dead_ms, q.idempotency_window_ms, q.paused
      FROM sluice.queues q
     WHERE q.name = p_from
    ON CONFLICT (name) DO NOTHING;
    UPDATE sluice.jobs j SET queue = p_to WHERE j.queue = p_from;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    UPDATE sluice.schedules s SET queue = p_to WHERE s.queue = p_from;
    DELETE FROM sluice.queues q WHERE q.name = p_from;
    PERFORM sluice.notify_ready(p_to, now());
    RETURN v_moved;
END;
$$;

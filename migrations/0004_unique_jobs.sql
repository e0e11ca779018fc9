-- Why: callers want "at most one of this job" without keeping their own bookkeeping: one reindex per
-- document, one digest per user, one sync after a burst of edits. A unique key names the job; the unique
-- mode says what a second enqueue with the key does (see docs/queue.md, "Unique jobs").
--
-- Physical design:
-- * Two nullable columns without defaults: adding them rewrites nothing, so existing tables upgrade at
--   once and existing rows simply have no key.
-- * `unique_key` is set on the job that holds the key. The unique partial index lets one job per queue
--   hold a key; concurrent enqueues with one key resolve there (the second INSERT waits for the first
--   transaction, then skips). A job gives its key up lazily, as idempotency keys do: the next enqueue with
--   the key clears it on a holder that no longer counts (dead, cancelled, or succeeded longer ago than
--   its `unique_for_ms`, or running when the new enqueue replaces), so no completion statement changes.
-- * Only keyed jobs enter the index, so jobs without a key pay nothing for it.

ALTER TABLE sluice.jobs
    ADD COLUMN unique_key text CHECK (length(unique_key) BETWEEN 1 AND 255),
    -- How long after it succeeded the job keeps its key (NULL: released when it finishes).
    ADD COLUMN unique_for_ms bigint CHECK (unique_for_ms >= 0);

CREATE UNIQUE INDEX jobs_unique_idx ON sluice.jobs (queue, unique_key) WHERE unique_key IS NOT NULL;

-- The old signatures go: a new parameter list would otherwise add an overload beside them, and calls
-- with the old arguments would become ambiguous. The new functions keep the old parameters, in the same
-- order, first: existing callers (positional or named) keep working.
DROP FUNCTION sluice.enqueue(text, jsonb, text, integer, timestamptz, integer, text);
DROP FUNCTION sluice.enqueue_job(text, text, jsonb, integer, timestamptz, integer, text, uuid);

-- Enqueues one job and says whether it was created.
--
-- Idempotency key (Stripe semantics, answers a retried request): the same key with the same kind and
-- payload within the queue's window returns the original job (created = false); with a different kind or
-- payload it raises SL409; after the window the old job keeps running its course but loses the key.
--
-- Unique key (at most one such job): while a job holds the key, a second enqueue with it does, by
-- `p_unique_mode`:
--   preserve  (default) returns the holder, waiting or running; nothing changes.
--   replace   a waiting holder takes the new kind, payload, priority, run time and max attempts; a
--             running holder is left alone and loses the key to a new job.
--   debounce  as replace, and the run time becomes now + `p_debounce`, pushed again by every enqueue.
-- A holder that succeeded keeps the key for `p_unique_for` after it finished (nothing new is made in
-- any mode); a dead or cancelled one gives it up.
--
-- Concurrent calls with one key make one job: the unique index makes the second INSERT wait for the
-- first transaction; the holder it then finds is locked (FOR UPDATE) before it is changed, so a worker
-- cannot claim it halfway through a replace.
--
-- Errors: SL404 no such queue; SL409 idempotency key reused; 22023 inconsistent options (named).
CREATE FUNCTION sluice.enqueue_job(
    p_queue text,
    p_kind text,
    p_payload jsonb,
    p_priority integer DEFAULT 0,
    p_run_at timestamptz DEFAULT NULL,
    p_max_attempts integer DEFAULT NULL,
    p_idempotency_key text DEFAULT NULL,
    p_id uuid DEFAULT NULL,
    p_unique_key text DEFAULT NULL,
    p_unique_mode text DEFAULT NULL,
    p_unique_for interval DEFAULT NULL,
    p_debounce interval DEFAULT NULL
) RETURNS TABLE (id uuid, created boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    q         sluice.queues;
    v_id      uuid := coalesce(p_id, sluice.uuid_v7());
    v_hash    bytea;
    v_old     sluice.jobs;
    v_tries   integer := 0;
    v_mode    text;
    v_run_at  timestamptz := coalesce(p_run_at, now());
    v_for_ms  bigint;
BEGIN
    SELECT * INTO q FROM sluice.queues WHERE sluice.queues.name = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue "%" does not exist', p_queue USING ERRCODE = 'SL404';
    END IF;

    IF p_unique_key IS NULL THEN
        IF p_unique_mode IS NOT NULL OR p_unique_for IS NOT NULL OR p_debounce IS NOT NULL THEN
            RAISE EXCEPTION 'unique_mode, unique_for and debounce need a unique_key' USING ERRCODE = '22023';
        END IF;
    ELSE
        v_mode := coalesce(p_unique_mode, CASE WHEN p_debounce IS NOT NULL THEN 'debounce' ELSE 'preserve' END);
        IF v_mode NOT IN ('preserve', 'replace', 'debounce') THEN
            RAISE EXCEPTION 'unique_mode "%": use preserve, replace or debounce', v_mode USING ERRCODE = '22023';
        END IF;
        IF (v_mode = 'debounce') <> (p_debounce IS NOT NULL) THEN
            RAISE EXCEPTION 'debounce: give it exactly when unique_mode is debounce' USING ERRCODE = '22023';
        END IF;
        IF p_debounce < interval '0' OR p_unique_for < interval '0' THEN
            RAISE EXCEPTION 'debounce and unique_for must not be negative' USING ERRCODE = '22023';
        END IF;
        IF v_mode = 'debounce' AND p_run_at IS NOT NULL THEN
            RAISE EXCEPTION 'run_at: not with debounce, which sets the run time itself' USING ERRCODE = '22023';
        END IF;
        IF p_idempotency_key IS NOT NULL THEN
            RAISE EXCEPTION 'idempotency_key and unique_key cannot be combined: use one of them'
                USING ERRCODE = '22023';
        END IF;
        IF v_mode = 'debounce' THEN
            v_run_at := now() + p_debounce;
        END IF;
        v_for_ms := (extract(epoch FROM p_unique_for) * 1000)::bigint;
    END IF;

    IF p_unique_key IS NOT NULL THEN
        LOOP
            v_tries := v_tries + 1;
            IF v_tries > 10 THEN
                RAISE EXCEPTION 'unique key "%" is contended', p_unique_key USING ERRCODE = '40001';
            END IF;
            INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at,
                                     unique_key, unique_for_ms)
            VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                    v_run_at, p_unique_key, v_for_ms)
            ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING;
            EXIT WHEN FOUND;
            SELECT * INTO v_old FROM sluice.jobs j
             WHERE j.queue = p_queue AND j.unique_key = p_unique_key
               FOR UPDATE;
            CONTINUE WHEN NOT FOUND; -- the holder was deleted or gave the key up meanwhile: try again
            IF v_old.state IN ('dead', 'cancelled')
               OR (v_old.state = 'succeeded'
                   AND (v_old.unique_for_ms IS NULL
                        OR v_old.finished_at + v_old.unique_for_ms * interval '1 millisecond' <= now()))
               OR (v_old.state = 'running' AND v_mode <> 'preserve') THEN
                -- The holder no longer counts (or is running and being replaced): it keeps its history
                -- and loses the key, and the key makes a new job.
                UPDATE sluice.jobs j SET unique_key = NULL WHERE j.id = v_old.id;
                CONTINUE;
            END IF;
            IF v_old.state IN ('succeeded', 'running') OR v_mode = 'preserve' THEN
                id := v_old.id;
                created := false;
                RETURN NEXT;
                RETURN;
            END IF;
            -- A waiting holder, replaced in place (it keeps its id and attempts so far).
            UPDATE sluice.jobs j
               SET kind = p_kind,
                   payload = p_payload,
                   priority = p_priority,
                   run_at = v_run_at,
                   max_attempts = greatest(coalesce(p_max_attempts, q.max_attempts), j.attempt, 1),
                   unique_for_ms = v_for_ms
             WHERE j.id = v_old.id;
            PERFORM sluice.notify_ready(p_queue, v_run_at);
            id := v_old.id;
            created := false;
            RETURN NEXT;
            RETURN;
        END LOOP;
    ELSIF p_idempotency_key IS NULL THEN
        INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at)
        VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                v_run_at);
    ELSE
        v_hash := sha256(convert_to(p_kind || E'\n' || p_payload::text, 'UTF8'));
        LOOP
            v_tries := v_tries + 1;
            IF v_tries > 10 THEN
                RAISE EXCEPTION 'idempotency key "%" is contended', p_idempotency_key
                    USING ERRCODE = '40001';
            END IF;
            INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at,
                                     idempotency_key, payload_hash)
            VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                    v_run_at, p_idempotency_key, v_hash)
            ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
            EXIT WHEN FOUND;
            SELECT * INTO v_old FROM sluice.jobs j
             WHERE j.queue = p_queue AND j.idempotency_key = p_idempotency_key;
            CONTINUE WHEN NOT FOUND; -- the holder was deleted or lost its key meanwhile: try again
            IF v_old.created_at < now() - q.idempotency_window_ms * interval '1 millisecond' THEN
                UPDATE sluice.jobs j SET idempotency_key = NULL
                 WHERE j.id = v_old.id AND j.idempotency_key = p_idempotency_key;
                CONTINUE;
            END IF;
            IF v_old.payload_hash IS DISTINCT FROM v_hash THEN
                RAISE EXCEPTION 'idempotency key "%" was used with a different request', p_idempotency_key
                    USING ERRCODE = 'SL409';
            END IF;
            id := v_old.id;
            created := false;
            RETURN NEXT;
            RETURN;
        END LOOP;
    END IF;
    PERFORM sluice.notify_ready(p_queue, v_run_at);
    id := v_id;
    created := true;
    RETURN NEXT;
END;
$$;

-- Enqueues one job and returns its id (see enqueue_job for idempotency and unique keys).
-- Examples:
--   SELECT sluice.enqueue('emails', '{"to":"a@b.c"}', kind => 'welcome');
--   SELECT sluice.enqueue('search', '{"doc":42}', kind => 'reindex', unique_key => 'doc-42',
--                         unique_mode => 'debounce', debounce => interval '10 seconds');
CREATE FUNCTION sluice.enqueue(
    queue text,
    payload jsonb,
    kind text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    unique_key text DEFAULT NULL,
    unique_mode text DEFAULT NULL,
    unique_for interval DEFAULT NULL,
    debounce interval DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT e.id FROM sluice.enqueue_job($1, $3, $2, $4, $5, $6, $7, NULL, $8, $9, $10, $11) e
$$;

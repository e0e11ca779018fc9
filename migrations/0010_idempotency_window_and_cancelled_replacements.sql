-- Why: two faults of migration 0009's keys (see docs/queue.md, "Keys and dependencies together"):
--
-- * An idempotency key recorded on an existing job (the job that answered a request by its unique key)
--   expired at once when that job was older than the queue's idempotency window: the window counted from
--   the job's `created_at`, not from when the key was recorded. A retry of the request then found the key
--   expired, and once the holder had finished, made a second job. The window now counts from
--   `idempotency_at`, set whenever a key is written (insert, or recorded on a holder); rows from before
--   this migration have it NULL and count from `created_at`, as before.
-- * A request replacing a running holder whose new job is created already cancelled (a parent of its own
--   dead or cancelled) took the key from the holder: the next enqueue found the key on a cancelled job,
--   treated it as given up, and made a job that ran beside the still-running holder. Such a job is now
--   created without the unique key; the running holder keeps it.
--
-- Physical design: one nullable column without a default (no table rewrite, no backfill); `enqueue_job`
-- is replaced with the same signature.

ALTER TABLE sluice.jobs
    -- When the idempotency key was written on this row (NULL: before this column existed, then
    -- `created_at` counts).
    ADD COLUMN idempotency_at timestamptz;

-- Enqueues one job and says whether it was created: idempotency key, unique key and dependencies in any
-- combination, by the rules of migration 0009 with the two fixes above.
CREATE OR REPLACE FUNCTION sluice.enqueue_job(
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
    p_debounce interval DEFAULT NULL,
    p_depends_on uuid[] DEFAULT NULL,
    p_on_parent_failure text DEFAULT NULL
) RETURNS TABLE (id uuid, created boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    q           sluice.queues;
    v_id        uuid := coalesce(p_id, sluice.uuid_v7());
    v_hash      bytea;
    v_old       sluice.jobs;
    v_answer    uuid;
    v_tries     integer := 0;
    v_mode      text;
    v_run_at    timestamptz := coalesce(p_run_at, now());
    v_for_ms    bigint;
    v_parents   uuid[];
    v_missing   uuid;
    v_open      uuid[] := '{}';
    v_failed    sluice.jobs;
    v_state     text := 'pending';
    v_error     text;
    v_after     uuid;
    v_keyless   boolean := false;
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
        IF v_mode = 'debounce' THEN
            v_run_at := now() + p_debounce;
        END IF;
        v_for_ms := (extract(epoch FROM p_unique_for) * 1000)::bigint;
    END IF;
    IF p_idempotency_key IS NOT NULL THEN
        v_hash := sha256(convert_to(p_kind || E'\n' || p_payload::text, 'UTF8'));
    END IF;

    IF p_on_parent_failure IS NOT NULL AND p_on_parent_failure NOT IN ('cancel', 'run') THEN
        RAISE EXCEPTION 'on_parent_failure "%": use cancel or run', p_on_parent_failure USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_depends_on) > 0 THEN
        SELECT array_agg(DISTINCT x) INTO v_parents FROM unnest(p_depends_on) x;
        IF array_position(v_parents, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'depends_on: job ids must not be null' USING ERRCODE = '22023';
        END IF;
        IF cardinality(v_parents) > 1000 THEN
            RAISE EXCEPTION 'depends_on: at most 1000 parents' USING ERRCODE = '22023';
        END IF;
        -- Lock the parents in id order (no deadlock between two enqueues naming the same parents): a
        -- completion of one of them waits for this transaction, then releases this job.
        PERFORM 1 FROM (SELECT j.id FROM sluice.jobs j WHERE j.id = ANY (v_parents) ORDER BY j.id
                          FOR NO KEY UPDATE) locked;
        SELECT x INTO v_missing FROM unnest(v_parents) x
         WHERE NOT EXISTS (SELECT 1 FROM sluice.jobs j WHERE j.id = x) LIMIT 1;
        IF v_missing IS NOT NULL THEN
            RAISE EXCEPTION 'depends_on: job % does not exist', v_missing USING ERRCODE = '22023';
        END IF;
        SELECT coalesce(array_agg(j.id), '{}') INTO v_open FROM sluice.jobs j
         WHERE j.id = ANY (v_parents) AND j.state NOT IN ('succeeded', 'dead', 'cancelled');
        SELECT * INTO v_failed FROM sluice.jobs j
         WHERE j.id = ANY (v_parents) AND j.state IN ('dead', 'cancelled') ORDER BY j.id LIMIT 1;
        IF v_failed.id IS NOT NULL AND p_on_parent_failure IS DISTINCT FROM 'run' THEN
            v_state := 'cancelled';
            v_error := format('cancelled: parent job %s is %s', v_failed.id, v_failed.state);
        END IF;
    END IF;

    IF p_unique_key IS NULL AND p_idempotency_key IS NULL THEN
        INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at, state, blocked_by,
                                 on_parent_failure, finished_at, last_error)
        VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                v_run_at,
                CASE WHEN v_state = 'cancelled' THEN 'cancelled'
                     WHEN cardinality(v_open) > 0 THEN 'blocked' ELSE 'pending' END,
                CASE WHEN v_state = 'cancelled' THEN 0 ELSE cardinality(v_open) END,
                p_on_parent_failure, CASE WHEN v_state = 'cancelled' THEN now() END, v_error);
    ELSE
        LOOP
            v_tries := v_tries + 1;
            IF v_tries > 10 THEN
                RAISE EXCEPTION 'key "%" is contended', coalesce(p_unique_key, p_idempotency_key)
                    USING ERRCODE = '40001';
            END IF;
            -- No conflict target: a conflict on either key (or the id) skips the insert, after waiting for
            -- a transaction that is inserting the same key.
            INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at,
                                     idempotency_key, payload_hash, idempotency_at, unique_key, unique_for_ms,
                                     state, blocked_by, on_parent_failure, finished_at, last_error)
            VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                    v_run_at, p_idempotency_key, v_hash,
                    CASE WHEN p_idempotency_key IS NOT NULL THEN now() END,
                    CASE WHEN NOT v_keyless THEN p_unique_key END,
                    CASE WHEN NOT v_keyless THEN v_for_ms END,
                    CASE WHEN v_state = 'cancelled' THEN 'cancelled'
                         WHEN cardinality(v_open) > 0 THEN 'blocked' ELSE 'pending' END,
                    CASE WHEN v_state = 'cancelled' THEN 0 ELSE cardinality(v_open) END,
                    p_on_parent_failure, CASE WHEN v_state = 'cancelled' THEN now() END, v_error)
            ON CONFLICT DO NOTHING;
            EXIT WHEN FOUND;

            -- The idempotency key answers a retried request first.
            IF p_idempotency_key IS NOT NULL THEN
                SELECT * INTO v_old FROM sluice.jobs j
                 WHERE j.queue = p_queue AND j.idempotency_key = p_idempotency_key;
                IF FOUND THEN
                    -- The window counts from when the key was written on this job.
                    IF coalesce(v_old.idempotency_at, v_old.created_at)
                       < now() - q.idempotency_window_ms * interval '1 millisecond' THEN
                        UPDATE sluice.jobs j SET idempotency_key = NULL
                         WHERE j.id = v_old.id AND j.idempotency_key = p_idempotency_key;
                        CONTINUE;
                    END IF;
                    IF v_old.payload_hash IS DISTINCT FROM v_hash THEN
                        RAISE EXCEPTION 'idempotency key "%" was used with a different request',
                            p_idempotency_key USING ERRCODE = 'SL409';
                    END IF;
                    id := v_old.id;
                    created := false;
                    RETURN NEXT;
                    RETURN;
                END IF;
            END IF;

            -- Then the unique key decides.
            IF p_unique_key IS NOT NULL AND NOT v_keyless THEN
                SELECT * INTO v_old FROM sluice.jobs j
                 WHERE j.queue = p_queue AND j.unique_key = p_unique_key
                   FOR UPDATE;
                IF FOUND THEN
                    IF v_old.state IN ('dead', 'cancelled')
                       OR (v_old.state = 'succeeded'
                           AND (v_old.unique_for_ms IS NULL
                                OR v_old.finished_at + v_old.unique_for_ms * interval '1 millisecond' <= now()))
                    THEN
                        UPDATE sluice.jobs j SET unique_key = NULL WHERE j.id = v_old.id;
                        CONTINUE;
                    END IF;
                    IF v_old.state = 'running' AND v_mode <> 'preserve' AND v_state = 'cancelled' THEN
                        -- The new job is cancelled from the start (a parent of its own failed): it does
                        -- not replace the running holder, which keeps the key; the job is made without it.
                        v_keyless := true;
                        CONTINUE;
                    END IF;
                    IF v_old.state = 'running' AND v_mode <> 'preserve' THEN
                        -- Replacing a running holder: it is left alone and gives the key up; the new job
                        -- waits for it, whatever its outcome, besides its own parents.
                        UPDATE sluice.jobs j SET unique_key = NULL, has_dependents = true WHERE j.id = v_old.id;
                        v_after := v_old.id;
                        IF NOT v_old.id = ANY (coalesce(v_parents, '{}')) THEN
                            v_parents := coalesce(v_parents, '{}') || v_old.id;
                            v_open := v_open || v_old.id;
                        END IF;
                        CONTINUE;
                    END IF;
                    IF v_old.state NOT IN ('succeeded', 'running') AND v_mode <> 'preserve' THEN
                        -- A waiting holder, replaced in place (it keeps its id, attempts and parents).
                        UPDATE sluice.jobs j
                           SET kind = p_kind,
                               payload = p_payload,
                               priority = p_priority,
                               run_at = v_run_at,
                               max_attempts = greatest(coalesce(p_max_attempts, q.max_attempts), j.attempt, 1),
                               unique_for_ms = v_for_ms
                         WHERE j.id = v_old.id;
                        IF v_old.state <> 'blocked' THEN
                            PERFORM sluice.notify_ready(p_queue, v_run_at);
                        END IF;
                    END IF;
                    IF p_idempotency_key IS NOT NULL AND v_old.idempotency_key IS NULL THEN
                        -- A retry of this request is answered by this job from now on. The key may have
                        -- been taken by a concurrent request meanwhile: then that request's job answers
                        -- this one (or SL409), on the next round.
                        BEGIN
                            UPDATE sluice.jobs j
                               SET idempotency_key = p_idempotency_key, payload_hash = v_hash,
                                   idempotency_at = now()
                             WHERE j.id = v_old.id AND j.idempotency_key IS NULL;
                        EXCEPTION WHEN unique_violation THEN
                            CONTINUE;
                        END;
                    END IF;
                    id := v_old.id;
                    created := false;
                    RETURN NEXT;
                    RETURN;
                END IF;
            END IF;
            -- The job it conflicted with was deleted or gave its key up meanwhile: try again.
        END LOOP;
    END IF;

    IF v_parents IS NOT NULL THEN
        INSERT INTO sluice.job_dependencies (job_id, parent_id, resolved, any_outcome)
        SELECT v_id, p, NOT (p = ANY (v_open)), p IS NOT DISTINCT FROM v_after FROM unnest(v_parents) p;
        UPDATE sluice.jobs j SET has_dependents = true WHERE j.id = ANY (v_open) AND NOT j.has_dependents;
    END IF;
    IF v_state <> 'cancelled' AND cardinality(v_open) = 0 THEN
        PERFORM sluice.notify_ready(p_queue, v_run_at);
    END IF;
    id := v_id;
    created := true;
    RETURN NEXT;
END;
$$;

-- Why: `uniqueMode: replace` (and `debounce`) against a running holder left the running job alone and
-- created a new one that could start while the old one still ran: two jobs with one key at once, which is
-- what a unique key is for avoiding. Now the new job is queued after the running one: it is `blocked` on
-- it (a dependency with on_parent_failure 'run') and becomes ready the moment the running job finishes,
-- whatever its outcome (succeeded, dead after its last attempt, or cancelled). A running job that is
-- retried later is still not finished, so the new job keeps waiting.
--
-- Only `enqueue_job` changes (same signature, so callers and `sluice.enqueue` are untouched); everything
-- else is as in migrations 0004 and 0005.

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
    v_tries     integer := 0;
    v_mode      text;
    v_run_at    timestamptz := coalesce(p_run_at, now());
    v_for_ms    bigint;
    v_parents   uuid[];
    v_missing   uuid;
    v_open      uuid[];
    v_failed    sluice.jobs;
    v_state     text := 'pending';
    v_error     text;
    v_after     uuid;
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

    IF p_on_parent_failure IS NOT NULL AND p_on_parent_failure NOT IN ('cancel', 'run') THEN
        RAISE EXCEPTION 'on_parent_failure "%": use cancel or run', p_on_parent_failure USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_depends_on) > 0 THEN
        IF p_unique_key IS NOT NULL THEN
            RAISE EXCEPTION 'depends_on and unique_key cannot be combined' USING ERRCODE = '22023';
        END IF;
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
        SELECT array_agg(j.id) INTO v_open FROM sluice.jobs j
         WHERE j.id = ANY (v_parents) AND j.state NOT IN ('succeeded', 'dead', 'cancelled');
        SELECT * INTO v_failed FROM sluice.jobs j
         WHERE j.id = ANY (v_parents) AND j.state IN ('dead', 'cancelled') ORDER BY j.id LIMIT 1;
        IF v_failed.id IS NOT NULL AND p_on_parent_failure IS DISTINCT FROM 'run' THEN
            v_state := 'cancelled';
            v_error := format('cancelled: parent job %s is %s', v_failed.id, v_failed.state);
        ELSIF cardinality(v_open) > 0 THEN
            v_state := 'blocked';
        END IF;
    END IF;

    IF p_unique_key IS NOT NULL THEN
        LOOP
            v_tries := v_tries + 1;
            IF v_tries > 10 THEN
                RAISE EXCEPTION 'unique key "%" is contended', p_unique_key USING ERRCODE = '40001';
            END IF;
            INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at,
                                     unique_key, unique_for_ms, state, blocked_by, on_parent_failure)
            VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                    v_run_at, p_unique_key, v_for_ms,
                    CASE WHEN v_after IS NULL THEN 'pending' ELSE 'blocked' END,
                    CASE WHEN v_after IS NULL THEN 0 ELSE 1 END,
                    CASE WHEN v_after IS NOT NULL THEN 'run' END)
            ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING;
            IF FOUND AND v_after IS NOT NULL THEN
                INSERT INTO sluice.job_dependencies (job_id, parent_id, resolved) VALUES (v_id, v_after, false);
                v_state := 'blocked';
            END IF;
            EXIT WHEN FOUND;
            SELECT * INTO v_old FROM sluice.jobs j
             WHERE j.queue = p_queue AND j.unique_key = p_unique_key
               FOR UPDATE;
            CONTINUE WHEN NOT FOUND; -- the holder was deleted or gave the key up meanwhile: try again
            IF v_old.state IN ('dead', 'cancelled')
               OR (v_old.state = 'succeeded'
                   AND (v_old.unique_for_ms IS NULL
                        OR v_old.finished_at + v_old.unique_for_ms * interval '1 millisecond' <= now())) THEN
                UPDATE sluice.jobs j SET unique_key = NULL WHERE j.id = v_old.id;
                CONTINUE;
            END IF;
            IF v_old.state = 'running' AND v_mode <> 'preserve' THEN
                -- Replacing a running holder: it is left alone and gives the key up; the new job waits
                -- for it (blocked on it, released whatever its outcome) so the two never run at once.
                UPDATE sluice.jobs j SET unique_key = NULL, has_dependents = true WHERE j.id = v_old.id;
                v_after := v_old.id;
                CONTINUE;
            END IF;
            IF v_old.state IN ('succeeded', 'running') OR v_mode = 'preserve' THEN
                id := v_old.id;
                created := false;
                RETURN NEXT;
                RETURN;
            END IF;
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
        INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at, state, blocked_by,
                                 on_parent_failure, finished_at, last_error)
        VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                v_run_at, v_state, CASE WHEN v_state = 'blocked' THEN cardinality(v_open) ELSE 0 END,
                p_on_parent_failure, CASE WHEN v_state = 'cancelled' THEN now() END, v_error);
    ELSE
        v_hash := sha256(convert_to(p_kind || E'\n' || p_payload::text, 'UTF8'));
        LOOP
            v_tries := v_tries + 1;
            IF v_tries > 10 THEN
                RAISE EXCEPTION 'idempotency key "%" is contended', p_idempotency_key
                    USING ERRCODE = '40001';
            END IF;
            INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at,
                                     idempotency_key, payload_hash, state, blocked_by, on_parent_failure,
                                     finished_at, last_error)
            VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                    v_run_at, p_idempotency_key, v_hash, v_state,
                    CASE WHEN v_state = 'blocked' THEN cardinality(v_open) ELSE 0 END,
                    p_on_parent_failure, CASE WHEN v_state = 'cancelled' THEN now() END, v_error)
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
    IF v_parents IS NOT NULL THEN
        INSERT INTO sluice.job_dependencies (job_id, parent_id, resolved)
        SELECT v_id, p, NOT (p = ANY (coalesce(v_open, '{}'))) FROM unnest(v_parents) p;
        UPDATE sluice.jobs j SET has_dependents = true WHERE j.id = ANY (v_open) AND NOT j.has_dependents;
    END IF;
    IF v_state = 'pending' THEN
        PERFORM sluice.notify_ready(p_queue, v_run_at);
    END IF;
    id := v_id;
    created := true;
    RETURN NEXT;
END;
$$;

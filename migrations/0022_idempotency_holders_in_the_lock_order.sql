-- Why: a graph sent again with the same idempotency keys (a retried request) is answered by the jobs
-- those keys find, and its jobs naming such a ref as parent locked that job as each was enqueued, in the
-- graph's order: with C depending on B and D on A < B, the graph locked B, then A, and crossed an
-- enqueue naming A and B (or a heartbeat or finishing batch holding both), which PostgreSQL aborted as
-- a deadlock (40P01). Migration 0021 locked a graph's outside parents and unique keys' holders up front,
-- and an enqueue's parents with its unique key's holder, but not the jobs idempotency keys find. An
-- enqueue whose idempotency key had expired on its holder likewise cleared the key there (a write, so a
-- row lock) after locking its parents.
--
-- Now the holders of the idempotency keys are locked in the same statement, in id order:
-- * `enqueue_graph` locks its outside parents, its unique keys' holders and its idempotency keys'
--   holders before its first job;
-- * `enqueue_job` locks its parents, its unique key's holder and its idempotency key's holder, when it
--   has parents or both keys (a job with neither parents nor both keys writes one existing job at
--   most). A retried request with parents now waits for a transaction holding the job that answers it.
--
-- Physical design: the two functions are replaced with the same signatures; the idempotency holders are
-- looked up in `jobs_idempotency_idx`, the jobs locked by primary key. Behaviour is otherwise that of
-- migration 0021.

-- As migration 0021, with the idempotency key's holder locked together with the parents and the unique
-- key's holder, also when the job has no parents but both keys.
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
    END IF;
    IF cardinality(v_parents) > 0 OR (p_unique_key IS NOT NULL AND p_idempotency_key IS NOT NULL) THEN
        -- Lock the parents, the unique key's holder and the idempotency key's holder (each when there is
        -- one), in one statement in id order (no deadlock with another enqueue, a finishing batch or a
        -- cancel locking some of the same jobs): a completion of a parent waits for this transaction,
        -- then releases this job. The holders are written below (the unique key's locked again
        -- `FOR UPDATE`, an expired idempotency key cleared), which waits for nobody then. A job with
        -- neither parents nor both keys writes one existing job at most, and locks nothing first.
        PERFORM 1 FROM (
SELECT j.id
  FROM sluice.jobs j
 WHERE j.id = ANY (v_parents
                   || ARRAY(SELECT h.id FROM sluice.jobs h
                             WHERE h.queue = p_queue AND h.unique_key = p_unique_key)
                   || ARRAY(SELECT h.id FROM sluice.jobs h
                             WHERE h.queue = p_queue AND h.idempotency_key = p_idempotency_key))
 ORDER BY j.id
   FOR NO KEY UPDATE
        ) locked;
    END IF;
    IF cardinality(v_parents) > 0 THEN
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

-- As migration 0021, with the holders of the graph's idempotency keys locked together with its outside
-- parents and its unique keys' holders.
CREATE OR REPLACE FUNCTION sluice.enqueue_graph(queue text, jobs jsonb)
RETURNS TABLE (ref text, id uuid, created boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    n        integer;
    refs     text[] := '{}';
    ids      uuid[] := '{}';
    made     boolean[] := '{}';
    done     boolean[] := '{}';
    left_    integer;
    progress boolean;
    i        integer;
    j        jsonb;
    dep      text;
    deps     uuid[];
    ready    boolean;
    k        integer;
    v_queue  text := queue;
    v_id     uuid;
    v_made   boolean;
    v_outside uuid[] := '{}';
    v_keys    text[] := '{}';
    v_ikeys   text[] := '{}';
BEGIN
    IF jsonb_typeof(jobs) IS DISTINCT FROM 'array' OR jsonb_array_length(jobs) = 0 THEN
        RAISE EXCEPTION 'jobs: must be a non-empty JSON array' USING ERRCODE = '22023';
    END IF;
    n := jsonb_array_length(jobs);
    IF n > 100 THEN
        RAISE EXCEPTION 'jobs: % jobs is over the graph limit of 100', n USING ERRCODE = '22023';
    END IF;
    FOR i IN 1..n LOOP
        j := jobs -> (i - 1);
        IF jsonb_typeof(j -> 'ref') IS DISTINCT FROM 'string' OR length(j ->> 'ref') = 0 THEN
            RAISE EXCEPTION 'jobs[%].ref: required, a non-empty string', i - 1 USING ERRCODE = '22023';
        END IF;
        IF (j ->> 'ref') = ANY (refs) THEN
            RAISE EXCEPTION 'jobs[%].ref: "%" is used twice', i - 1, j ->> 'ref' USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(coalesce(j -> 'dependsOn', '[]')) <> 'array' THEN
            RAISE EXCEPTION 'jobs[%].dependsOn: must be an array', i - 1 USING ERRCODE = '22023';
        END IF;
        IF j ->> 'uniqueKey' IS NOT NULL THEN
            v_keys := v_keys || (j ->> 'uniqueKey');
        END IF;
        IF j ->> 'idempotencyKey' IS NOT NULL THEN
            v_ikeys := v_ikeys || (j ->> 'idempotencyKey');
        END IF;
        refs := refs || (j ->> 'ref');
        ids := ids || sluice.uuid_v7();
        made := made || false;
        done := done || false;
    END LOOP;
    -- Every dependency is a ref of this call or a job id.
    FOR i IN 1..n LOOP
        FOR dep IN SELECT jsonb_array_elements_text(coalesce(jobs -> (i - 1) -> 'dependsOn', '[]')) LOOP
            IF NOT dep = ANY (refs) AND dep !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
                RAISE EXCEPTION 'jobs[%].dependsOn: "%" is neither a ref of this call nor a job id', i - 1, dep
                    USING ERRCODE = '22023';
            END IF;
            IF NOT dep = ANY (refs) THEN
                v_outside := v_outside || dep::uuid;
            END IF;
        END LOOP;
    END LOOP;
    -- The jobs outside the graph named as parents and the holders of the graph's unique and idempotency
    -- keys, locked in one statement in id order before any job is enqueued. Every existing job a job of
    -- the graph locks or writes below is one of them: a parent outside the graph, a key's holder (locked,
    -- replaced, or clearing an expired key), or a job a key answers, which the graph's children of its
    -- ref then name as parent. Those locks are then locks this call holds already, whatever order the
    -- jobs come in. (A holder that appears after this statement, a concurrent enqueue's, is not here.)
    IF cardinality(v_outside) > 0 OR cardinality(v_keys) > 0 OR cardinality(v_ikeys) > 0 THEN
        PERFORM 1 FROM (
SELECT o.id
  FROM sluice.jobs o
 WHERE o.id = ANY (v_outside
                   || ARRAY(SELECT h.id FROM sluice.jobs h
                             WHERE h.queue = v_queue AND h.unique_key = ANY (v_keys))
                   || ARRAY(SELECT h.id FROM sluice.jobs h
                             WHERE h.queue = v_queue AND h.idempotency_key = ANY (v_ikeys)))
 ORDER BY o.id
   FOR NO KEY UPDATE
        ) locked;
    END IF;
    -- Parents first: each round enqueues every job whose refs are all enqueued; a round that enqueues
    -- nothing while jobs are left means a cycle.
    left_ := n;
    WHILE left_ > 0 LOOP
        progress := false;
        FOR i IN 1..n LOOP
            CONTINUE WHEN done[i];
            j := jobs -> (i - 1);
            ready := true;
            deps := '{}';
            FOR dep IN SELECT jsonb_array_elements_text(coalesce(j -> 'dependsOn', '[]')) LOOP
                k := array_position(refs, dep);
                IF k IS NULL THEN
                    deps := deps || dep::uuid;
                ELSIF done[k] THEN
                    deps := deps || ids[k];
                ELSE
                    ready := false;
                    EXIT;
                END IF;
            END LOOP;
            CONTINUE WHEN NOT ready;
            SELECT e.id, e.created INTO v_id, v_made
              FROM sluice.enqueue_job(
                v_queue, coalesce(j ->> 'kind', 'default'), coalesce(j -> 'payload', 'null'),
                coalesce((j ->> 'priority')::integer, 0), (j ->> 'runAt')::timestamptz,
                (j ->> 'maxAttempts')::integer, j ->> 'idempotencyKey', ids[i],
                j ->> 'uniqueKey', j ->> 'uniqueMode', (j ->> 'uniqueFor')::interval,
                (j ->> 'debounce')::interval, deps, j ->> 'onParentFailure') e;
            ids[i] := v_id;
            made[i] := v_made;
            done[i] := true;
            left_ := left_ - 1;
            progress := true;
        END LOOP;
        IF NOT progress THEN
            RAISE EXCEPTION 'jobs: the dependencies of % form a cycle',
                (SELECT string_agg(format('"%s"', refs[x]), ', ' ORDER BY x)
                   FROM generate_subscripts(refs, 1) x WHERE NOT done[x])
                USING ERRCODE = '22023';
        END IF;
    END LOOP;
    RETURN QUERY SELECT refs[x], ids[x], made[x] FROM generate_subscripts(refs, 1) x ORDER BY x;
END;
$$;

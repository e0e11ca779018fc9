-- Why: an enqueue locks the parents it names in one statement in id order, and a finishing batch locks
-- its jobs and their waiting children the same way (migration 0020), so two of them locking some of the
-- same jobs wait for each other. Three older paths locked several jobs otherwise, and could cross one of
-- them: each side then waited for a job the other held, and PostgreSQL aborted one with a deadlock error
-- (40P01) after `deadlock_timeout`.
--
-- * Releasing children (the `jobs_release_dependents` trigger: a finish, a cancel, a lease rescue or a
--   shutdown release ending a job with dependents) locked each level's children as its update reached
--   them, in the order of its plan: with statistics of a few hundred children, a hash join reading the
--   table in its physical order. A cancel cascade met an enqueue naming two of the children, or a batch
--   finishing another parent of them, in the other order.
-- * `enqueue_graph` locked the parents outside the graph job by job, in the graph's order: a graph
--   naming B for its first job and A < B for its second crossed an enqueue naming A and B.
-- * `enqueue_job` locked a unique key's holder (`FOR UPDATE`) after the job's parents: a job naming A as
--   parent and replacing holder H < A crossed an enqueue naming H and A.
--
-- Now each takes those locks first, in one statement in id order (`ORDER BY id FOR NO KEY UPDATE`), and
-- then writes: each level's children before the level is written; a graph's outside parents together
-- with the current holders of its unique keys before its first job; a job's parents together with its
-- unique key's current holder. The later statements lock the same rows again, which waits for nobody.
-- What remains: a child, a holder or an outside parent that appears after those locks were taken (a
-- concurrent enqueue), and a cascade's deeper levels, which are locked level by level as it reaches
-- them, can still meet another transaction in the other order; the store runs a statement PostgreSQL
-- aborted as a deadlock once more.
--
-- Physical design: the three functions are replaced with the same signatures; each new statement looks
-- its jobs up by primary key (the children in the partial index of unresolved edges, holders in the
-- unique-key index). Behaviour is otherwise that of migrations 0009 and 0010.

-- As migration 0009, with each level's children locked in id order before the level is written.
CREATE OR REPLACE FUNCTION sluice.release_dependents() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_parents       uuid[] := ARRAY[NEW.id];
    v_parent_state  text := NEW.state;
    v_queues        text[];
    v_queue         text;
BEGIN
    WHILE cardinality(v_parents) > 0 LOOP
        -- This level's waiting children, locked in one statement in id order before any is written.
        PERFORM 1 FROM (
SELECT c.id
  FROM sluice.jobs c
 WHERE c.id = ANY (ARRAY(SELECT d.job_id FROM sluice.job_dependencies d
                          WHERE d.parent_id = ANY (v_parents) AND NOT d.resolved))
 ORDER BY c.id
   FOR NO KEY UPDATE
        ) locked;
        WITH edges AS (
            UPDATE sluice.job_dependencies d SET resolved = true
             WHERE d.parent_id = ANY (v_parents) AND NOT d.resolved
            RETURNING d.job_id, d.parent_id, d.any_outcome
        ), per_child AS (
            SELECT e.job_id, count(*)::integer AS n,
                   min(e.parent_id::text) FILTER (WHERE NOT e.any_outcome)::uuid AS parent,
                   v_parent_state <> 'succeeded' AND NOT bool_and(e.any_outcome) AS failed
              FROM edges e GROUP BY e.job_id
        ), released AS (
            UPDATE sluice.jobs c
               SET state = CASE
                       WHEN p.failed AND c.on_parent_failure IS DISTINCT FROM 'run' THEN 'cancelled'
                       WHEN c.blocked_by = p.n THEN 'pending'
                       ELSE 'blocked'
                   END,
                   blocked_by = CASE
                       WHEN p.failed AND c.on_parent_failure IS DISTINCT FROM 'run' THEN 0
                       ELSE c.blocked_by - p.n
                   END,
                   finished_at = CASE
                       WHEN p.failed AND c.on_parent_failure IS DISTINCT FROM 'run' THEN now()
                   END,
                   last_error = CASE
                       WHEN p.failed AND c.on_parent_failure IS DISTINCT FROM 'run'
                       THEN format('cancelled: parent job %s is %s', p.parent, v_parent_state)
                       ELSE c.last_error
                   END,
                   run_at = CASE WHEN c.blocked_by = p.n THEN greatest(c.run_at, now()) ELSE c.run_at END
              FROM per_child p
             WHERE c.id = p.job_id AND c.state = 'blocked'
            RETURNING c.id, c.queue, c.state, c.has_dependents
        )
        SELECT coalesce(array_agg(DISTINCT r.queue) FILTER (WHERE r.state = 'pending'), '{}'),
               coalesce(array_agg(r.id) FILTER (WHERE r.state = 'cancelled' AND r.has_dependents), '{}')
          INTO v_queues, v_parents
          FROM released r;
        FOREACH v_queue IN ARRAY v_queues LOOP
            PERFORM sluice.notify_ready(v_queue, now());
        END LOOP;
        v_parent_state := 'cancelled';
    END LOOP;
    RETURN NULL;
END;
$$;

-- As migration 0010, with the parents and the unique key's holder locked together in id order.
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
        -- Lock the parents, and the unique key's holder when there is one, in one statement in id order
        -- (no deadlock with another enqueue, a finishing batch or a cancel locking some of the same
        -- jobs): a completion of one of them waits for this transaction, then releases this job. The
        -- holder is locked again `FOR UPDATE` below, which waits for nobody then.
        PERFORM 1 FROM (
SELECT j.id
  FROM sluice.jobs j
 WHERE j.id = ANY (v_parents || ARRAY(SELECT h.id FROM sluice.jobs h
                                       WHERE h.queue = p_queue AND h.unique_key = p_unique_key))
 ORDER BY j.id
   FOR NO KEY UPDATE
        ) locked;
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

-- As migration 0009, with the outside parents and the unique keys' holders locked together in id order
-- before the first job (the rules are at the function in migration 0009).
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
    -- The jobs outside the graph named as parents and the holders of the graph's unique keys, locked in
    -- one statement in id order before any job is enqueued: each job's own locks below (its parents, its
    -- key's holder) are then locks this call holds already, whatever order the jobs come in.
    IF cardinality(v_outside) > 0 OR cardinality(v_keys) > 0 THEN
        PERFORM 1 FROM (
SELECT o.id
  FROM sluice.jobs o
 WHERE o.id = ANY (v_outside || ARRAY(SELECT h.id FROM sluice.jobs h
                                       WHERE h.queue = v_queue AND h.unique_key = ANY (v_keys)))
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

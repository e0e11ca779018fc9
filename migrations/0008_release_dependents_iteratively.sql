-- Why: a failed or cancelled parent cancelled its children with an UPDATE that fired this trigger again
-- for each child with children of its own, one nested trigger call per level: a chain of a few hundred
-- dependent jobs (about 650 with PostgreSQL's default max_stack_depth of 2 MB) ended in "stack depth limit
-- exceeded", and the statement that finished the chain's root failed with it on every retry.
--
-- Now the top-level call walks the cascade itself, level by level, in a loop: each level resolves the
-- edges from the jobs the previous level cancelled, and the trigger no longer fires for updates made from
-- inside a trigger (`pg_trigger_depth() = 0` in its WHEN), so the depth stays one whatever the chain's
-- length. What happens to each child is unchanged (migration 0005): a failed parent cancels it, naming the
-- parent, unless `on_parent_failure` is 'run' (then that parent counts as finished); its last open parent
-- makes it ready, with a NOTIFY.

CREATE OR REPLACE FUNCTION sluice.release_dependents() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_parents       uuid[] := ARRAY[NEW.id];
    v_parent_state  text := NEW.state;
    v_queues        text[];
    v_queue         text;
BEGIN
    WHILE cardinality(v_parents) > 0 LOOP
        WITH edges AS (
            UPDATE sluice.job_dependencies d SET resolved = true
             WHERE d.parent_id = ANY (v_parents) AND NOT d.resolved
            RETURNING d.job_id, d.parent_id
        ), per_child AS (
            SELECT e.job_id, count(*)::integer AS n, min(e.parent_id::text)::uuid AS parent
              FROM edges e GROUP BY e.job_id
        ), released AS (
            UPDATE sluice.jobs c
               SET state = CASE
                       WHEN v_parent_state <> 'succeeded' AND c.on_parent_failure IS DISTINCT FROM 'run'
                       THEN 'cancelled'
                       WHEN c.blocked_by = p.n THEN 'pending'
                       ELSE 'blocked'
                   END,
                   blocked_by = CASE
                       WHEN v_parent_state <> 'succeeded' AND c.on_parent_failure IS DISTINCT FROM 'run' THEN 0
                       ELSE c.blocked_by - p.n
                   END,
                   finished_at = CASE
                       WHEN v_parent_state <> 'succeeded' AND c.on_parent_failure IS DISTINCT FROM 'run'
                       THEN now()
                   END,
                   last_error = CASE
                       WHEN v_parent_state <> 'succeeded' AND c.on_parent_failure IS DISTINCT FROM 'run'
                       THEN format('cancelled: parent job %s is %s', p.parent, v_parent_state)
                       ELSE c.last_error
                   END,
                   run_at = CASE WHEN c.blocked_by = p.n THEN greatest(c.run_at, now()) ELSE c.run_at END
              FROM per_child p
             WHERE c.id = p.job_id AND c.state = 'blocked'
            RETURNING c.id, c.queue, c.state, c.has_dependents
        )
        -- The queues with a job made ready, and the next level: the children this one cancelled that have
        -- children of their own.
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

DROP TRIGGER jobs_release_dependents ON sluice.jobs;
CREATE TRIGGER jobs_release_dependents
    AFTER UPDATE OF state ON sluice.jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND NEW.state IN ('succeeded', 'dead', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state AND pg_trigger_depth() = 0)
    EXECUTE FUNCTION sluice.release_dependents();

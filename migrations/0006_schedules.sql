-- Why: periodic jobs (cron schedules) must make exactly one job per schedule per fire time, however many
-- workers run the scheduler and across restarts, and none for the time no scheduler ran unless the
-- schedule asks for catch-up (see docs/queue.md, "Periodic jobs").
--
-- One row per schedule records up to when its fire times have been handled (`handled_until`). A
-- scheduler locks the row (FOR UPDATE SKIP LOCKED: a row another worker holds is being handled now),
-- enqueues the fire times between `handled_until` and the database's now(), and moves `handled_until`
-- to now(), all in one transaction: a fire time is enqueued exactly when the watermark passes it.
-- PostgreSQL decides, not a lease in a worker's memory. A new schedule's row starts at its creation, so
-- it never catches up on times before it existed.
CREATE TABLE sluice.schedules (
    queue          text NOT NULL,
    name           text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$'),
    -- Every fire time up to here has been handled (enqueued, or skipped as missed).
    handled_until  timestamptz NOT NULL,
    -- The latest fire time a job was enqueued for, and that job.
    last_fire_at   timestamptz,
    last_job_id    uuid,
    -- The next fire time after `handled_until`, when the scheduler last looked.
    next_fire_at   timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, name)
);

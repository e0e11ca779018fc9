-- Why: the depth every worker and the operator read every few seconds counts dead jobs per queue. Without
-- an index of its own that count walked every finished job of the queue (succeeded and cancelled ones
-- too, kept until retention deletes them), so its cost grew with the queue's history. Dead jobs are few,
-- and this index holds only them.
--
-- A plain CREATE INDEX, inside the migration's transaction: it holds writes to sluice.jobs while it
-- builds (about 0.1 s per million rows measured here). CONCURRENTLY would not block them, but it waits
-- for every older snapshot, including a second migrator's session waiting on the migration lock this one
-- holds: a deadlock whenever two workers start at once.
CREATE INDEX IF NOT EXISTS jobs_dead_idx ON sluice.jobs (queue) WHERE state = 'dead';

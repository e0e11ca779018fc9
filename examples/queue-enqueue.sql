-- Enqueueing from SQL, inside the app's own transaction: the job exists exactly when it commits.
-- Schema: `sluice-sidecar migrate --database-url $DATABASE_URL` (the operator and workers also apply it).

SELECT sluice.create_queue('emails', max_attempts => 10, lease_ms => 30000);

BEGIN;
INSERT INTO users (email) VALUES ('a@example.com');
SELECT sluice.enqueue('emails', '{"to": "a@example.com"}', kind => 'welcome',
                      idempotency_key => 'welcome-a@example.com');
COMMIT;

-- Later, scheduled and prioritised:
SELECT sluice.enqueue('emails', '{"to": "a@example.com"}', kind => 'nudge',
                      priority => -5, run_at => now() + interval '3 days');

-- Many at once (one statement):
SELECT sluice.enqueue_many('emails',
                           ARRAY['{"to": "b@example.com"}', '{"to": "c@example.com"}']::jsonb[],
                           ARRAY['digest']);

-- What autoscaling reads (ready + running):
SELECT name, (SELECT count(*) FROM sluice.jobs j WHERE j.queue = q.name AND j.state = 'running') AS running
  FROM sluice.queues q;

-- Why: the operator provisioned a namespace's tenant under `pg_advisory_xact_lock` on a key anyone can
-- compute from the namespace's name. Any login of the database, another namespace's tenant included,
-- could take that advisory lock and keep it, and the namespace's provisioning then timed out forever.
--
-- Provisioning now locks the namespace's row of this table (an upsert, which takes the row's lock),
-- and the table is the schema owner's alone: locking a row needs UPDATE on it, which neither PUBLIC
-- nor the tenants have (only the owner, its members, roles granted pg_write_all_data and superusers).
-- A row is a namespace's name only; it is made the first time the namespace's tenant is provisioned,
-- and kept.

CREATE TABLE sluice.tenant_locks (
    namespace text PRIMARY KEY
);
REVOKE ALL ON sluice.tenant_locks FROM PUBLIC;

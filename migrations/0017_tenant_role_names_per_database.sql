-- Why: a tenant role is a name for the whole PostgreSQL server, but tenants are registered per database
-- (`sluice.tenants`). The operator named every namespace's role `sluice_ns_<namespace>`, the same in every
-- database of a server: a namespace with queues in two databases of one server got its tenant in the
-- first only (in the second the role existed and was no tenant there: SL409), and the owner of any other
-- database of the server, given CREATEROLE, could create that name first and so deny the namespace its
-- tenant.
--
-- The database now holds a random key, made once here, which the operator mixes into the names of the
-- tenant roles it makes (`sluice_<10 hex digits of a hash of the key and the namespace>_<namespace>`):
-- nobody outside this database can know such a name before its role exists. The hash covers the
-- namespace too, because role names are visible to every login of the server (`pg_roles`): one tenant's
-- name tells nothing about the names of tenants not made yet. The key is the schema owner's alone (and a
-- superuser's): not PUBLIC's, not the tenants' (they have no use for it, and one that could read it
-- could tell others the names of roles to come). Tenants registered already keep their roles whatever
-- their names: the operator uses the role `sluice.tenants` has for a namespace and names only new ones.

CREATE TABLE sluice.tenant_naming (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    -- 122 random bits from the server's strong random source.
    key      uuid NOT NULL DEFAULT gen_random_uuid()
);
INSERT INTO sluice.tenant_naming DEFAULT VALUES;
REVOKE ALL ON sluice.tenant_naming FROM PUBLIC;

-- Why: when a QueueDatabase stops admitting a namespace (its selector or the namespace's labels
-- change, or the QueueDatabase is deleted), the namespace's tenant role kept LOGIN and its sessions. The
-- operator now revokes it from this database's own records, never from objects the namespace controls
-- (its JobQueues, its Secrets), which the namespace could delete, relabel or point elsewhere first.
--
-- What:
-- - `sluice.tenant_admissions`: which QueueDatabase admitted which namespace of this database. The
--   operator writes a row when it provisions a namespace's tenant for a QueueDatabase (in the
--   provisioning transaction) and for every registered namespace the QueueDatabase admits (also one
--   with a Secret of its own or a tenant an admin registered by hand); it revokes only namespaces a
--   QueueDatabase admitted once, never one it never admitted. A revocation marks the row
--   (`revoked_at`) in the transaction that takes LOGIN, under the namespace's provisioning lock, and
--   provisioning through that QueueDatabase refuses the namespace while the mark is there: a JobQueue
--   reconcile that read the namespace as admitted before the revocation cannot give LOGIN back after
--   it. Only the QueueDatabase's own pass that finds the namespace admitted again clears the mark.
--   `revocation_complete` says the sessions and Secrets went too (until then every pass tries again).
--   The owner's alone: no tenant reads it. Deleting a namespace's row of `sluice.tenants` deletes its
--   rows (a trigger): a namespace of that name registered later starts with none.
-- - `sluice.queue_databases`: the QueueDatabases provisioning went through, by uid (a QueueDatabase
--   deleted and made again under its name is another one), and when each was retired (it is being
--   deleted). Provisioning through a QueueDatabase holds its row (`FOR SHARE`, made the first time)
--   from its check until it commits, and refuses a retired one; retiring it updates the row, which
--   waits for the provisionings under way to commit, so no admission is recorded after the
--   revocation that is to sweep it (the object is gone after that, and nothing would). Only
--   provisionings through that QueueDatabase can delay its retirement. A row per QueueDatabase ever
--   used; the owner's alone.
-- - `sluice.revoke_tenant_login(role, namespace)`: NOLOGIN for the namespace's registered tenant, in
--   its own transaction, so it is committed whatever happens to the sessions. It refuses only what
--   could hurt someone else: a role not registered for that namespace, the calling login, a superuser.
--   A role owning objects (a large object, a temporary table) is revoked all the same: revoking only
--   removes rights. Returns whether the role exists.
-- - `sluice.end_tenant_sessions(role, namespace)`: terminates the role's sessions and returns how many.
--   Signalling a backend needs the rights of its role, which the owner has only as a member: it is
--   made a member for the call (when it is not one that may SET ROLE already), acts as the tenant with
--   SET ROLE (allowed to a NOINHERIT member too, which inherits no rights), then acts as the caller's
--   current role again (the role a caller SET ROLE to, not its login) and the membership it made is
--   revoked from that role before returning; an error rolls the membership back with the rest. Called after the
--   NOLOGIN committed, so its failure leaves the role unable to log in.
--
-- Physical design: the functions (and the trigger's) pin `search_path`, are not SECURITY DEFINER (the two
-- above need the owner's CREATEROLE, which the caller has), and are the owner's to execute.

CREATE TABLE sluice.tenant_admissions (
    namespace text NOT NULL,
    queue_database text NOT NULL,
    admitted_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    revocation_complete boolean NOT NULL DEFAULT false,
    PRIMARY KEY (namespace, queue_database)
);

REVOKE ALL ON sluice.tenant_admissions FROM PUBLIC;

-- A namespace's registration deleted (a namespace deleted for good, its role dropped) takes its
-- admissions with it: a namespace of that name registered later is a new tenant, which the old one's
-- marks must neither refuse nor count as revoked. On the DELETE, not on a later INSERT, so that a
-- data-only restore of the tables keeps what it restores.
CREATE FUNCTION sluice.tenant_unregistered() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM sluice.tenant_admissions a WHERE a.namespace OPERATOR(pg_catalog.=) OLD.namespace;
    RETURN NULL;
END;
$$;

REVOKE EXECUTE ON FUNCTION sluice.tenant_unregistered() FROM PUBLIC;

CREATE TRIGGER tenant_unregistered AFTER DELETE ON sluice.tenants
    FOR EACH ROW EXECUTE FUNCTION sluice.tenant_unregistered();

CREATE TABLE sluice.queue_databases (
    uid text PRIMARY KEY,
    name text NOT NULL,
    retired_at timestamptz
);

REVOKE ALL ON sluice.queue_databases FROM PUBLIC;

-- What both functions below refuse: a role not registered as that namespace's tenant, or the login
-- calling (`p_refusal` and `p_self` end the messages). The role's oid; NULL when it no longer exists.
CREATE FUNCTION sluice.revocable_tenant(p_role text, p_namespace text, p_refusal text, p_self text)
RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM sluice.tenants t
                   WHERE t.role_name OPERATOR(pg_catalog.=) p_role
                     AND t.namespace OPERATOR(pg_catalog.=) p_namespace) THEN
        RAISE EXCEPTION 'role "%" is not the registered tenant of namespace "%"; %', p_role, p_namespace, p_refusal
            USING ERRCODE = 'SL409';
    END IF;
    IF p_role OPERATOR(pg_catalog.=) current_user OR p_role OPERATOR(pg_catalog.=) session_user THEN
        RAISE EXCEPTION 'role "%" is the login revoking tenants; %', p_role, p_self
            USING ERRCODE = 'SL409';
    END IF;
    RETURN (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) p_role);
END;
$$;

REVOKE EXECUTE ON FUNCTION sluice.revocable_tenant(text, text, text, text) FROM PUBLIC;

CREATE FUNCTION sluice.revoke_tenant_login(p_role text, p_namespace text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_oid oid;
BEGIN
    v_oid := sluice.revocable_tenant(p_role, p_namespace, 'not revoking it', 'not revoking itself');
    IF v_oid IS NULL THEN
        RETURN false;
    END IF;
    IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) v_oid) THEN
        RAISE EXCEPTION 'role "%" is a superuser; a tenant is none and only a superuser may alter it', p_role
            USING ERRCODE = 'SL409';
    END IF;
    EXECUTE pg_catalog.format('ALTER ROLE %I WITH NOLOGIN', p_role);
    RETURN true;
END;
$$;

REVOKE EXECUTE ON FUNCTION sluice.revoke_tenant_login(text, text) FROM PUBLIC;

CREATE FUNCTION sluice.end_tenant_sessions(p_role text, p_namespace text) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_oid oid;
    v_pids integer[];
    v_pid integer;
    v_member boolean;
    v_ended integer := 0;
    -- The role the caller acts as (its login, or a role it SET ROLE to): made the member, and acted as
    -- again afterwards. RESET ROLE would switch to the login instead, and revoke from the wrong role.
    v_caller text := current_user;
BEGIN
    v_oid := sluice.revocable_tenant(p_role, p_namespace, 'not ending its sessions',
                                     'not ending its own sessions');
    IF v_oid IS NULL THEN
        RETURN 0;
    END IF;
    SELECT pg_catalog.array_agg(a.pid) INTO v_pids
      FROM pg_catalog.pg_stat_activity a
     WHERE a.usesysid OPERATOR(pg_catalog.=) v_oid
       AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid();
    IF v_pids IS NULL THEN
        RETURN 0;
    END IF;
    -- PostgreSQL 16 records whether a member may SET ROLE; older releases let every member (the column
    -- is absent: NULL, counted as may).
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                   WHERE m.roleid OPERATOR(pg_catalog.=) v_oid
                     AND m.member OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r
                                                          WHERE r.rolname OPERATOR(pg_catalog.=) v_caller)
                     AND ((pg_catalog.to_jsonb(m) OPERATOR(pg_catalog.->>) 'set_option')::boolean IS NOT FALSE))
      INTO v_member;
    IF NOT v_member THEN
        EXECUTE pg_catalog.format('GRANT %I TO %I', p_role, v_caller);
    END IF;
    EXECUTE pg_catalog.format('SET LOCAL ROLE %I', p_role);
    FOREACH v_pid IN ARRAY v_pids LOOP
        IF pg_catalog.pg_terminate_backend(v_pid) THEN
            v_ended := v_ended OPERATOR(pg_catalog.+) 1;
        END IF;
    END LOOP;
    EXECUTE pg_catalog.format('SET LOCAL ROLE %I', v_caller);
    IF NOT v_member THEN
        EXECUTE pg_catalog.format('REVOKE %I FROM %I', p_role, v_caller);
    END IF;
    RETURN v_ended;
END;
$$;

REVOKE EXECUTE ON FUNCTION sluice.end_tenant_sessions(text, text) FROM PUBLIC;

-- Why: since migration 0026 `sluice.ensure_tenant` altered an existing tenant role naming only LOGIN,
-- NOINHERIT, the password and, when the role had CREATEDB as it read it, NOCREATEDB, and relied on the
-- checks it ran before (migration 0018) for the attributes it no longer named. Those checks and the
-- ALTER are separate statements: an `ALTER ROLE tenant BYPASSRLS` (or SUPERUSER, CREATEROLE,
-- REPLICATION, CREATEDB) committed by a superuser or CREATEROLE login between them went through, and
-- the tenant was registered again, its password reset and its grants given, with the attribute kept.
-- Before 0026 a superuser owner's ALTER named every NO* attribute and so reset them in the same
-- statement. And on PostgreSQL 16 a CREATEROLE owner without CREATEDB may not name NOCREATEDB: a
-- tenant given CREATEDB made provisioning fail with a bare permission error.
--
-- What: the ALTER names what the login running it may change, chosen by that login's capability and
-- not by the role's state as read earlier: a superuser names NOSUPERUSER NOCREATEDB NOCREATEROLE
-- NOREPLICATION NOBYPASSRLS (as before 0026); any other login names NOCREATEDB when it may change
-- CREATEDB (it has CREATEDB, or the server is older than 16, where CREATEROLE is enough). After the
-- ALTER the function reads the role's attributes again and raises SL409, naming them and what to do,
-- when any a tenant must not have is set. The ALTER has written and locked the role's row of pg_authid,
-- so a change of its attributes committed after that read waits for this transaction: none slips in
-- between any more. Its ownership and memberships are checked after the ALTER too (they are not in that
-- row: a GRANT committed between this check and the commit still goes through).
-- The password stays out of every error, as in migrations 0015, 0018 and 0026.
--
-- Physical design: the function is replaced with the same signature and body as in migration 0026 but
-- for the ALTER and the check after it, its `search_path` pinned as migration 0025 pinned it, EXECUTE
-- the owner's alone. None of `sluice`'s functions is SECURITY DEFINER; this one is not either.

CREATE OR REPLACE FUNCTION sluice.ensure_tenant(p_role text, p_namespace text, p_password text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state text;
    v_message text;
    v_detail text;
    v_hint text;
    v_memberships text;
    v_members text;
    v_oid oid;
    v_owner_super boolean;
    v_owner_createdb boolean;
    v_kept text;
BEGIN
    IF EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.namespace = p_namespace AND t.role_name <> p_role) THEN
        RAISE EXCEPTION 'namespace "%" has a tenant role other than "%" already', p_namespace, p_role
            USING ERRCODE = 'SL409';
    END IF;
    IF EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.role_name = p_role AND t.namespace <> p_namespace) THEN
        RAISE EXCEPTION 'role "%" is the tenant of another namespace; not moving it to "%"', p_role, p_namespace
            USING ERRCODE = 'SL409';
    END IF;
    IF p_role = current_user OR p_role = session_user THEN
        RAISE EXCEPTION 'role "%" is the login making tenants; a tenant must be a role of its own', p_role
            USING ERRCODE = 'SL409';
    END IF;
    SELECT r.oid INTO v_oid FROM pg_roles r WHERE r.rolname = p_role;
    IF v_oid IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.role_name = p_role) THEN
        RAISE EXCEPTION 'role "%" exists and is no Sluice tenant; not taking it over', p_role
            USING ERRCODE = 'SL409';
    END IF;
    IF v_oid IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_roles r
                   WHERE r.oid = v_oid
                     AND (r.rolsuper OR r.rolcreaterole OR r.rolbypassrls OR r.rolreplication)) THEN
            RAISE EXCEPTION 'role "%" is a superuser or has CREATEROLE, BYPASSRLS or REPLICATION; a tenant has none of them: register a role of its own for the namespace', p_role
                USING ERRCODE = 'SL409';
        END IF;
    END IF;
    BEGIN
        -- An existing role is altered naming the attributes the login running this may change: a
        -- superuser all of them; another login NOCREATEDB when it may change CREATEDB (PostgreSQL 16
        -- wants CREATEDB for that, older releases CREATEROLE). Naming NOSUPERUSER, NOREPLICATION or
        -- NOBYPASSRLS at all needs a superuser. What is left unnamed is checked after the ALTER.
        IF v_oid IS NOT NULL THEN
            SELECT r.rolsuper,
                   r.rolcreatedb OR current_setting('server_version_num')::integer < 160000
              INTO v_owner_super, v_owner_createdb
              FROM pg_roles r WHERE r.rolname = current_user;
            EXECUTE format('ALTER ROLE %I WITH LOGIN NOINHERIT%s PASSWORD %L',
                           p_role,
                           CASE WHEN v_owner_super
                                THEN ' NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS'
                                WHEN v_owner_createdb THEN ' NOCREATEDB' ELSE '' END,
                           p_password);
        ELSE
            EXECUTE format('CREATE ROLE %I WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS PASSWORD %L',
                           p_role, p_password);
        END IF;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
        -- RAISE refuses a NULL option, and an empty one would show as an empty line.
        IF v_detail <> '' AND v_hint <> '' THEN
            RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message, DETAIL = v_detail, HINT = v_hint;
        ELSIF v_detail <> '' THEN
            RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message, DETAIL = v_detail;
        ELSIF v_hint <> '' THEN
            RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message, HINT = v_hint;
        ELSE
            RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message;
        END IF;
    END;
    -- The role's attributes as they are now: the ALTER (or CREATE) above wrote and locked its row, so a
    -- change committed after this read waits for this transaction.
    SELECT concat_ws(', ',
                     CASE WHEN r.rolsuper THEN 'SUPERUSER' END,
                     CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END,
                     CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END,
                     CASE WHEN r.rolreplication THEN 'REPLICATION' END,
                     CASE WHEN r.rolcreatedb THEN 'CREATEDB' END)
      INTO v_kept
      FROM pg_roles r WHERE r.rolname = p_role;
    IF v_kept IS DISTINCT FROM '' THEN
        RAISE EXCEPTION 'role "%" has %, which a tenant must not have and this login cannot take away: have a superuser run ALTER ROLE % NOSUPERUSER NOCREATEROLE NOBYPASSRLS NOREPLICATION NOCREATEDB, then provision it again',
                        p_role, v_kept, quote_ident(p_role)
            USING ERRCODE = 'SL409';
    END IF;
    -- Ownership and memberships are checked here, after the ALTER, not before it: a GRANT or an
    -- ownership change does not touch the role's row of pg_authid, so the ALTER's lock does not hold it
    -- back, and one committed between an earlier check and the ALTER went through. Checked now, only
    -- one committed between this read and the commit can (a narrower window, open to the same trusted
    -- logins only: a superuser, a CREATEROLE login, the owner).
    IF v_oid IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_shdepend d
                   WHERE d.refclassid = 'pg_authid'::regclass AND d.refobjid = v_oid AND d.deptype = 'o'
                     AND d.dbid IN (0, (SELECT oid FROM pg_database WHERE datname = current_database())))
           OR EXISTS (SELECT 1 FROM pg_class c WHERE c.relowner = v_oid)
           OR EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspowner = v_oid)
           OR EXISTS (SELECT 1 FROM pg_proc p WHERE p.proowner = v_oid) THEN
            RAISE EXCEPTION 'role "%" owns objects (see \dp, \dn and \df, or pg_shdepend); the owner of a table is not limited by row-level security: register a role of its own for the namespace', p_role
                USING ERRCODE = 'SL409';
        END IF;
        -- PostgreSQL 16 records whether a member may SET ROLE to the role and inherits its rights; in
        -- older releases every member may SET ROLE (the columns are absent: NULL, counted as may).
        SELECT string_agg(quote_ident(r.rolname), ', ' ORDER BY r.rolname) INTO v_members
        FROM pg_auth_members m
        JOIN pg_roles r ON r.oid = m.member
        WHERE m.roleid = v_oid
          AND r.rolname <> current_user
          AND ((to_jsonb(m) ->> 'set_option')::boolean IS NOT FALSE
               OR (to_jsonb(m) ->> 'inherit_option')::boolean IS NOT FALSE);
        IF v_members IS NOT NULL THEN
            RAISE EXCEPTION 'role "%" has members (%) that could act as the tenant: revoke the membership first (REVOKE % FROM %)',
                            p_role, v_members, quote_ident(p_role), v_members
                USING ERRCODE = 'SL409';
        END IF;
    END IF;
    SELECT string_agg(quote_ident(g.rolname), ', ' ORDER BY g.rolname) INTO v_memberships
    FROM pg_auth_members m
    JOIN pg_roles r ON r.oid = m.member
    JOIN pg_roles g ON g.oid = m.roleid
    WHERE r.rolname = p_role;
    IF v_memberships IS NOT NULL THEN
        RAISE EXCEPTION 'role "%" is a member of %; a tenant could SET ROLE out of row-level security: revoke the membership first (REVOKE % FROM %)',
                        p_role, v_memberships, v_memberships, quote_ident(p_role)
            USING ERRCODE = 'SL409';
    END IF;
    INSERT INTO sluice.tenants (role_name, namespace) VALUES (p_role, p_namespace)
    ON CONFLICT (role_name) DO NOTHING;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), p_role);
    EXECUTE format('GRANT USAGE ON SCHEMA sluice TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON sluice.jobs, sluice.queues, sluice.schedules, '
                   'sluice.job_dependencies, sluice.event_subscriptions TO %I', p_role);
    EXECUTE format('GRANT SELECT ON sluice._sqlx_migrations, sluice.tenants TO %I', p_role);
END;
$$;

REVOKE EXECUTE ON FUNCTION sluice.ensure_tenant(text, text, text) FROM PUBLIC;

-- Migration 0001's CHECK on `sluice.queues.backoff_multiplier` compares a double precision with an
-- integer, for which pg_catalog has no operator of exactly those types: a `public.>=(double precision,
-- integer)` that a role able to create in `public` planted before the first migration was bound into
-- the constraint for good, and ran as every writer of `sluice.queues` (the operator's login among them).
-- The constraint is made again comparing two doubles with pg_catalog's operator, named.
ALTER TABLE sluice.queues
    DROP CONSTRAINT queues_backoff_multiplier_check,
    ADD CONSTRAINT queues_backoff_multiplier_check
        CHECK (backoff_multiplier OPERATOR(pg_catalog.>=) 1::double precision);

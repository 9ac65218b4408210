-- The lockkit schema for PostgreSQL, version 1.
--
-- lockkit creates it on first use when its role may create a schema in the database. Where it
-- may not, a DBA runs this file once (`psql -v ON_ERROR_STOP=1 -f schema.sql DBNAME`) and grants
-- the lock role what `grants.sql` lists: USAGE on the schema, SELECT on the version, EXECUTE on
-- the functions. The tables are reached only through the functions (SECURITY DEFINER), so the
-- lock role can neither read the owner digests nor write a row by hand.
--
-- The design, and why it holds (lockkit-postgres's crate documentation has the long form):
-- * Every acquisition of a key is a row of `entries`, queued by `seq`, a number from the
--   sequence `fence`. One rule (`lockkit.grant_ready`) grants a row when what is ahead of it
--   allows: nothing ahead for a mutex or a writer, no writer ahead for a reader, fewer than
--   `permits` rows ahead for a permit. So grants go in queue order, and `seq` is the grant's
--   fencing token: a grant's rows ahead were all granted before it, with smaller numbers.
-- * An attempt, a release and a broken lock take a transaction-scoped advisory lock on the
--   key first (released by their commit, so it works behind PgBouncer's transaction pooling,
--   and a crash cannot leave it behind), and then run the rule: it deletes the key's expired
--   rows and grants every row that may now hold. They refuse to run unless the transaction
--   is READ COMMITTED (each statement then sees every commit before the lock). Nothing
--   depends on a session's state. (The sweep deletes only rows expired for a minute, which
--   no rule counts, without the lock.)
-- * A row lives until `expires_at`, on the server's clock; renewals move it. A waiter's row
--   is refreshed by its attempts.
-- * Grants and renewals commit with `synchronous_commit = on`, whatever the server's default:
--   a reply (or a hand-over's notification, sent after the commit) says the row is on disk,
--   and on the synchronous standbys where there are any. Nothing else waits for the disk: a
--   lost release only keeps a lock held until its TTL, a lost queued row only a place in the
--   queue, and the sequence cannot go back past a grant, whose commit flushed it.
-- * The channel of a key (`lockkit.channel`; the key is `<kind>/<namespace>/<name>`) says
--   `h <seq> <proof> <key>` when a statement grants somebody else's row (a hand-over: the
--   waiter needs no attempt), `proof` being 128 bits of SHA-256 over the row's owner digest
--   and number, which only who has the owner digest can make: the server and the owner
--   (anybody may NOTIFY). For an election's observers it says `g <seq> <key>` when a leader
--   proclaims and `r <seq> <key>` when a leader that proclaimed is released or broken (an
--   expiry says nothing: observers see it at their next read).

CREATE SCHEMA IF NOT EXISTS lockkit;

CREATE TABLE IF NOT EXISTS lockkit.schema_version (
    version integer NOT NULL
);
INSERT INTO lockkit.schema_version (version)
SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM lockkit.schema_version);

CREATE SEQUENCE IF NOT EXISTS lockkit.fence AS bigint;

CREATE TABLE IF NOT EXISTS lockkit.entries (
    namespace text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,
    -- 0 mutex (and election), 1 semaphore, 2 read-write lock: independent locks of one name.
    kind smallint NOT NULL,
    -- The row's place in the key's queue, and the fencing token of its grant.
    seq bigint NOT NULL,
    -- SHA-256 of the owner token (its first 128 bits, in hex): never the token itself.
    owner text NOT NULL UNIQUE,
    -- 0 exclusive, 1 permit, 2 read, 3 write.
    hold smallint NOT NULL,
    permits integer NOT NULL,
    expires_at timestamptz NOT NULL,
    granted boolean NOT NULL,
    -- What an election's leader proclaimed.
    value text,
    PRIMARY KEY (namespace, name, kind, seq)
);

-- The notification channel of a key `<kind>/<namespace>/<name>`: `lockkit_` and the first
-- 128 bits of its SHA-256, in hex (a channel name is at most 63 bytes; a key is longer).
-- (The helpers from here to `attempt` run with the rights and the search path of their
-- caller, the functions below: a `SET search_path` of their own would cost every call a
-- configuration change. A lock role may call them too, with no rights but its own: a rule
-- that cannot read the table, a NOTIFY it could send anyway. They are PL/pgSQL, whose plans a
-- session keeps, where a plain SQL function would be planned again at each call.)
CREATE OR REPLACE FUNCTION lockkit.channel(p_key text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'lockkit_' || pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(p_key, 'UTF8')), 'hex'), 32);

-- Notifies the channel of the key of `p_row`: `p_what` and the key (see the header).
CREATE OR REPLACE FUNCTION lockkit.notify(p_row lockkit.entries, p_what text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_key text := p_row.kind || '/' || p_row.namespace || '/' || p_row.name;
BEGIN
    PERFORM pg_catalog.pg_notify(lockkit.channel(v_key), p_what || ' ' || v_key);
END
$$;

-- Refuses to run a queue's statement in a transaction that sees less than every commit
-- before its advisory lock: under REPEATABLE READ or SERIALIZABLE (a role's or a database's
-- `default_transaction_isolation`) the snapshot is taken before the lock is waited for, and
-- two attempts could both find the key free.
CREATE OR REPLACE FUNCTION lockkit.require_read_committed()
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'lockkit needs READ COMMITTED, not %', pg_catalog.current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'set default_transaction_isolation to ''read committed'' for the lock role';
    END IF;
END
$$;

-- The one rule of every kind, run under the key's advisory lock: deletes the key's expired
-- rows, then grants every queued row that what is ahead of it now allows (nothing ahead for
-- a mutex or a writer, no writer ahead for a reader, fewer rows ahead than its permits for a
-- permit), and returns them. Grants go in queue order: a row is granted only with everything
-- ahead of it granted before. A grant keeps the row's expiry, set by its owner's last
-- attempt: the owner counts its validity from that attempt too, and a waiter that died
-- holds the key no longer than its row would have lived.
CREATE OR REPLACE FUNCTION lockkit.grant_ready(p_namespace text, p_name text, p_kind smallint, p_now timestamptz)
RETURNS SETOF lockkit.entries
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM lockkit.entries e
     WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = p_kind
       AND e.expires_at <= p_now;
    RETURN QUERY
    WITH queue AS (
        SELECT e.owner, e.granted, e.hold, e.permits,
               count(*) OVER ahead AS rows_ahead,
               count(*) FILTER (WHERE e.hold = 3) OVER ahead AS writers_ahead
          FROM lockkit.entries e
         WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = p_kind
           AND e.expires_at > p_now
        WINDOW ahead AS (ORDER BY e.seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
    )
    UPDATE lockkit.entries e
       SET granted = true
      FROM queue q
     WHERE e.owner = q.owner AND NOT q.granted
       AND CASE q.hold WHEN 1 THEN q.rows_ahead < q.permits
                       WHEN 2 THEN q.writers_ahead = 0
                       ELSE q.rows_ahead = 0 END
    RETURNING e.*;
END
$$;

-- Tells the owner of `p_row`, just granted by somebody else's statement, that it holds:
-- `h <seq> <proof> <key>`, the proof 128 bits of SHA-256 over the owner digest and the
-- number, which only who has the digest can make (the server and the owner).
CREATE OR REPLACE FUNCTION lockkit.hand_over(p_row lockkit.entries)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM lockkit.notify(p_row, 'h ' || p_row.seq || ' ' ||
        pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(p_row.owner || '/' || p_row.seq, 'UTF8')), 'hex'), 32));
END
$$;

-- One attempt of `p_owner` to hold the key: finds or makes its row (refreshing it for its
-- TTL) and runs the rule (`lockkit.grant_ready`), which may grant it, and others whose
-- owners it then tells. `o_granted` with the token `o_seq`; else `o_retry_ms` when the first
-- row ahead expires by itself, and `o_left` says that the attempt left no row (a `try_lock`).
-- `o_permits` is the semaphore's recorded count when it differs from `p_permits` (nothing is
-- then written).
CREATE OR REPLACE FUNCTION lockkit.attempt(
    p_namespace text, p_name text, p_kind smallint, p_owner text, p_hold smallint,
    p_permits integer, p_ttl_ms bigint, p_wait boolean,
    OUT o_granted boolean, OUT o_seq bigint, OUT o_retry_ms bigint,
    OUT o_permits integer, OUT o_left boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now timestamptz;
    v lockkit.entries;
    v_durable boolean := false;
BEGIN
    PERFORM lockkit.require_read_committed();
    PERFORM pg_advisory_xact_lock(hashtextextended(p_kind || '/' || p_namespace || '/' || p_name, 0));
    v_now := clock_timestamp();
    o_left := false;
    IF p_hold = 1 THEN
        SELECT e.permits INTO o_permits FROM lockkit.entries e
         WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = p_kind
           AND e.owner <> p_owner AND e.permits <> p_permits AND e.expires_at > v_now
         LIMIT 1;
        IF FOUND THEN
            o_granted := false;
            o_left := NOT EXISTS (SELECT 1 FROM lockkit.entries e WHERE e.owner = p_owner);
            RETURN;
        END IF;
    END IF;
    -- A row of ours that expired is gone: the rule below would delete it anyway.
    DELETE FROM lockkit.entries e WHERE e.owner = p_owner AND e.expires_at <= v_now;
    UPDATE lockkit.entries e
       SET expires_at = v_now + p_ttl_ms * interval '1 millisecond'
     WHERE e.owner = p_owner
    RETURNING e.seq, e.granted INTO o_seq, o_granted;
    IF NOT FOUND THEN
        o_seq := nextval('lockkit.fence');
        o_granted := false;
        INSERT INTO lockkit.entries (namespace, name, kind, seq, owner, hold, permits, expires_at, granted)
        VALUES (p_namespace, p_name, p_kind, o_seq, p_owner, p_hold, p_permits,
                v_now + p_ttl_ms * interval '1 millisecond', false);
    END IF;
    FOR v IN SELECT * FROM lockkit.grant_ready(p_namespace, p_name, p_kind, v_now) LOOP
        v_durable := true;
        IF v.owner = p_owner THEN
            o_granted := true;
        ELSE
            PERFORM lockkit.hand_over(v);
        END IF;
    END LOOP;
    IF NOT o_granted THEN
        SELECT ceil(extract(epoch FROM min(e.expires_at) - v_now) * 1000) INTO o_retry_ms
          FROM lockkit.entries e
         WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = p_kind AND e.seq < o_seq;
        IF NOT p_wait THEN
            DELETE FROM lockkit.entries e WHERE e.owner = p_owner;
            o_left := true;
        END IF;
    END IF;
    -- A grant (ours or a hand-over) is on disk, and on the synchronous standbys, before
    -- anybody hears of it; a queued row need not be.
    PERFORM set_config('synchronous_commit', CASE WHEN v_durable OR o_granted THEN 'on' ELSE 'off' END, true);
END
$$;

-- Deletes the row of `p_owner` (only a granted one with `p_granted_only`) under its key's
-- advisory lock, and runs the rule, handing the key over to whoever it grants now. An
-- election's leader that goes says so (`r <seq> <key>`) to the observers. Whether it was a
-- live grant.
CREATE OR REPLACE FUNCTION lockkit.release(p_owner text, p_granted_only boolean)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v lockkit.entries;
    v_next lockkit.entries;
    v_now timestamptz;
    v_durable boolean := false;
BEGIN
    PERFORM lockkit.require_read_committed();
    SELECT * INTO v FROM lockkit.entries e WHERE e.owner = p_owner;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(v.kind || '/' || v.namespace || '/' || v.name, 0));
    DELETE FROM lockkit.entries e
     WHERE e.owner = p_owner AND (e.granted OR NOT p_granted_only)
    RETURNING * INTO v;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_now := clock_timestamp();
    FOR v_next IN SELECT * FROM lockkit.grant_ready(v.namespace, v.name, v.kind, v_now) LOOP
        v_durable := true;
        PERFORM lockkit.hand_over(v_next);
    END LOOP;
    IF v.value IS NOT NULL THEN
        PERFORM lockkit.notify(v, 'r ' || v.seq);
    END IF;
    PERFORM set_config('synchronous_commit', CASE WHEN v_durable THEN 'on' ELSE 'off' END, true);
    RETURN v.granted AND v.expires_at > v_now;
END
$$;

-- Extends the live grants of `p_owners` to their TTLs from now; returns the owners extended.
CREATE OR REPLACE FUNCTION lockkit.renew(p_owners text[], p_ttls_ms bigint[])
RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    RETURN QUERY
    UPDATE lockkit.entries e
       SET expires_at = clock_timestamp() + r.ttl * interval '1 millisecond'
      FROM unnest(p_owners, p_ttls_ms) AS r(owner, ttl)
     WHERE e.owner = r.owner AND e.granted AND e.expires_at > clock_timestamp()
    RETURNING e.owner;
END
$$;

-- Whether `p_owner` holds a live grant.
CREATE OR REPLACE FUNCTION lockkit.holds(p_owner text)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN EXISTS (SELECT 1 FROM lockkit.entries e
                WHERE e.owner = p_owner AND e.granted AND e.expires_at > clock_timestamp());

-- The live holder of a key with the lowest token (a mutex's only one), what it proclaimed,
-- and how many rows wait.
CREATE OR REPLACE FUNCTION lockkit.holder(p_namespace text, p_name text, p_kind smallint,
    OUT o_seq bigint, OUT o_remaining_ms bigint, OUT o_value text, OUT o_waiters bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    SELECT e.seq, floor(extract(epoch FROM e.expires_at - v_now) * 1000), e.value
      INTO o_seq, o_remaining_ms, o_value
      FROM lockkit.entries e
     WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = p_kind
       AND e.granted AND e.expires_at > v_now
     ORDER BY e.seq LIMIT 1;
    SELECT count(*) INTO o_waiters FROM lockkit.entries e
     WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = p_kind
       AND NOT e.granted AND e.expires_at > v_now;
END
$$;

-- One page of the held mutexes of a namespace whose names start with `p_prefix`, after
-- `p_after` (none: from the start), in name order.
CREATE OR REPLACE FUNCTION lockkit.list(p_namespace text, p_prefix text, p_after text, p_limit integer)
RETURNS TABLE (name text, seq bigint, remaining_ms bigint, waiters bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT e.name, e.seq, floor(extract(epoch FROM e.expires_at - clock_timestamp()) * 1000)::bigint,
           (SELECT count(*) FROM lockkit.entries w
             WHERE w.namespace = e.namespace AND w.name = e.name AND w.kind = 0
               AND NOT w.granted AND w.expires_at > clock_timestamp())
      FROM lockkit.entries e
     WHERE e.namespace = p_namespace AND e.kind = 0 AND e.granted
       AND e.expires_at > clock_timestamp()
       AND e.name >= p_prefix AND e.name < p_prefix || chr(1114111)
       AND (p_after IS NULL OR e.name > p_after)
     ORDER BY e.name
     LIMIT p_limit
$$;

-- Breaks a mutex: deletes its live holder's row, whoever holds it, and hands the key over to
-- the next in line. Whether it was held.
CREATE OR REPLACE FUNCTION lockkit.force_release(p_namespace text, p_name text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v lockkit.entries;
    v_next lockkit.entries;
    v_now timestamptz;
    v_durable boolean := false;
BEGIN
    PERFORM lockkit.require_read_committed();
    PERFORM pg_advisory_xact_lock(hashtextextended('0/' || p_namespace || '/' || p_name, 0));
    v_now := clock_timestamp();
    DELETE FROM lockkit.entries e
     WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = 0 AND e.granted
       AND e.expires_at > v_now
    RETURNING * INTO v;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    FOR v_next IN SELECT * FROM lockkit.grant_ready(p_namespace, p_name, 0::smallint, v_now) LOOP
        v_durable := true;
        PERFORM lockkit.hand_over(v_next);
    END LOOP;
    PERFORM lockkit.notify(v, 'r ' || v.seq);
    PERFORM set_config('synchronous_commit', CASE WHEN v_durable THEN 'on' ELSE 'off' END, true);
    RETURN true;
END
$$;

-- An election's leader stores what it proclaims, if it still holds its grant.
CREATE OR REPLACE FUNCTION lockkit.proclaim(p_owner text, p_value text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v lockkit.entries;
BEGIN
    UPDATE lockkit.entries e SET value = p_value
     WHERE e.owner = p_owner AND e.granted AND e.expires_at > clock_timestamp()
    RETURNING * INTO v;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM lockkit.notify(v, 'g ' || v.seq);
    RETURN true;
END
$$;

-- Deletes at most `p_limit` rows expired for more than a minute, of keys nobody tried since:
-- an attempt deletes its own key's, this the rest (run with the renewals).
CREATE OR REPLACE FUNCTION lockkit.sweep(p_limit integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_deleted integer;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM lockkit.entries e
     WHERE e.ctid IN (SELECT x.ctid FROM lockkit.entries x
                       WHERE x.expires_at < clock_timestamp() - interval '1 minute'
                       LIMIT p_limit);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

CREATE INDEX IF NOT EXISTS entries_expires_at ON lockkit.entries (expires_at);

REVOKE ALL ON ALL TABLES IN SCHEMA lockkit FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA lockkit FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA lockkit FROM PUBLIC;

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
--   sequence `fence`. A row is granted when what is ahead of it allows: nothing ahead for a
--   mutex or a writer, no writer ahead for a reader, fewer than `permits` rows ahead for a
--   permit. So grants go in queue order, and `seq` is the grant's fencing token: a grant's
--   rows ahead were all granted before it, with smaller numbers.
-- * Attempts on one key run one at a time: each takes a transaction-scoped advisory lock on
--   the key first (released by its commit, so it works behind PgBouncer's transaction pooling,
--   and a crash cannot leave it behind). Nothing else depends on a session's state.
-- * A row lives until `expires_at`, on the server's clock; renewals move it, attempts delete
--   the expired rows of their key. A waiter's row is refreshed by its attempts.
-- * Grants and renewals commit with `synchronous_commit = on`, whatever the server's default:
--   a reply says the row is on disk (and on the synchronous standbys, where there are any).
--   Releases need not wait: a lost release only keeps a lock held until its TTL.
-- * A release notifies the key's channel (`lockkit.channel`) with `r <seq> <key>`, a mutex's
--   grant or proclamation with `g <seq> <key>`, where the key is `<kind>/<namespace>/<name>`:
--   the waiter whose predecessor went wakes, an election's observers see the new leader.

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
CREATE OR REPLACE FUNCTION lockkit.channel(p_key text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN 'lockkit_' || left(encode(sha256(convert_to(p_key, 'UTF8')), 'hex'), 32);

-- Notifies the channel of a key: `p_tag` r (a row went) or g (a grant, a proclamation).
CREATE OR REPLACE FUNCTION lockkit.notify(p_tag text, p_seq bigint, p_kind smallint, p_namespace text, p_name text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_key text := p_kind || '/' || p_namespace || '/' || p_name;
BEGIN
    PERFORM pg_notify(lockkit.channel(v_key), p_tag || ' ' || p_seq || ' ' || v_key);
END
$$;

-- One attempt of `p_owner` to hold the key: finds or makes its row, and grants it if what is
-- ahead allows. `o_granted` with the token `o_seq`; else `o_waiting_on` is the row to watch
-- (none for a permit: any release may free one), `o_retry_ms` when the first row ahead expires
-- by itself, and `o_left` says that the attempt left no row (a `try_lock`). `o_permits` is the
-- semaphore's recorded count when it differs from `p_permits` (nothing is then written).
CREATE OR REPLACE FUNCTION lockkit.attempt(
    p_namespace text, p_name text, p_kind smallint, p_owner text, p_hold smallint,
    p_permits integer, p_ttl_ms bigint, p_wait boolean,
    OUT o_granted boolean, OUT o_seq bigint, OUT o_waiting_on bigint, OUT o_retry_ms bigint,
    OUT o_permits integer, OUT o_left boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now timestamptz;
    v_ahead bigint;
    v_first_end timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_kind || '/' || p_namespace || '/' || p_name, 0));
    PERFORM set_config('synchronous_commit', 'on', true);
    v_now := clock_timestamp();
    o_granted := false;
    o_left := false;
    DELETE FROM lockkit.entries e
     WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = p_kind
       AND e.expires_at <= v_now;
    IF p_hold = 1 THEN
        SELECT e.permits INTO o_permits FROM lockkit.entries e
         WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = p_kind
           AND e.owner <> p_owner AND e.permits <> p_permits
         LIMIT 1;
        IF FOUND THEN
            o_left := NOT EXISTS (SELECT 1 FROM lockkit.entries e WHERE e.owner = p_owner);
            RETURN;
        END IF;
    END IF;
    SELECT e.seq INTO o_seq FROM lockkit.entries e
     WHERE e.owner = p_owner AND e.namespace = p_namespace AND e.name = p_name AND e.kind = p_kind;
    -- What is ahead (everything, for a row not made yet) and keeps this hold out.
    SELECT count(*), max(e.seq), min(e.expires_at) INTO v_ahead, o_waiting_on, v_first_end
      FROM lockkit.entries e
     WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = p_kind
       AND (o_seq IS NULL OR e.seq < o_seq)
       AND (p_hold <> 2 OR e.hold = 3);
    o_granted := CASE WHEN p_hold = 1 THEN v_ahead < p_permits ELSE v_ahead = 0 END;
    IF o_seq IS NULL THEN
        IF NOT o_granted AND NOT p_wait THEN
            o_left := true;
            o_retry_ms := ceil(extract(epoch FROM v_first_end - v_now) * 1000);
            RETURN;
        END IF;
        o_seq := nextval('lockkit.fence');
        INSERT INTO lockkit.entries (namespace, name, kind, seq, owner, hold, permits, expires_at, granted)
        VALUES (p_namespace, p_name, p_kind, o_seq, p_owner, p_hold, p_permits,
                v_now + p_ttl_ms * interval '1 millisecond', o_granted);
    ELSE
        UPDATE lockkit.entries e
           SET expires_at = v_now + p_ttl_ms * interval '1 millisecond',
               granted = e.granted OR o_granted
         WHERE e.owner = p_owner;
    END IF;
    IF o_granted THEN
        o_waiting_on := NULL;
        IF p_kind = 0 THEN
            PERFORM lockkit.notify('g', o_seq, p_kind, p_namespace, p_name);
        END IF;
    ELSE
        IF p_hold = 1 THEN
            o_waiting_on := NULL;
        END IF;
        o_retry_ms := ceil(extract(epoch FROM v_first_end - v_now) * 1000);
    END IF;
END
$$;

-- Deletes the row of `p_owner` (only a granted one with `p_granted_only`), waking whoever
-- waits on it. Whether it was a live grant.
CREATE OR REPLACE FUNCTION lockkit.release(p_owner text, p_granted_only boolean)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v lockkit.entries;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM lockkit.entries e
     WHERE e.owner = p_owner AND (e.granted OR NOT p_granted_only)
    RETURNING * INTO v;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM lockkit.notify('r', v.seq, v.kind, v.namespace, v.name);
    RETURN v.granted AND v.expires_at > clock_timestamp();
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

-- Breaks a mutex: deletes its live holder's row, whoever holds it, and wakes its waiters.
-- Whether it was held.
CREATE OR REPLACE FUNCTION lockkit.force_release(p_namespace text, p_name text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v lockkit.entries;
BEGIN
    DELETE FROM lockkit.entries e
     WHERE e.namespace = p_namespace AND e.name = p_name AND e.kind = 0 AND e.granted
    RETURNING * INTO v;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM lockkit.notify('r', v.seq, v.kind, v.namespace, v.name);
    RETURN v.expires_at > clock_timestamp();
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
    PERFORM lockkit.notify('g', v.seq, v.kind, v.namespace, v.name);
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

"""The PostgreSQL schema of walqueue.pg and its migrations (SPEC §9).

Tables (in one schema, `walqueue` by default; every index leads with `queue`
so one queue's rows never cost another queue a scan):

  task       one row per task ever put, insert-only: the permanent facts
             (task_id, key, identity, max_attempts). Its primary key and the
             unique (queue, key) make ids and keys permanent (SPEC §2).
  live       the hot rows: ready, leased and dead tasks with their counters,
             lease and payload. Partial indexes on the ready and the leased
             rows serve reserve and the reap. A task leaves `live` when it is
             acked, so the table holds only the work in flight, not history.
  completed  insert-only tombstones of acked tasks: their final counters.
  listener   UNLOGGED: processes with a reserve waiting on a queue (see
             walqueue.pg.wakeup); writers NOTIFY only when a row exists,
             because NOTIFY serializes committing transactions.
  schema_migrations  one row per applied migration (version, description).
  task_view  a view: every task with TaskView's fields (get, tasks, and psql).

Ids, keys and workers are bytea holding their UTF-8 (which may contain NUL,
which text cannot), so bytewise order is Python's str order. Payloads are
text holding §4's canonical JSON byte for byte (never jsonb, which reorders).
Times are bigint seconds from `clock()`, the server's transaction time in
whole seconds.

The operation functions (put, reserve, ack, ...) are plpgsql, one per call,
so every call is one statement: one transaction and one round trip. They
raise SQLSTATE WQ001 (KeyConflict), WQ002 (StaleLease, DETAIL is JSON with
status and generation) and WQ003 (InvalidRequest) with nothing changed;
walqueue.pg.calls turns those into the library's exceptions.

Invariants the functions keep: a task id is in `task` iff it was put; it is
in exactly one of `live` and `completed`; only leased rows have a worker and
a deadline; attempts <= max_attempts, and dead rows have attempts =
max_attempts.
"""

from __future__ import annotations

import hashlib

from psycopg import Connection, sql

from walqueue.errors import WalQueueError

SCHEMA_VERSION = 1
DEFAULT_SCHEMA = "walqueue"
# The channel the functions NOTIFY on; one per schema, the queue in the payload.
CHANNEL_PREFIX = "walqueue:"


class SchemaError(WalQueueError):
    """The database's walqueue schema is missing, older or newer than this client knows."""


def channel(schema: str) -> str:
    return CHANNEL_PREFIX + schema


def lock_key(schema: str) -> int:
    """The advisory lock key under which a schema is created or migrated."""
    digest = hashlib.sha256(f"walqueue.pg.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# The body of each migration; @s@ is the quoted schema, @channel@ the quoted
# NOTIFY channel literal, @lock@ the registration lock key (walqueue.pg.wakeup).
_MIGRATION_1 = r"""
CREATE FUNCTION @s@.clock() RETURNS bigint LANGUAGE sql STABLE AS
$$ SELECT floor(extract(epoch FROM transaction_timestamp()))::bigint $$;

CREATE TABLE @s@.task (
    queue        text   NOT NULL,
    task_id      bytea  NOT NULL,
    key          bytea  NOT NULL,
    identity     bytea  NOT NULL,
    max_attempts bigint NOT NULL,
    CONSTRAINT task_pkey PRIMARY KEY (queue, task_id),
    CONSTRAINT task_queue_key_key UNIQUE (queue, key)
);

-- fillfactor leaves room on each page, so a row's new version after a
-- reserve, touch or release usually lands beside the old one and page
-- pruning can reclaim the old one without waiting for VACUUM.
CREATE TABLE @s@.live (
    queue        text   NOT NULL,
    task_id      bytea  NOT NULL,
    status       text   NOT NULL CHECK (status IN ('ready', 'leased', 'dead')),
    attempts     bigint NOT NULL,
    max_attempts bigint NOT NULL,
    generation   bigint NOT NULL,
    available_at bigint NOT NULL,
    deadline     bigint,
    worker       bytea,
    payload      text   NOT NULL,
    CONSTRAINT live_pkey PRIMARY KEY (queue, task_id)
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 1);
CREATE INDEX live_ready ON @s@.live (queue, available_at, task_id) WHERE status = 'ready';
CREATE INDEX live_leased ON @s@.live (queue, deadline, task_id) WHERE status = 'leased';

CREATE TABLE @s@.completed (
    queue        text   NOT NULL,
    task_id      bytea  NOT NULL,
    attempts     bigint NOT NULL,
    generation   bigint NOT NULL,
    available_at bigint NOT NULL,
    CONSTRAINT completed_pkey PRIMARY KEY (queue, task_id)
);

CREATE UNLOGGED TABLE @s@.listener (
    queue text    NOT NULL,
    pid   integer NOT NULL,
    CONSTRAINT listener_pkey PRIMARY KEY (queue, pid)
);

-- Tell waiting processes that `due` tasks became due now, or that one will
-- be due at `next_at`. Only when a process waits on the queue: NOTIFY takes
-- a database-wide lock at commit. The shared lock orders this transaction
-- against a registration (walqueue.pg.wakeup), so a waiter that registered
-- sees either this transaction's tasks or its notification.
CREATE FUNCTION @s@.announce(p_queue text, p_due bigint, p_next_at bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_due = 0 AND p_next_at IS NULL THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(@lock@);
    IF EXISTS (SELECT 1 FROM @s@.listener WHERE queue = p_queue) THEN
        PERFORM pg_notify(@channel@, p_due || ' ' || coalesce(p_next_at, 0) || ' ' || p_queue);
    END IF;
END $$;

CREATE FUNCTION @s@.stale(p_queue text, p_task_id bytea, p_status text, p_generation bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_generation bigint;
BEGIN
    IF p_status IS NULL THEN
        SELECT generation INTO v_generation FROM @s@.completed
        WHERE queue = p_queue AND task_id = p_task_id;
        IF FOUND THEN
            p_status := 'completed';
            p_generation := v_generation;
        END IF;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'WQ002', MESSAGE = 'stale lease',
        DETAIL = json_build_object('status', p_status, 'generation', p_generation)::text;
END $$;

CREATE FUNCTION @s@.put(p_queue text, p_task_ids bytea[], p_keys bytea[], p_identities bytea[],
                        p_max_attempts bigint[], p_available_ats bigint[], p_payloads text[])
RETURNS bytea[] LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := @s@.clock();
    v_ids bytea[] := p_task_ids;
    v_task_id bytea;
    v_identity bytea;
    v_due bigint := 0;
    v_next_at bigint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_task_ids, 1), 0) LOOP
        -- A concurrent put of the same key or id waits here for the other's
        -- commit, then sees its row: racing puts resolve like serial ones.
        INSERT INTO @s@.task (queue, task_id, key, identity, max_attempts)
        VALUES (p_queue, p_task_ids[i], p_keys[i], p_identities[i], p_max_attempts[i])
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            INSERT INTO @s@.live (queue, task_id, status, attempts, max_attempts, generation,
                                  available_at, payload)
            VALUES (p_queue, p_task_ids[i], 'ready', 0, p_max_attempts[i], 0,
                    p_available_ats[i], p_payloads[i]);
            IF p_available_ats[i] <= v_now THEN
                v_due := v_due + 1;
            ELSIF v_next_at IS NULL OR p_available_ats[i] < v_next_at THEN
                v_next_at := p_available_ats[i];
            END IF;
            CONTINUE;
        END IF;
        SELECT task_id, identity INTO v_task_id, v_identity FROM @s@.task
        WHERE queue = p_queue AND key = p_keys[i];
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'WQ001', MESSAGE = 'task id already used',
                DETAIL = json_build_object('index', i - 1, 'reason', 'task_id')::text;
        ELSIF v_identity <> p_identities[i] THEN
            RAISE EXCEPTION USING ERRCODE = 'WQ001', MESSAGE = 'key already used',
                DETAIL = json_build_object('index', i - 1, 'reason', 'key',
                                           'task_id', encode(v_task_id, 'hex'))::text;
        END IF;
        v_ids[i] := v_task_id;
    END LOOP;
    PERFORM @s@.announce(p_queue, v_due, v_next_at);
    RETURN v_ids;
END $$;

-- Expire the queue's leases whose deadline has passed (SPEC §2's reap): each
-- becomes ready at its old deadline, or dead once it used all its attempts.
-- Rows a concurrent transaction holds are skipped: that transaction is an ack,
-- release or touch deciding the same lease, or another reap.
CREATE FUNCTION @s@.reap(p_queue text, p_now bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_ready bigint;
BEGIN
    WITH expired AS (
        SELECT task_id FROM @s@.live
        WHERE queue = p_queue AND status = 'leased' AND deadline <= p_now
        ORDER BY deadline, task_id
        LIMIT 10000
        FOR UPDATE SKIP LOCKED
    ), ended AS (
        UPDATE @s@.live AS l
        SET status = CASE WHEN l.attempts >= l.max_attempts THEN 'dead' ELSE 'ready' END,
            available_at = l.deadline, deadline = NULL, worker = NULL
        FROM expired WHERE l.queue = p_queue AND l.task_id = expired.task_id
        RETURNING l.status
    )
    SELECT count(*) FILTER (WHERE status = 'ready') INTO v_ready FROM ended;
    PERFORM @s@.announce(p_queue, v_ready, NULL);
    RETURN v_ready;
END $$;

-- Reap, then lease up to p_limit due ready tasks in (available_at, task_id)
-- order, skipping rows a concurrent transaction holds. Leasing nothing, it
-- returns one row with a NULL task_id whose deadline is the next time at
-- which a task becomes due or a lease expires (NULL: none), for waiters.
CREATE FUNCTION @s@.reserve(p_queue text, p_worker bytea, p_lease_seconds bigint, p_limit integer)
RETURNS TABLE (task_id bytea, generation bigint, deadline bigint, attempts bigint, payload text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now bigint := @s@.clock();
    v_leased bigint;
BEGIN
    IF p_lease_seconds > 9223372036854775807 - v_now THEN
        RAISE EXCEPTION USING ERRCODE = 'WQ003',
            MESSAGE = 'now + lease_seconds = ' || (v_now::numeric + p_lease_seconds) || ' is not below 2**63';
    END IF;
    PERFORM @s@.reap(p_queue, v_now);
    RETURN QUERY
    WITH picked AS (
        SELECT l.task_id FROM @s@.live AS l
        WHERE l.queue = p_queue AND l.status = 'ready' AND l.available_at <= v_now
        ORDER BY l.available_at, l.task_id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), leased AS (
        UPDATE @s@.live AS l
        SET status = 'leased', attempts = l.attempts + 1, generation = l.generation + 1,
            worker = p_worker, deadline = v_now + p_lease_seconds
        -- The status test is a second guard: the row lock above already
        -- re-checked it against a concurrent reserve that committed first.
        FROM picked WHERE l.queue = p_queue AND l.task_id = picked.task_id AND l.status = 'ready'
        RETURNING l.task_id, l.generation, l.deadline, l.attempts, l.payload, l.available_at
    )
    SELECT leased.task_id, leased.generation, leased.deadline, leased.attempts, leased.payload
    FROM leased ORDER BY leased.available_at, leased.task_id;
    GET DIAGNOSTICS v_leased = ROW_COUNT;
    IF v_leased = 0 THEN
        RETURN QUERY SELECT NULL::bytea, NULL::bigint, least(
            (SELECT min(l.available_at) FROM @s@.live AS l
             WHERE l.queue = p_queue AND l.status = 'ready'),
            (SELECT min(l.deadline) FROM @s@.live AS l
             WHERE l.queue = p_queue AND l.status = 'leased')), NULL::bigint, NULL::text;
    END IF;
END $$;

-- The live row of a current lease, locked; raises StaleLease otherwise.
CREATE FUNCTION @s@.current_lease(p_queue text, p_task_id bytea, p_worker bytea,
                                  p_generation bigint, p_now bigint)
RETURNS @s@.live LANGUAGE plpgsql AS $$
DECLARE
    v_row @s@.live;
BEGIN
    SELECT * INTO v_row FROM @s@.live WHERE queue = p_queue AND task_id = p_task_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM @s@.stale(p_queue, p_task_id, NULL, NULL);
    END IF;
    IF v_row.status <> 'leased' OR v_row.generation <> p_generation
            OR v_row.worker <> p_worker OR NOT p_now < v_row.deadline THEN
        PERFORM @s@.stale(p_queue, p_task_id, v_row.status, v_row.generation);
    END IF;
    RETURN v_row;
END $$;

CREATE FUNCTION @s@.ack(p_queue text, p_task_id bytea, p_worker bytea, p_generation bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_row @s@.live := @s@.current_lease(p_queue, p_task_id, p_worker, p_generation, @s@.clock());
BEGIN
    DELETE FROM @s@.live WHERE queue = p_queue AND task_id = p_task_id;
    INSERT INTO @s@.completed (queue, task_id, attempts, generation, available_at)
    VALUES (p_queue, p_task_id, v_row.attempts, v_row.generation, v_row.available_at);
END $$;

CREATE FUNCTION @s@.ack_and_reserve(p_queue text, p_task_id bytea, p_worker bytea,
                                    p_generation bigint, p_lease_seconds bigint, p_limit integer)
RETURNS TABLE (task_id bytea, generation bigint, deadline bigint, attempts bigint, payload text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_lease_seconds > 9223372036854775807 - @s@.clock() THEN
        RAISE EXCEPTION USING ERRCODE = 'WQ003',
            MESSAGE = 'now + lease_seconds = ' || (@s@.clock()::numeric + p_lease_seconds) || ' is not below 2**63';
    END IF;
    PERFORM @s@.ack(p_queue, p_task_id, p_worker, p_generation);
    RETURN QUERY SELECT * FROM @s@.reserve(p_queue, p_worker, p_lease_seconds, p_limit);
END $$;

CREATE FUNCTION @s@.release(p_queue text, p_task_id bytea, p_worker bytea, p_generation bigint,
                            p_delay bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := @s@.clock();
    v_row @s@.live;
BEGIN
    IF p_delay > 9223372036854775807 - v_now THEN
        RAISE EXCEPTION USING ERRCODE = 'WQ003',
            MESSAGE = 'now + delay = ' || (v_now::numeric + p_delay) || ' is not below 2**63';
    END IF;
    v_row := @s@.current_lease(p_queue, p_task_id, p_worker, p_generation, v_now);
    UPDATE @s@.live
    SET status = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'ready' END,
        available_at = v_now + p_delay, deadline = NULL, worker = NULL
    WHERE queue = p_queue AND task_id = p_task_id;
    IF v_row.attempts < v_row.max_attempts THEN
        IF p_delay = 0 THEN
            PERFORM @s@.announce(p_queue, 1, NULL);
        ELSE
            PERFORM @s@.announce(p_queue, 0, v_now + p_delay);
        END IF;
    END IF;
END $$;

CREATE FUNCTION @s@.touch(p_queue text, p_task_id bytea, p_worker bytea, p_generation bigint,
                          p_lease_seconds bigint)
RETURNS TABLE (deadline bigint, attempts bigint, payload text) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now bigint := @s@.clock();
BEGIN
    IF p_lease_seconds > 9223372036854775807 - v_now THEN
        RAISE EXCEPTION USING ERRCODE = 'WQ003',
            MESSAGE = 'now + lease_seconds = ' || (v_now::numeric + p_lease_seconds) || ' is not below 2**63';
    END IF;
    PERFORM @s@.current_lease(p_queue, p_task_id, p_worker, p_generation, v_now);
    RETURN QUERY
    UPDATE @s@.live AS l SET deadline = v_now + p_lease_seconds
    WHERE l.queue = p_queue AND l.task_id = p_task_id
    RETURNING l.deadline, l.attempts, l.payload;
END $$;

-- Every listed task must be dead (else InvalidRequest naming the first that
-- is not, nothing changed); each becomes ready now with attempts 0.
-- p_task_ids has no duplicates.
CREATE FUNCTION @s@.revive(p_queue text, p_task_ids bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := @s@.clock();
    v_found record;
    v_count bigint;
BEGIN
    -- Locked in task_id order, so two revives cannot deadlock.
    PERFORM 1 FROM @s@.live WHERE queue = p_queue AND task_id = ANY (p_task_ids)
    ORDER BY task_id FOR UPDATE;
    SELECT wanted.ordinality - 1 AS index,
           CASE WHEN l.status IS NOT NULL THEN l.status
                WHEN c.task_id IS NOT NULL THEN 'completed' END AS status
    INTO v_found
    FROM unnest(p_task_ids) WITH ORDINALITY AS wanted(id, ordinality)
    LEFT JOIN @s@.live AS l ON l.queue = p_queue AND l.task_id = wanted.id
    LEFT JOIN @s@.completed AS c ON c.queue = p_queue AND c.task_id = wanted.id
    WHERE l.status IS DISTINCT FROM 'dead'
    ORDER BY l.status IS NOT NULL OR c.task_id IS NOT NULL, wanted.ordinality
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WQ003', MESSAGE = 'not dead',
            DETAIL = json_build_object('index', v_found.index, 'status', v_found.status)::text;
    END IF;
    UPDATE @s@.live SET status = 'ready', attempts = 0, available_at = v_now
    WHERE queue = p_queue AND task_id = ANY (p_task_ids);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM @s@.announce(p_queue, v_count, NULL);
END $$;

-- Every task with TaskView's fields, whichever table holds its state.
CREATE VIEW @s@.task_view AS
    SELECT t.queue, t.task_id, t.key, coalesce(l.status, 'completed') AS status,
           coalesce(l.attempts, c.attempts) AS attempts, t.max_attempts,
           coalesce(l.generation, c.generation) AS generation,
           coalesce(l.available_at, c.available_at) AS available_at, l.deadline, l.worker, l.payload
    FROM @s@.task AS t
    LEFT JOIN @s@.live AS l ON l.queue = t.queue AND l.task_id = t.task_id
    LEFT JOIN @s@.completed AS c ON c.queue = t.queue AND c.task_id = t.task_id;

CREATE FUNCTION @s@.get(p_queue text, p_task_id bytea)
RETURNS TABLE (task_id bytea, key bytea, status text, attempts bigint, max_attempts bigint,
               generation bigint, available_at bigint, deadline bigint, worker bytea, payload text)
LANGUAGE sql STABLE AS $$
    SELECT v.task_id, v.key, v.status, v.attempts, v.max_attempts, v.generation, v.available_at,
           v.deadline, v.worker, v.payload
    FROM @s@.task_view AS v WHERE v.queue = p_queue AND v.task_id = p_task_id
$$;

CREATE FUNCTION @s@.tasks(p_queue text, p_status text)
RETURNS TABLE (task_id bytea, key bytea, status text, attempts bigint, max_attempts bigint,
               generation bigint, available_at bigint, deadline bigint, worker bytea, payload text)
LANGUAGE sql STABLE AS $$
    SELECT v.task_id, v.key, v.status, v.attempts, v.max_attempts, v.generation, v.available_at,
           v.deadline, v.worker, v.payload
    FROM @s@.task_view AS v
    WHERE v.queue = p_queue AND (p_status IS NULL OR v.status = p_status)
    ORDER BY v.task_id
$$;

CREATE FUNCTION @s@.stats(p_queue text)
RETURNS TABLE (ready bigint, leased bigint, completed bigint, dead bigint)
LANGUAGE sql STABLE AS $$
    SELECT count(*) FILTER (WHERE l.status = 'ready'), count(*) FILTER (WHERE l.status = 'leased'),
           (SELECT count(*) FROM @s@.completed AS c WHERE c.queue = p_queue),
           count(*) FILTER (WHERE l.status = 'dead')
    FROM @s@.live AS l WHERE l.queue = p_queue
$$;
"""

# (version, description, body). Append only: a released migration never changes.
MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (1, "tables task, live, completed, listener; the operation functions", _MIGRATION_1),
)
assert MIGRATIONS[-1][0] == SCHEMA_VERSION

# A test-only clock (tests/pg): clock() honours the session setting
# walqueue.test_now when set. Installed by install_test_clock(), never by a
# migration, so in production no client can move the queue's clock.
_TEST_CLOCK = r"""
CREATE OR REPLACE FUNCTION @s@.clock() RETURNS bigint LANGUAGE sql STABLE AS
$$ SELECT coalesce(nullif(current_setting('walqueue.test_now', true), '')::bigint,
                   floor(extract(epoch FROM transaction_timestamp()))::bigint) $$;
"""
TEST_NOW_SETTING = "walqueue.test_now"


def registration_lock_key(schema: str) -> int:
    """The advisory lock that orders a waiter's registration against writers' NOTIFY checks."""
    return lock_key(schema) ^ 1


def render(body: str, schema: str, connection: Connection) -> str:
    """`body` with its placeholders filled for `schema`."""
    return (body.replace("@s@", sql.Identifier(schema).as_string(connection))
            .replace("@channel@", sql.Literal(channel(schema)).as_string(connection))
            .replace("@lock@", str(registration_lock_key(schema))))


def installed_version(connection: Connection, schema: str) -> int | None:
    """The schema's highest applied migration, or None if there is no walqueue schema."""
    row = connection.execute(
        "SELECT to_regclass(%s) IS NOT NULL",
        (sql.Identifier(schema, "schema_migrations").as_string(connection),)).fetchone()
    if not row[0]:
        return None
    query = sql.SQL("SELECT coalesce(max(version), 0) FROM {}").format(
        sql.Identifier(schema, "schema_migrations"))
    return connection.execute(query).fetchone()[0]


def check_version(version: int | None, schema: str) -> None:
    """Raise SchemaError unless `version` is the one this client speaks."""
    if version is None:
        raise SchemaError(f"the database has no walqueue schema {schema!r}: create it with "
                          f"`walqueue-ctl --dsn URL migrate` or a Client with migrate=True")
    if version > SCHEMA_VERSION:
        raise SchemaError(f"schema {schema!r} is at version {version}, newer than this walqueue "
                          f"knows (version {SCHEMA_VERSION}): upgrade walqueue on this host")
    if version < SCHEMA_VERSION:
        raise SchemaError(f"schema {schema!r} is at version {version}; this walqueue needs "
                          f"version {SCHEMA_VERSION}: run `walqueue-ctl --dsn URL migrate`")


def migrate_connection(connection: Connection, schema: str) -> int:
    """Create or upgrade `schema` to SCHEMA_VERSION under an advisory lock; returns the version.

    `connection` must be in autocommit mode. Each migration is one
    transaction. Raises SchemaError for a schema newer than this code knows
    or a database whose encoding is not UTF8 (payloads are UTF-8 text).
    """
    encoding = connection.execute("SHOW server_encoding").fetchone()[0]
    if encoding.upper() not in ("UTF8", "UTF-8"):
        raise SchemaError(f"the database's encoding is {encoding}, not UTF8: walqueue stores "
                          f"payloads as UTF-8 text; create the database with ENCODING 'UTF8'")
    key = lock_key(schema)
    connection.execute("SELECT pg_advisory_lock(%s)", (key,))
    try:
        with connection.transaction():
            connection.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(schema)))
            connection.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (version integer PRIMARY KEY, "
                "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(schema, "schema_migrations")))
        version = installed_version(connection, schema) or 0
        if version > SCHEMA_VERSION:
            check_version(version, schema)
        for number, description, body in MIGRATIONS:
            if number <= version:
                continue
            with connection.transaction():
                connection.execute(render(body, schema, connection), prepare=False)
                connection.execute(
                    sql.SQL("INSERT INTO {} (version, description) VALUES (%s, %s)").format(
                        sql.Identifier(schema, "schema_migrations")), (number, description))
            version = number
        return version
    finally:
        connection.execute("SELECT pg_advisory_unlock(%s)", (key,))


def install_test_clock(connection: Connection, schema: str) -> None:
    """Test-only: make clock() honour the session setting walqueue.test_now.

    Needs the schema owner's rights (a worker role cannot do it). Production
    databases must never run this: with it any session can move its clock.
    """
    connection.execute(render(_TEST_CLOCK, schema, connection), prepare=False)

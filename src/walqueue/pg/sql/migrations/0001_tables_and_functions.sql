-- walqueue.pg schema version 1: tables task, live, completed, listener; the operation functions.
--
-- A template for psycopg's sql.SQL(...).format() (walqueue.pg.schema.compose), never for
-- str.replace. Its four placeholders, each a name in braces: schema (the schema, an
-- sql.Identifier), channel (its NOTIFY channel, an sql.Literal), lock (the registration lock key
-- of walqueue.pg.wakeup, an sql.Literal) and dollar (the dollar quote around every function
-- body, with a tag that does not occur in the schema's name, so no name can end a body early).
-- format() looks for placeholders in this text only, never in what it puts in; and none may
-- stand in a comment, where a name holding a newline would end the comment. A released
-- migration never changes: a new one is a new file.


CREATE FUNCTION {schema}.clock() RETURNS bigint LANGUAGE sql STABLE AS
{dollar} SELECT floor(extract(epoch FROM transaction_timestamp()))::bigint {dollar};

CREATE TABLE {schema}.task (
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
CREATE TABLE {schema}.live (
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
CREATE INDEX live_ready ON {schema}.live (queue, available_at, task_id) WHERE status = 'ready';
CREATE INDEX live_leased ON {schema}.live (queue, deadline, task_id) WHERE status = 'leased';

CREATE TABLE {schema}.completed (
    queue        text   NOT NULL,
    task_id      bytea  NOT NULL,
    attempts     bigint NOT NULL,
    generation   bigint NOT NULL,
    available_at bigint NOT NULL,
    CONSTRAINT completed_pkey PRIMARY KEY (queue, task_id)
);

CREATE UNLOGGED TABLE {schema}.listener (
    queue text    NOT NULL,
    pid   integer NOT NULL,
    CONSTRAINT listener_pkey PRIMARY KEY (queue, pid)
);

-- Tell waiting processes that `due` tasks became due now, or that one will
-- be due at `next_at`. Only when a process waits on the queue: NOTIFY takes
-- a database-wide lock at commit. The shared lock orders this transaction
-- against a registration (walqueue.pg.wakeup), so a waiter that registered
-- sees either this transaction's tasks or its notification.
CREATE FUNCTION {schema}.announce(p_queue text, p_due bigint, p_next_at bigint) RETURNS void
LANGUAGE plpgsql AS {dollar}
BEGIN
    IF p_due = 0 AND p_next_at IS NULL THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared({lock});
    IF EXISTS (SELECT 1 FROM {schema}.listener WHERE queue = p_queue) THEN
        PERFORM pg_notify({channel}, p_due || ' ' || coalesce(p_next_at, 0) || ' ' || p_queue);
    END IF;
END {dollar};

CREATE FUNCTION {schema}.stale(p_queue text, p_task_id bytea, p_status text, p_generation bigint)
RETURNS void LANGUAGE plpgsql AS {dollar}
DECLARE
    v_generation bigint;
BEGIN
    IF p_status IS NULL THEN
        SELECT generation INTO v_generation FROM {schema}.completed
        WHERE queue = p_queue AND task_id = p_task_id;
        IF FOUND THEN
            p_status := 'completed';
            p_generation := v_generation;
        END IF;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'WQ002', MESSAGE = 'stale lease',
        DETAIL = json_build_object('status', p_status, 'generation', p_generation)::text;
END {dollar};

CREATE FUNCTION {schema}.put(p_queue text, p_task_ids bytea[], p_keys bytea[], p_identities bytea[],
                        p_max_attempts bigint[], p_available_ats bigint[], p_payloads text[])
RETURNS bytea[] LANGUAGE plpgsql AS {dollar}
DECLARE
    v_now bigint := {schema}.clock();
    v_ids bytea[] := p_task_ids;
    v_task_id bytea;
    v_identity bytea;
    v_due bigint := 0;
    v_next_at bigint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_task_ids, 1), 0) LOOP
        -- A concurrent put of the same key or id waits here for the other's
        -- commit, then sees its row: racing puts resolve like serial ones.
        INSERT INTO {schema}.task (queue, task_id, key, identity, max_attempts)
        VALUES (p_queue, p_task_ids[i], p_keys[i], p_identities[i], p_max_attempts[i])
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            INSERT INTO {schema}.live (queue, task_id, status, attempts, max_attempts, generation,
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
        SELECT task_id, identity INTO v_task_id, v_identity FROM {schema}.task
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
    PERFORM {schema}.announce(p_queue, v_due, v_next_at);
    RETURN v_ids;
END {dollar};

-- Expire the queue's leases whose deadline has passed (SPEC §2's reap): each
-- becomes ready at its old deadline, or dead once it used all its attempts.
-- Rows a concurrent transaction holds are skipped: that transaction is an ack,
-- release or touch deciding the same lease, or another reap.
CREATE FUNCTION {schema}.reap(p_queue text, p_now bigint) RETURNS bigint LANGUAGE plpgsql AS {dollar}
DECLARE
    v_ready bigint;
BEGIN
    WITH expired AS (
        SELECT task_id FROM {schema}.live
        WHERE queue = p_queue AND status = 'leased' AND deadline <= p_now
        ORDER BY deadline, task_id
        LIMIT 10000
        FOR UPDATE SKIP LOCKED
    ), ended AS (
        UPDATE {schema}.live AS l
        SET status = CASE WHEN l.attempts >= l.max_attempts THEN 'dead' ELSE 'ready' END,
            available_at = l.deadline, deadline = NULL, worker = NULL
        FROM expired WHERE l.queue = p_queue AND l.task_id = expired.task_id
        RETURNING l.status
    )
    SELECT count(*) FILTER (WHERE status = 'ready') INTO v_ready FROM ended;
    PERFORM {schema}.announce(p_queue, v_ready, NULL);
    RETURN v_ready;
END {dollar};

-- Reap, then lease up to p_limit due ready tasks in (available_at, task_id)
-- order, skipping rows a concurrent transaction holds. Leasing nothing, it
-- returns one row with a NULL task_id whose deadline is the next time at
-- which a task becomes due or a lease expires (NULL: none), for waiters.
CREATE FUNCTION {schema}.reserve(p_queue text, p_worker bytea, p_lease_seconds bigint, p_limit integer)
RETURNS TABLE (task_id bytea, generation bigint, deadline bigint, attempts bigint, payload text)
LANGUAGE plpgsql AS {dollar}
#variable_conflict use_column
DECLARE
    v_now bigint := {schema}.clock();
    v_leased bigint;
BEGIN
    IF p_lease_seconds > 9223372036854775807 - v_now THEN
        RAISE EXCEPTION USING ERRCODE = 'WQ003',
            MESSAGE = 'now + lease_seconds = ' || (v_now::numeric + p_lease_seconds) || ' is not below 2**63';
    END IF;
    PERFORM {schema}.reap(p_queue, v_now);
    RETURN QUERY
    WITH picked AS (
        SELECT l.task_id FROM {schema}.live AS l
        WHERE l.queue = p_queue AND l.status = 'ready' AND l.available_at <= v_now
        ORDER BY l.available_at, l.task_id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), leased AS (
        UPDATE {schema}.live AS l
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
            (SELECT min(l.available_at) FROM {schema}.live AS l
             WHERE l.queue = p_queue AND l.status = 'ready'),
            (SELECT min(l.deadline) FROM {schema}.live AS l
             WHERE l.queue = p_queue AND l.status = 'leased')), NULL::bigint, NULL::text;
    END IF;
END {dollar};

-- The live row of a current lease, locked; raises StaleLease otherwise.
CREATE FUNCTION {schema}.current_lease(p_queue text, p_task_id bytea, p_worker bytea,
                                  p_generation bigint, p_now bigint)
RETURNS {schema}.live LANGUAGE plpgsql AS {dollar}
DECLARE
    v_row {schema}.live;
BEGIN
    SELECT * INTO v_row FROM {schema}.live WHERE queue = p_queue AND task_id = p_task_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM {schema}.stale(p_queue, p_task_id, NULL, NULL);
    END IF;
    IF v_row.status <> 'leased' OR v_row.generation <> p_generation
            OR v_row.worker <> p_worker OR NOT p_now < v_row.deadline THEN
        PERFORM {schema}.stale(p_queue, p_task_id, v_row.status, v_row.generation);
    END IF;
    RETURN v_row;
END {dollar};

CREATE FUNCTION {schema}.ack(p_queue text, p_task_id bytea, p_worker bytea, p_generation bigint)
RETURNS void LANGUAGE plpgsql AS {dollar}
DECLARE
    v_row {schema}.live := {schema}.current_lease(p_queue, p_task_id, p_worker, p_generation, {schema}.clock());
BEGIN
    DELETE FROM {schema}.live WHERE queue = p_queue AND task_id = p_task_id;
    INSERT INTO {schema}.completed (queue, task_id, attempts, generation, available_at)
    VALUES (p_queue, p_task_id, v_row.attempts, v_row.generation, v_row.available_at);
END {dollar};

CREATE FUNCTION {schema}.ack_and_reserve(p_queue text, p_task_id bytea, p_worker bytea,
                                    p_generation bigint, p_lease_seconds bigint, p_limit integer)
RETURNS TABLE (task_id bytea, generation bigint, deadline bigint, attempts bigint, payload text)
LANGUAGE plpgsql AS {dollar}
#variable_conflict use_column
BEGIN
    IF p_lease_seconds > 9223372036854775807 - {schema}.clock() THEN
        RAISE EXCEPTION USING ERRCODE = 'WQ003',
            MESSAGE = 'now + lease_seconds = ' || ({schema}.clock()::numeric + p_lease_seconds) || ' is not below 2**63';
    END IF;
    PERFORM {schema}.ack(p_queue, p_task_id, p_worker, p_generation);
    RETURN QUERY SELECT * FROM {schema}.reserve(p_queue, p_worker, p_lease_seconds, p_limit);
END {dollar};

CREATE FUNCTION {schema}.release(p_queue text, p_task_id bytea, p_worker bytea, p_generation bigint,
                            p_delay bigint) RETURNS void LANGUAGE plpgsql AS {dollar}
DECLARE
    v_now bigint := {schema}.clock();
    v_row {schema}.live;
BEGIN
    IF p_delay > 9223372036854775807 - v_now THEN
        RAISE EXCEPTION USING ERRCODE = 'WQ003',
            MESSAGE = 'now + delay = ' || (v_now::numeric + p_delay) || ' is not below 2**63';
    END IF;
    v_row := {schema}.current_lease(p_queue, p_task_id, p_worker, p_generation, v_now);
    UPDATE {schema}.live
    SET status = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'ready' END,
        available_at = v_now + p_delay, deadline = NULL, worker = NULL
    WHERE queue = p_queue AND task_id = p_task_id;
    IF v_row.attempts < v_row.max_attempts THEN
        IF p_delay = 0 THEN
            PERFORM {schema}.announce(p_queue, 1, NULL);
        ELSE
            PERFORM {schema}.announce(p_queue, 0, v_now + p_delay);
        END IF;
    END IF;
END {dollar};

CREATE FUNCTION {schema}.touch(p_queue text, p_task_id bytea, p_worker bytea, p_generation bigint,
                          p_lease_seconds bigint)
RETURNS TABLE (deadline bigint, attempts bigint, payload text) LANGUAGE plpgsql AS {dollar}
#variable_conflict use_column
DECLARE
    v_now bigint := {schema}.clock();
BEGIN
    IF p_lease_seconds > 9223372036854775807 - v_now THEN
        RAISE EXCEPTION USING ERRCODE = 'WQ003',
            MESSAGE = 'now + lease_seconds = ' || (v_now::numeric + p_lease_seconds) || ' is not below 2**63';
    END IF;
    PERFORM {schema}.current_lease(p_queue, p_task_id, p_worker, p_generation, v_now);
    RETURN QUERY
    UPDATE {schema}.live AS l SET deadline = v_now + p_lease_seconds
    WHERE l.queue = p_queue AND l.task_id = p_task_id
    RETURNING l.deadline, l.attempts, l.payload;
END {dollar};

-- Every listed task must be dead (else InvalidRequest naming the first that
-- is not, nothing changed); each becomes ready now with attempts 0.
-- p_task_ids has no duplicates.
CREATE FUNCTION {schema}.revive(p_queue text, p_task_ids bytea[]) RETURNS void
LANGUAGE plpgsql AS {dollar}
DECLARE
    v_now bigint := {schema}.clock();
    v_found record;
    v_count bigint;
BEGIN
    -- Locked in task_id order, so two revives cannot deadlock.
    PERFORM 1 FROM {schema}.live WHERE queue = p_queue AND task_id = ANY (p_task_ids)
    ORDER BY task_id FOR UPDATE;
    SELECT wanted.ordinality - 1 AS index,
           CASE WHEN l.status IS NOT NULL THEN l.status
                WHEN c.task_id IS NOT NULL THEN 'completed' END AS status
    INTO v_found
    FROM unnest(p_task_ids) WITH ORDINALITY AS wanted(id, ordinality)
    LEFT JOIN {schema}.live AS l ON l.queue = p_queue AND l.task_id = wanted.id
    LEFT JOIN {schema}.completed AS c ON c.queue = p_queue AND c.task_id = wanted.id
    WHERE l.status IS DISTINCT FROM 'dead'
    ORDER BY l.status IS NOT NULL OR c.task_id IS NOT NULL, wanted.ordinality
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WQ003', MESSAGE = 'not dead',
            DETAIL = json_build_object('index', v_found.index, 'status', v_found.status)::text;
    END IF;
    UPDATE {schema}.live SET status = 'ready', attempts = 0, available_at = v_now
    WHERE queue = p_queue AND task_id = ANY (p_task_ids);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM {schema}.announce(p_queue, v_count, NULL);
END {dollar};

-- Every task with TaskView's fields, whichever table holds its state.
CREATE VIEW {schema}.task_view AS
    SELECT t.queue, t.task_id, t.key, coalesce(l.status, 'completed') AS status,
           coalesce(l.attempts, c.attempts) AS attempts, t.max_attempts,
           coalesce(l.generation, c.generation) AS generation,
           coalesce(l.available_at, c.available_at) AS available_at, l.deadline, l.worker, l.payload
    FROM {schema}.task AS t
    LEFT JOIN {schema}.live AS l ON l.queue = t.queue AND l.task_id = t.task_id
    LEFT JOIN {schema}.completed AS c ON c.queue = t.queue AND c.task_id = t.task_id;

CREATE FUNCTION {schema}.get(p_queue text, p_task_id bytea)
RETURNS TABLE (task_id bytea, key bytea, status text, attempts bigint, max_attempts bigint,
               generation bigint, available_at bigint, deadline bigint, worker bytea, payload text)
LANGUAGE sql STABLE AS {dollar}
    SELECT v.task_id, v.key, v.status, v.attempts, v.max_attempts, v.generation, v.available_at,
           v.deadline, v.worker, v.payload
    FROM {schema}.task_view AS v WHERE v.queue = p_queue AND v.task_id = p_task_id
{dollar};

CREATE FUNCTION {schema}.tasks(p_queue text, p_status text)
RETURNS TABLE (task_id bytea, key bytea, status text, attempts bigint, max_attempts bigint,
               generation bigint, available_at bigint, deadline bigint, worker bytea, payload text)
LANGUAGE sql STABLE AS {dollar}
    SELECT v.task_id, v.key, v.status, v.attempts, v.max_attempts, v.generation, v.available_at,
           v.deadline, v.worker, v.payload
    FROM {schema}.task_view AS v
    WHERE v.queue = p_queue AND (p_status IS NULL OR v.status = p_status)
    ORDER BY v.task_id
{dollar};

CREATE FUNCTION {schema}.stats(p_queue text)
RETURNS TABLE (ready bigint, leased bigint, completed bigint, dead bigint)
LANGUAGE sql STABLE AS {dollar}
    SELECT count(*) FILTER (WHERE l.status = 'ready'), count(*) FILTER (WHERE l.status = 'leased'),
           (SELECT count(*) FROM {schema}.completed AS c WHERE c.queue = p_queue),
           count(*) FILTER (WHERE l.status = 'dead')
    FROM {schema}.live AS l WHERE l.queue = p_queue
{dollar};

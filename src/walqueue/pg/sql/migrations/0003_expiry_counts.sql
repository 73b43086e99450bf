-- walqueue.pg schema version 3: leases expired, counted per queue (the dashboard's expiries per
-- second, issue 24).
--
-- A template like migration 1 (its header says how). It only adds (a table, two functions) and
-- replaces reap by one with the same signature and effect on the tasks, so its compatibility
-- version stays 1: clients of versions 1 and 2 go on working on a schema at version 3, and their
-- reserves count the leases they expire too (they call the replaced reap).
--
-- The count is one row per queue, added to by every reap that expired something. The table is
-- reached only through the two SECURITY DEFINER functions below, which run as the schema's owner:
-- a worker or dashboard role granted what docs/postgres.md lists before this migration needs no
-- new grant (functions are executable by PUBLIC unless revoked). Their search_path is fixed, and
-- they name every table by its schema. Any role that may call them can add to the count: it is a
-- figure for monitoring, never a decision, as NOTIFY's wakeups are (docs/postgres.md).

CREATE TABLE {schema}.expiry_count (
    queue   text   NOT NULL,
    expired bigint NOT NULL CHECK (expired >= 0),
    CONSTRAINT expiry_count_pkey PRIMARY KEY (queue)
);

CREATE FUNCTION {schema}.count_expired(p_queue text, p_count bigint) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS {dollar}
    INSERT INTO {schema}.expiry_count AS c (queue, expired) VALUES (p_queue, p_count)
    ON CONFLICT (queue) DO UPDATE SET expired = c.expired + excluded.expired;
{dollar};

CREATE FUNCTION {schema}.expired_total(p_queue text) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS {dollar}
    SELECT coalesce((SELECT c.expired FROM {schema}.expiry_count AS c WHERE c.queue = p_queue), 0);
{dollar};

-- Migration 1's reap, and the count of what it expired (ready or dead) added in the same
-- transaction: a reap rolled back counts nothing. Concurrent reaps of one queue expire disjoint
-- rows (SKIP LOCKED) and then queue on the queue's count row, only when they expired something.
CREATE OR REPLACE FUNCTION {schema}.reap(p_queue text, p_now bigint) RETURNS bigint LANGUAGE plpgsql AS {dollar}
DECLARE
    v_ready bigint;
    v_expired bigint;
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
    SELECT count(*) FILTER (WHERE status = 'ready'), count(*) INTO v_ready, v_expired FROM ended;
    IF v_expired > 0 THEN
        PERFORM {schema}.count_expired(p_queue, v_expired);
    END IF;
    PERFORM {schema}.announce(p_queue, v_ready, NULL);
    RETURN v_ready;
END {dollar};

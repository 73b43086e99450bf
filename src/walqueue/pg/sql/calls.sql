-- The API's statements, one per call (walqueue.pg.calls builds their parameters and reads their
-- rows). Each is a SELECT of one of the schema's functions, so one call is one statement: one
-- transaction and one round trip, prepared by the server on first use. Every answer is rows (a
-- void function gives one row holding NULL). Parameters and results travel in binary (%b, and
-- cursors made with binary=True); integers are sent as int8 or int4 whatever their values, so
-- each statement keeps one prepared form. Templates: see walqueue.pg.queries.

-- name: put
SELECT {schema}.put(%b, %b, %b, %b, %b, %b, %b)

-- name: put_one
-- One task: scalars, which cost the client far less to send than lists.
SELECT {schema}.put(%b, ARRAY[%b::bytea], ARRAY[%b::bytea], ARRAY[%b::bytea], ARRAY[%b::int8],
                    ARRAY[%b::int8], ARRAY[%b::text])

-- name: reserve
SELECT * FROM {schema}.reserve(%b, %b, %b, %b)

-- name: ack
SELECT {schema}.ack(%b, %b, %b, %b)

-- name: ack_and_reserve
SELECT * FROM {schema}.ack_and_reserve(%b, %b, %b, %b, %b, %b)

-- name: release
SELECT {schema}.release(%b, %b, %b, %b, %b)

-- name: touch
SELECT * FROM {schema}.touch(%b, %b, %b, %b, %b)

-- name: revive
SELECT {schema}.revive(%b, %b)

-- name: get
SELECT * FROM {schema}.get(%b, %b)

-- name: tasks
SELECT * FROM {schema}.tasks(%b, %b)

-- name: stats
SELECT * FROM {schema}.stats(%b)

-- name: setup
-- At connect: the settings that decide whether an answered write survives a crash (SPEC §9 warns
-- when either is off), and the server's clock, from which a client turns delay= into available_at.
SELECT current_setting('fsync'), current_setting('synchronous_commit'),
       extract(epoch FROM clock_timestamp())::float8

-- name: force_release
-- End the current leases of a list of tasks, all or none, in one statement (an operator's call).
-- The live rows are locked in task_id order (as revive's, so two cannot deadlock); if any task is
-- not leased, or its lease has expired, nothing is updated and the one row answers the first such
-- task's index and status. Otherwise each lease ends as a release at the server's now would
-- (ready, or dead at max_attempts; the generation stays, so the holder's next ack is stale) and
-- waiters hear of the ready ones.
WITH args AS (SELECT %b::text AS queue, %b::bytea[] AS ids, {schema}.clock() AS now),
locked AS (
    SELECT l.task_id, l.status, l.deadline FROM {schema}.live AS l, args
    WHERE l.queue = args.queue AND l.task_id = ANY (args.ids)
    ORDER BY l.task_id FOR UPDATE OF l
),
refused AS (
    SELECT w.ordinality - 1 AS index,
           CASE WHEN k.status = 'leased' THEN 'expired'
                WHEN k.status IS NOT NULL THEN k.status
                WHEN EXISTS (SELECT 1 FROM {schema}.completed AS c
                             WHERE c.queue = args.queue AND c.task_id = w.id)
                THEN 'completed' END AS status
    FROM args CROSS JOIN LATERAL unnest(args.ids) WITH ORDINALITY AS w(id, ordinality)
    LEFT JOIN locked AS k ON k.task_id = w.id
    WHERE k.status IS DISTINCT FROM 'leased' OR k.deadline <= args.now
    ORDER BY w.ordinality LIMIT 1
),
released AS (
    UPDATE {schema}.live AS l
    SET status = CASE WHEN l.attempts >= l.max_attempts THEN 'dead' ELSE 'ready' END,
        available_at = args.now, deadline = NULL, worker = NULL
    FROM args, locked
    WHERE NOT EXISTS (SELECT 1 FROM refused)
      AND l.queue = args.queue AND l.task_id = locked.task_id
    RETURNING l.status
)
SELECT (SELECT index FROM refused), (SELECT status FROM refused),
       {schema}.announce((SELECT queue FROM args),
                         (SELECT count(*) FROM released WHERE status = 'ready'), NULL)

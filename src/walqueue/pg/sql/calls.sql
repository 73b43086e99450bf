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

-- name: cancel
-- SPEC §8b: a dead task, or a ready one due at the server's now, becomes completed without being
-- leased, in this one statement. The live row is deleted only while it is in one of those states
-- (a DELETE re-checks its WHERE clause on the row's newest version after waiting for its lock, so
-- a task that a concurrent reserve leased, or a reap changed, is refused, never completed under
-- someone's lease); its tombstone gets the counters the daemon's records leave (walqueue.cancel:
-- attempts + 1, or 1 for a dead task, generation + 1, available_at now for a dead task). Its row
-- in task stays: the key is taken for ever. The one row answers whether it was cancelled, and the
-- task as the statement's snapshot saw it, from which a refusal's message is made.
WITH args AS (SELECT %b::text AS queue, %b::bytea AS id, {schema}.clock() AS now),
cancelled AS (
    DELETE FROM {schema}.live AS l USING args
    WHERE l.queue = args.queue AND l.task_id = args.id
      AND (l.status = 'dead' OR (l.status = 'ready' AND l.available_at <= args.now))
    RETURNING l.status, l.attempts, l.generation, l.available_at
),
tombstone AS (
    INSERT INTO {schema}.completed (queue, task_id, attempts, generation, available_at)
    SELECT args.queue, args.id, CASE WHEN c.status = 'dead' THEN 1 ELSE c.attempts + 1 END,
           c.generation + 1, CASE WHEN c.status = 'dead' THEN args.now ELSE c.available_at END
    FROM cancelled AS c, args
    RETURNING 1
)
SELECT (SELECT count(*) FROM tombstone), args.now, l.status, l.attempts, l.max_attempts,
       l.generation, l.available_at, l.deadline, l.worker,
       EXISTS (SELECT 1 FROM {schema}.completed AS c WHERE c.queue = args.queue AND c.task_id = args.id)
FROM args LEFT JOIN {schema}.live AS l ON l.queue = args.queue AND l.task_id = args.id

-- name: expired_total
-- The leases the queue's reaps expired since schema version 3 counted them (migration 0003).
SELECT {schema}.expired_total(%b)

-- name: workers
-- SPEC §8b on PostgreSQL: the workers seen in leases (a client's connections are not the
-- database's to see), with how many each holds, by name (bytea order is the UTF-8 order).
SELECT l.worker, count(*) FROM {schema}.live AS l
WHERE l.queue = %b AND l.status = 'leased'
GROUP BY l.worker ORDER BY l.worker

-- name: page_all
-- A page of every task after a cursor (SPEC §8b): task's primary key (queue, task_id) gives the
-- order, and the LIMIT stops the scan, so a page costs O(limit) whatever the history. The cursor
-- is '' for the first page (every id is longer); LIMIT NULL is no limit.
SELECT v.task_id, v.key, v.status, v.attempts, v.max_attempts, v.generation, v.available_at,
       v.deadline, v.worker, v.payload
FROM {schema}.task_view AS v WHERE v.queue = %b AND v.task_id > %b
ORDER BY v.task_id LIMIT %b

-- name: page_completed
-- A page of completed tasks: completed's primary key (queue, task_id).
SELECT c.task_id, t.key, 'completed', c.attempts, t.max_attempts, c.generation, c.available_at,
       NULL::bigint, NULL::bytea, NULL::text
FROM {schema}.completed AS c
JOIN {schema}.task AS t ON t.queue = c.queue AND t.task_id = c.task_id
WHERE c.queue = %b AND c.task_id > %b
ORDER BY c.task_id LIMIT %b

-- name: page_live
-- A page of ready, leased or dead tasks: the index live_status_task (queue, status, task_id) of
-- migration 2.
SELECT l.task_id, t.key, l.status, l.attempts, l.max_attempts, l.generation, l.available_at,
       l.deadline, l.worker, l.payload
FROM {schema}.live AS l
JOIN {schema}.task AS t ON t.queue = l.queue AND t.task_id = l.task_id
WHERE l.queue = %b AND l.status = %b AND l.task_id > %b
ORDER BY l.task_id LIMIT %b

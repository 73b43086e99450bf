-- The statements of walqueue.pg.wakeup: the listener's connection (LISTEN, its probe, the reaper,
-- the clean-up of the listener table) and a waiter's registration. Templates: see
-- walqueue.pg.queries.

-- name: listen
LISTEN {channel_name}

-- name: backend_pid
SELECT pg_backend_pid()

-- name: probe
-- A notification of our own: if it never arrives, LISTEN does not work here (a pooler).
SELECT pg_notify({channel}, %s)

-- name: register
-- Make writers of a queue notify this process (pid). One statement: the lock is taken (the CTE
-- runs first), then the row; the writers take the lock shared before they look for a listener.
-- RETURNING, so the answer is rows like every call's.
WITH locked AS (SELECT pg_advisory_xact_lock({lock}))
INSERT INTO {schema}.listener (queue, pid) SELECT %s, %s FROM locked
ON CONFLICT DO NOTHING RETURNING pid

-- name: unregister
DELETE FROM {schema}.listener WHERE queue = %s AND pid = %s

-- name: sweep
-- The rows of processes that are gone.
DELETE FROM {schema}.listener WHERE pid NOT IN (SELECT pid FROM pg_stat_activity)

-- name: reap
SELECT {schema}.reap(%s, {schema}.clock())

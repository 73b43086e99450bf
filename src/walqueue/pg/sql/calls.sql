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

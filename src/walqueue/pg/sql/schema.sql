-- The bookkeeping of walqueue.pg.schema: which migrations a schema has, and recording one.
-- Templates: see walqueue.pg.queries.

-- name: encoding
SHOW server_encoding

-- name: lock
SELECT pg_advisory_lock(%s)

-- name: unlock
SELECT pg_advisory_unlock(%s)

-- name: exists
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables
               WHERE schemaname = %s AND tablename = 'schema_migrations')

-- name: installed
-- The schema's version and compatibility version: its newest migration's. Read through to_jsonb,
-- so the table of a schema made before the compatibility_version column reads NULL there.
SELECT m.version, (to_jsonb(m) ->> 'compatibility_version')::integer
FROM {schema}.schema_migrations AS m ORDER BY m.version DESC LIMIT 1

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: create_migrations_table
-- compatibility_version: the oldest schema version whose clients can use the schema at this
-- migration's version (walqueue.pg.schema.check_version).
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version integer PRIMARY KEY,
    description text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    compatibility_version integer
)

-- name: add_compatibility_column
-- For a schema whose table was made before the column existed.
ALTER TABLE {schema}.schema_migrations ADD COLUMN IF NOT EXISTS compatibility_version integer

-- name: record_migration
INSERT INTO {schema}.schema_migrations (version, description, compatibility_version)
VALUES (%s, %s, %s)

-- Test-only (tests/pg): clock() honours the session setting walqueue.test_now when set.
-- Installed by walqueue.pg.schema.install_test_clock(), never by a migration, so in production no
-- client can move the queue's clock. The same placeholders as the migrations.

CREATE OR REPLACE FUNCTION {schema}.clock() RETURNS bigint LANGUAGE sql STABLE AS
{dollar} SELECT coalesce(nullif(current_setting('walqueue.test_now', true), '')::bigint,
                   floor(extract(epoch FROM transaction_timestamp()))::bigint) {dollar};

-- Test-only (tests/pg/clock.py): a clock the tests set. clock() reads the one row of test_clock
-- while it holds a time, else the transaction's time as the migration's clock() does.
-- Installed by tests/pg/clock.py's install_test_clock, never by walqueue: the package does not
-- carry this file, so no production database gets a clock that its clients can move. The
-- placeholders are the migrations' (walqueue.pg.queries).

CREATE TABLE {schema}.test_clock (now bigint);
INSERT INTO {schema}.test_clock VALUES (NULL);

CREATE OR REPLACE FUNCTION {schema}.clock() RETURNS bigint LANGUAGE sql STABLE AS
{dollar} SELECT coalesce((SELECT now FROM {schema}.test_clock),
                         floor(extract(epoch FROM transaction_timestamp()))::bigint) {dollar};

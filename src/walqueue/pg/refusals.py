"""Connection failures no retry can cure: a database that does not exist, a refused login.

When PostgreSQL answers a connection with one of these, waiting cannot
help: the pool would try again for `connect_seconds` (30 s under
walqueue-ctl), logging a warning per attempt, and then fail with a message
that hides the cause. `refusal(error, dsn)` says whether a connect error is
one, and if so gives `DatabaseRefused`, raised at once with one message.

How one is recognised: libpq reports a failed connection without a SQLSTATE
(psycopg's `sqlstate` is None then), so the server's words are matched,
PostgreSQL's own messages for SQLSTATE 3D000 (invalid_catalog_name), 28P01
(invalid_password), 28000 (invalid_authorization_specification) and 42501
(no CONNECT privilege), and libpq's for a missing password. A SQLSTATE, when
psycopg has one, decides first. A server whose lc_messages is not English
words these differently: such a failure is then treated as curable, as
before (the pool waits for it), never the other way round.

A DSN libpq cannot parse is refused earlier still, by calls.check_dsn.
"""

from __future__ import annotations

import re

import psycopg

from walqueue.dsn import redacted
from walqueue.errors import WalQueueError

# SQLSTATE -> what it means for the operator (and which part of the DSN to check).
INCURABLE_STATES = {
    "3D000": "the database does not exist: check the DSN's dbname",
    "28P01": "the password was refused: check the role's password (~/.pgpass, PGPASSWORD)",
    "28000": "the role may not log in this way: check the DSN's user and pg_hba.conf",
    "42501": "the role may not connect to this database: GRANT CONNECT ON DATABASE to it",
}
# The server's (and libpq's) words for each, where no SQLSTATE comes with the error.
INCURABLE_MESSAGES = (
    (re.compile(r'database "[^"]*" does not exist'), "3D000"),
    (re.compile(r"password authentication failed for user"), "28P01"),
    (re.compile(r"fe_sendauth: no password supplied"), "28P01"),
    (re.compile(r'role "[^"]*" does not exist'), "28000"),
    (re.compile(r'role "[^"]*" is not permitted to log in'), "28000"),
    (re.compile(r"no pg_hba\.conf entry for"), "28000"),
    (re.compile(r"\b(Peer|Ident|GSSAPI|SSPI|LDAP|RADIUS|PAM|certificate) authentication failed"),
     "28000"),
    (re.compile(r"permission denied for database"), "42501"),
)


class DatabaseRefused(WalQueueError):
    """PostgreSQL answered and refused this client for a reason no retry can cure.

    Raised at once when a client connects (not after `connect_seconds`):
    the database does not exist, the password or the role was refused, or
    the role may not connect. `sqlstate` says which; the message names the
    database without its password, quotes the server, and says what to check.
    """

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def incurable_state(error: psycopg.Error) -> str | None:
    """The SQLSTATE of an incurable connection failure, or None for any other error."""
    state = error.sqlstate
    if state is not None:
        return state if state in INCURABLE_STATES else None
    text = str(error)
    for pattern, code in INCURABLE_MESSAGES:
        if pattern.search(text):
            return code
    return None


def refusal(error: psycopg.Error, dsn: str, where: str) -> DatabaseRefused | None:
    """DatabaseRefused for a connection `error` no retry cures, or None.

    `where` names the database (calls.describe); every text is shown without
    the DSN's password.
    """
    state = incurable_state(error)
    if state is None:
        return None
    said = " ".join(redacted(str(error), dsn).split())
    return DatabaseRefused(f"PostgreSQL at {where} refused this client ({said}); "
                           f"{INCURABLE_STATES[state]} (SQLSTATE {state}). Retrying cannot help, "
                           f"so nothing was retried.", state)


__all__ = ["INCURABLE_STATES", "DatabaseRefused", "incurable_state", "refusal"]

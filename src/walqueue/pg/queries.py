"""walqueue.pg's SQL as SQL: files of package data, loaded once, composed for one schema.

    sql/migrations/NNNN_*.sql  the migrations, numbered (walqueue.pg.schema)
    sql/schema.sql             the bookkeeping of migrations and versions (walqueue.pg.schema)
    sql/calls.sql              the API's statements, one per call (walqueue.pg.calls)
    sql/wakeup.sql             the listener's, reaper's and waiters' statements (walqueue.pg.wakeup)

The files are read through importlib.resources, each once per process. A
query file is a list of named queries: each starts at a line
`-- name: NAME` and runs to the next; its other whole-line `--` comments are
documentation and are not sent. A migration is one script.

Every text is a template for psycopg's sql.SQL.format, never for text
replacement. Its placeholders, each a name in braces:

    {schema}        the schema, an sql.Identifier
    {channel}       its NOTIFY channel ("walqueue:" + the schema), an sql.Literal
    {channel_name}  the same channel as an sql.Identifier (for LISTEN)
    {lock}          the registration lock key (walqueue.pg.wakeup), an sql.Literal
    {dollar}        a dollar quote whose tag the schema's name does not contain, around
                    function bodies, so no name can end a body early

format() looks for placeholders in the template only, never in what it puts
in, and none may stand in a comment (a name holding a newline would end the
comment). So any schema name calls.schema_name accepts is only ever a
quoted name or a literal.

`%` in a named query marks a parameter (`%b`, `%s`) and nothing else. psycopg
parses the text of a statement run with parameters for placeholders and
does not escape a `%` inside an identifier or a literal (psycopg/psycopg2#825,
the same in psycopg 3), so in a query that has parameters every value put
in has its `%` doubled; a query without one is sent as composed, and run
without parameters (None: an empty tuple would make psycopg parse it too).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
from importlib import resources

from psycopg import sql

SQL_PACKAGE = "walqueue.pg"
SQL_DIRECTORY = "sql"
MIGRATIONS_DIRECTORY = "migrations"
# The channel the functions NOTIFY on; one per schema, the queue in the payload.
CHANNEL_PREFIX = "walqueue:"
NAME_LINE = re.compile(r"--\s*name:\s*(\S+)\s*$")


def sql_text(*path: str) -> str:
    """The text of sql/PATH..., package data read through importlib.resources."""
    return resources.files(SQL_PACKAGE).joinpath(SQL_DIRECTORY, *path).read_text(encoding="utf-8")


@functools.cache
def named_queries(file: str) -> dict[str, str]:
    """The queries of sql/FILE by name, their templates without the comment lines.

    Raises ValueError for a file whose text before its first name is not
    comments, or that names a query twice or leaves one empty.
    """
    queries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for number, line in enumerate(sql_text(file).splitlines(), 1):
        found = NAME_LINE.match(line.strip())
        if found:
            if found[1] in queries:
                raise ValueError(f"sql/{file}:{number}: the query {found[1]!r} is named twice")
            current = queries[found[1]] = []
        elif line.strip().startswith("--") or not line.strip():
            continue
        elif current is None:
            raise ValueError(f"sql/{file}:{number}: SQL before the first `-- name:` line")
        else:
            current.append(line.rstrip())
    for name, lines in queries.items():
        if not lines:
            raise ValueError(f"sql/{file}: the query {name!r} is empty")
    return {name: "\n".join(lines) for name, lines in queries.items()}


def channel(schema: str) -> str:
    return CHANNEL_PREFIX + schema


def lock_key(schema: str) -> int:
    """The advisory lock key under which a schema is created or migrated."""
    digest = hashlib.sha256(f"walqueue.pg.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def registration_lock_key(schema: str) -> int:
    """The advisory lock that orders a waiter's registration against writers' NOTIFY checks."""
    return lock_key(schema) ^ 1


def dollar_quote(schema: str) -> sql.SQL:
    """A dollar quote for the function bodies whose tag does not occur in `schema`.

    Identifier quoting does not protect a body: inside `$$ ... $$` a schema
    named `a$$b` would end the body. The tag cannot occur in the channel
    literal either (its prefix holds no `$`) nor span a quoted name's edge.
    """
    for number in itertools.count():
        tag = f"$wq{number or ''}$"
        if tag not in schema:
            return sql.SQL(tag)
    raise AssertionError("unreachable")


def _values(schema: str) -> dict[str, sql.Composable]:
    return {"schema": sql.Identifier(schema), "channel": sql.Literal(channel(schema)),
            "channel_name": sql.Identifier(channel(schema)),
            "lock": sql.Literal(registration_lock_key(schema)), "dollar": dollar_quote(schema)}


def compose(template: str, schema: str) -> sql.Composed:
    """`template` (a migration, or a query without parameters) filled in for `schema`."""
    return sql.SQL(template).format(**_values(schema))


def statement(template: str, schema: str) -> str:
    """`template` filled in for `schema`, as the text to run (see the module docstring on `%`)."""
    if "%" not in template:
        return compose(template, schema).as_string(None)
    doubled = {name: sql.SQL(value.as_string(None).replace("%", "%%"))
               for name, value in _values(schema).items()}
    return sql.SQL(template).format(**doubled).as_string(None)


class Queries:
    """The named queries of one file composed for one schema, as attributes (``queries.put``).

    Composed once, when made: statements are plain text, which psycopg
    parses once per text and the server prepares once per connection.
    """

    def __init__(self, file: str, schema: str) -> None:
        self.file = file
        self.names = frozenset(named_queries(file))
        for name, template in named_queries(file).items():
            setattr(self, name, statement(template, schema))

    def __getattr__(self, name: str) -> str:
        # Only for a name the file lacks (the others are instance attributes).
        raise AttributeError(f"sql/{self.__dict__.get('file')} has no query named {name!r}")

"""walqueue.dsn.redacted: a DSN's passwords never reach what is printed (SPEC §8b).

Written-out cases for each form (URL, URL query, key=value quoted and not,
escapes, odd inputs, libpq's messages quoting a DSN it cannot parse), then
derandomized hypothesis runs: for any password, in every form libpq reads
back as that password, the redacted DSN is the same DSN with `***` for it.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from walqueue.dsn import MASK, redacted

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True)


@pytest.mark.parametrize("dsn, shown", [
    ("postgresql://worker:s3cretpw@/jobs", "postgresql://worker:***@/jobs"),
    ("postgres://worker:s3cretpw@db.internal:5432/jobs", "postgres://worker:***@db.internal:5432/jobs"),
    ("POSTGRESQL://worker:s3cretpw@db/jobs", "POSTGRESQL://worker:***@db/jobs"),
    ("postgresql://worker:s3cret%20pw%40x@db/jobs", "postgresql://worker:***@db/jobs"),
    # Not valid URLs, but what the user meant as the password is masked whole.
    ("postgresql://worker:p@ss@db/jobs", "postgresql://worker:***@db/jobs"),
    ("postgresql://worker:pa/ss@db/jobs", "postgresql://worker:***@db/jobs"),
    ("postgresql://worker:a b c@db/jobs", "postgresql://worker:***@db/jobs"),
    ("postgresql://worker:p:q@db1:5432,db2:5433/jobs?target_session_attrs=read-write",
     "postgresql://worker:***@db1:5432,db2:5433/jobs?target_session_attrs=read-write"),
    ("postgresql://worker:pw@[::1]:5432/jobs", "postgresql://worker:***@[::1]:5432/jobs"),
    ("postgresql://worker:@db/jobs", "postgresql://worker:***@db/jobs"),
    # The query: password and sslpassword, whatever else is around them.
    ("postgresql:///jobs?host=/run/pg&password=qpw9&port=5433",
     "postgresql:///jobs?host=/run/pg&password=***&port=5433"),
    ("postgresql://worker:pw@db/jobs?password=qpw9", "postgresql://worker:***@db/jobs?password=***"),
    ("postgresql://db/jobs?sslpassword=k3y&sslmode=verify-full",
     "postgresql://db/jobs?sslpassword=***&sslmode=verify-full"),
    ("postgresql://db/jobs?pass%77ord=qpw9", "postgresql://db/jobs?pass%77ord=***"),
    ("postgresql://db/jobs?password=a&b&host=x", "postgresql://db/jobs?password=***&host=x"),
    # Nothing secret: shown as given.
    ("postgresql://worker@db/jobs", "postgresql://worker@db/jobs"),
    ("postgresql://db:5432/jobs?sslmode=require", "postgresql://db:5432/jobs?sslmode=require"),
    ("postgresql://[::1]:5432/jobs", "postgresql://[::1]:5432/jobs"),
    ("postgresql:///jobs?host=/run/pg", "postgresql:///jobs?host=/run/pg"),
])
def test_a_url_shows_everything_but_its_passwords(dsn, shown):
    assert redacted(dsn) == shown


@pytest.mark.parametrize("dsn, shown", [
    ("host=/run/pg user=worker password=s3cretpw dbname=jobs", "host=/run/pg user=worker password=*** dbname=jobs"),
    ("host=db password='s3cret pw' dbname=jobs", "host=db password=*** dbname=jobs"),
    ("host=db password='it\\'s a \\\\ secret' dbname=jobs", "host=db password=*** dbname=jobs"),
    ("host=db password=a\\ b\\'c dbname=jobs", "host=db password=*** dbname=jobs"),
    ("host=db password=a\\ b=c dbname=jobs", "host=db password=*** dbname=jobs"),
    ("host=db password = s3cretpw dbname=jobs", "host=db password = *** dbname=jobs"),
    ("host=db PASSWORD=s3cretpw", "host=db PASSWORD=***"),
    ("host=db sslpassword=k3y sslmode=verify-full", "host=db sslpassword=*** sslmode=verify-full"),
    ("password=s3cretpw", "password=***"),
    # libpq reads the value after "= " as "host=x": it is the password.
    ("password= host=x", "password= ***"),
    # Not valid, but every piece that may be the password is masked.
    ("host=db password=abc def dbname=jobs", "host=db password=*** dbname=jobs"),
    ("host=db password='never closed dbname=jobs", "host=db password=***"),
    ("host=db password=", "host=db password=***"),
    ("host=db password=\\", "host=db password=***"),
    ("host=db password=pw postgresql://u:pw2@h/db", "host=db password=***"),
    ("postgresql://u:pw@h/db password=pw2", "postgresql://u:***@h/db password=***"),
    # Nothing secret.
    ("host=db user=worker dbname=jobs passfile=/etc/pgpass", "host=db user=worker dbname=jobs passfile=/etc/pgpass"),
])
def test_key_value_form_shows_everything_but_its_passwords(dsn, shown):
    assert redacted(dsn) == shown


@pytest.mark.parametrize("text", ["", " ", "postgresql://", "postgresql://@", "/run/walqueue/orders/walqueued.sock",
                                  "var/walqueue", "password", "a=b c=d", "://u:p@h"])
def test_text_without_a_password_is_unchanged(text):
    assert redacted(text) == text


def test_odd_inputs_are_masked_or_refused_clearly():
    assert redacted("postgresql://:@") == "postgresql://:***@"
    assert redacted("postgresql://u:p") == "postgresql://u:p"  # no "@": u is a host, p its port
    with pytest.raises(TypeError, match="str, got bytes"):
        redacted(b"postgresql://u:p@h/db")
    with pytest.raises(TypeError, match="dsn as a str or None, got int"):
        redacted("text", 5)


@pytest.mark.parametrize("message, dsn, shown", [
    # What libpq says of DSNs it cannot parse: it quotes pieces of them.
    ('invalid percent-encoded token: "s3c%zzret"\n', "postgresql://worker:s3c%zzret@/jobs",
     'invalid percent-encoded token: "***"\n'),
    ('missing "=" after "def" in connection info string\n', "host=/x password=abc def",
     'missing "=" after "***" in connection info string\n'),
    ('unexpected spaces found in "s3cret pw", use percent-encoded spaces (%20) instead\n',
     "postgresql://u:s3cret pw@/db", 'unexpected spaces found in "***", use percent-encoded spaces (%20) instead\n'),
    ('end of string reached when looking for matching "]" in IPv6 host address in URI: "postgresql://u:pw@[::1/db"\n',
     "postgresql://u:pw@[::1/db",
     'end of string reached when looking for matching "]" in IPv6 host address in URI: "postgresql://u:***@[::1/db"\n'),
    ('invalid URI query parameter: "passwrd"', "postgresql://u:pw@h/db?passwrd=x",
     'invalid URI query parameter: "passwrd"'),
    # The password decoded, and a short one only where it stands alone.
    ("role rejected s3cret pw", "postgresql://u:s3cret%20pw@h/db", "role rejected ***"),
    ('after "pw" in a password string', "host=h password=pw", 'after "***" in a password string'),
])
def test_with_the_dsn_its_passwords_are_masked_in_any_message(message, dsn, shown):
    assert redacted(message, dsn) == shown


def test_a_message_built_of_redacted_parts_is_left_as_it_is():
    dsn = "host=/run/pg password=abc def"
    message = f"cannot parse the DSN {redacted(dsn)}: {redacted('missing \"=\" after \"def\"', dsn)}"
    assert message == 'cannot parse the DSN host=/run/pg password=***: missing "=" after "***"'
    assert redacted(message, dsn) == message
    path_message = ("cannot connect to walqueued at host=/x password='s3cret pw' dbname=jobs: no such file "
                    "(is walqueued running?)")
    shown = "cannot connect to walqueued at host=/x password=*** dbname=jobs: no such file (is walqueued running?)"
    assert redacted(path_message) == shown and redacted(shown) == shown


# Passwords of any characters; the DSN around them uses none of theirs so a leak shows.
passwords = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=40)


def kv_quoted(password: str) -> str:
    return "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"


def kv_unquoted(password: str) -> str:
    return re.sub(r"([\\'\s])", r"\\\1", password)


def libpq_password(dsn: str) -> str | None:
    conninfo = pytest.importorskip("psycopg.conninfo")
    return conninfo.conninfo_to_dict(dsn).get("password")


@PROPERTY
@given(password=passwords)
def test_any_password_libpq_reads_from_a_url_is_masked(password):
    dsn = f"postgresql://worker:{quote(password, safe='')}@db/jobs"
    assert libpq_password(dsn) == password
    assert redacted(dsn) == "postgresql://worker:***@db/jobs"
    assert redacted(f"cannot reach {redacted(dsn)}: down", dsn) == "cannot reach postgresql://worker:***@db/jobs: down"
    query = f"postgresql:///jobs?host=/run/pg&password={quote(password, safe='')}&port=5433"
    assert libpq_password(query) == password
    assert redacted(query) == "postgresql:///jobs?host=/run/pg&password=***&port=5433"


@PROPERTY
@given(password=passwords)
def test_any_password_libpq_reads_from_key_value_form_is_masked(password):
    for written in (kv_quoted(password), kv_unquoted(password)):
        dsn = f"host=/run/pg password={written} dbname=jobs"
        assert libpq_password(dsn) == password
        assert redacted(dsn) == "host=/run/pg password=*** dbname=jobs"
        assert redacted(redacted(dsn), dsn) == "host=/run/pg password=*** dbname=jobs"


@PROPERTY
@given(password=st.text(st.characters(codec="ascii", categories=["L", "N", "P", "S"]), min_size=4, max_size=30))
def test_libpq_never_quotes_a_password_the_message_then_shows(password):
    """Whatever libpq says of a DSN with this password written raw, redacted with the DSN masks it."""
    psycopg = pytest.importorskip("psycopg")

    for template in ("postgresql://worker:{}@db/jobs", "host=/run/pg password={} dbname=jobs",
                     "host=/run/pg password={} spaced dbname=jobs"):
        dsn = template.format(password)
        try:
            psycopg.conninfo.conninfo_to_dict(dsn)
        except (psycopg.ProgrammingError, UnicodeDecodeError) as error:
            assert password not in redacted(str(error), dsn)
        if password not in template.format(MASK):  # else it is also a piece of the rest ("work")
            assert password not in redacted(dsn)
        assert MASK in redacted(dsn)

"""The PostgreSQL examples of the docs run as they stand, against the session's server.

A fenced block marked ```` ```python run pg ```` (docs/postgres.md's first
example) runs in a fresh interpreter with every `postgresql://...` DSN in it
replaced by the test server's: the one substitution, so that a reader's DSN
(`postgresql://app@db.internal/jobs`) reaches a database that exists here.
tests/process/test_doc_examples.py runs the other examples and requires
every block of docs/postgres.md to be one or to say why not.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.process.test_doc_examples import DOCUMENTS, Block, blocks

EXAMPLE_SECONDS = 120.0
DSN = re.compile(r"postgresql://[^\"'\s]+")
PG_EXAMPLES = [block for document in DOCUMENTS for block in blocks(document)
               if "run" in block.words and "pg" in block.words]


def test_the_postgres_document_holds_a_pg_example():
    assert any(block.document.name == "postgres.md" for block in PG_EXAMPLES)


@pytest.mark.parametrize("example", PG_EXAMPLES, ids=[block.name for block in PG_EXAMPLES])
def test_the_pg_example_runs_as_documented(example: Block, postgres):
    assert example.language == "python"
    assert DSN.search(example.code), f"{example.name} names no postgresql:// DSN to replace"
    code = DSN.sub(lambda _: postgres.dsn, example.code)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=EXAMPLE_SECONDS)
    assert result.returncode == 0, f"{example.name} failed:\n{result.stdout}\n{result.stderr}"
    if example.expected_output is not None:
        assert result.stdout == example.expected_output

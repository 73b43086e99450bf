"""Deliberately broken variants of walqueue-web, each one plausible change, applied by patching
one function for the length of a test. tests/unit/test_web.py runs its own checks under each
and requires them to go red (they are green on the real code), so none of them is a test that
cannot fail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

from walqueue.web import bounds, formatting, pages, source


def _templates_without_autoescape():
    templates = ORIGINAL_TEMPLATES()
    templates.env.autoescape = False
    return templates


ORIGINAL_TEMPLATES = pages.templates


def _whole_listing(self, status, after, limit):
    """A listing that reads the whole queue and cuts it (what an unpaged client does)."""
    rows = [task for task in self.client.tasks(status) if after is None or task.task_id > after]
    return rows[:limit]


VARIANTS = {
    # Names shown as they are: bidi and escape characters reach the page raw.
    "names_unescaped": lambda: mock.patch.dict(formatting.FILTERS, {"name": lambda value: value or "-"}),
    # Jinja2 without HTML escaping: a <script> id is a script.
    "no_autoescape": lambda: mock.patch.object(pages, "templates", _templates_without_autoescape),
    # A CSRF check that accepts anything.
    "csrf_always_valid": lambda: mock.patch.object(pages, "csrf_valid", lambda *args: True),
    # No head deadline: a silent connection holds its slot for ever.
    "no_head_deadline": lambda: mock.patch.object(bounds.BoundedH11Protocol, "_arm_head_deadline",
                                                  lambda self: None),
    # Pages cut from the whole listing.
    "whole_listing": lambda: mock.patch.object(source.Source, "_listing", _whole_listing),
}


@contextlib.contextmanager
def active(name: str) -> Iterator[None]:
    with VARIANTS[name]():
        yield


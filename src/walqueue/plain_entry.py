"""The canonical JSON of a plain tombstone entry, matched without a JSON decoder (issue 22).

A tombstone's snapshot entry (SPEC §4) in canonical JSON is a fixed shape.
`ENTRY` matches exactly the canonical entries whose id and key are printable
ASCII without a quote or backslash (so they need no escape) and whose numbers
have the canonical form; the groups are attempts, available_at, generation,
identity (hex), key, max_attempts, task_id. Any other entry is left to the
JSON reader. The numbers' range and relations are the caller's to check.

A module of its own, below the frame codec, because both readers of it sit
there: the pure reader (snapshot, through tombstones) and the compiled one
(walqueue._speedups.c's match_entry is this pattern written out by hand;
codec.scan_frames hands the extension a `stop` only when it is this object).
"""

from __future__ import annotations

import re

_INTEGER = rb"(0|[1-9][0-9]{0,18})"
_PLAIN_NAME = rb'"([ !#-\[\]-~]{1,1024})"'
ENTRY = re.compile(
    rb'\{"attempts":' + _INTEGER + rb',"available_at":' + _INTEGER + rb',"deadline":null,'
    rb'"generation":' + _INTEGER + rb',"identity":"([0-9a-f]{64})","key":' + _PLAIN_NAME
    + rb',"max_attempts":' + _INTEGER + rb',"payload":null,"status":"completed",'
    rb'"task_id":' + _PLAIN_NAME + rb',"worker":null\}')

"""The walqueued wire protocol, with no I/O: one module per concept.

    messages.py     every request and answer as a msgspec Struct, the tagged unions,
                    the protocol versions and the error codes
    framing.py      the length prefix, frames to and from messages, FrameReader
                    (the byte layout and "a frame is valid if and only if" are there)
    bounds.py       the request bounds: a hostile body refused before it costs a step
                    per value (the peek, container counts, the duplicate-key walk,
                    puts the library would refuse)
    conversions.py  wire objects to and from the library's dataclasses
    errors.py       exceptions to and from ``Error`` answers, by stable codes

The first request on a connection is ``Hello`` carrying a protocol version;
every request carries a client-chosen integer ``id`` that its answer (or
answers, see ``more``) echoes, so requests may be pipelined. List answers
that would not fit in one frame (``Leases``, ``TaskList``) are split into
several messages with the same id; all but the last have ``more=True``.

Errors cross the wire as ``Error(error=<library exception class name>,
message=..., code=...)``; a ``StaleLease`` also carries the task's current
``task_id``, ``status`` and ``generation``. ``fatal=True`` means the server
closes the connection after sending it (bad framing, undecodable or
out-of-order message). docs/protocol.md is the contract.

``from walqueue import protocol as p`` gives every public name of the five
modules as ``p.<name>`` (each module's ``__all__``), so a new message is
declared in messages.py alone.
"""

from walqueue.protocol import bounds, conversions, errors, framing, messages
from walqueue.protocol.bounds import *  # noqa: F403
from walqueue.protocol.conversions import *  # noqa: F403
from walqueue.protocol.errors import *  # noqa: F403
from walqueue.protocol.framing import *  # noqa: F403
from walqueue.protocol.messages import *  # noqa: F403

__all__ = [*messages.__all__, *framing.__all__, *bounds.__all__, *conversions.__all__, *errors.__all__]

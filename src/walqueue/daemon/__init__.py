"""walqueued: one process owning one Engine, serving local workers over a Unix socket.

One module per concept (docs/daemon.md, "Inside walqueued"):

* ``service``: the sans-IO core. It owns the Engine, takes decoded requests
  and the turn's ``now``, and produces answers and parked waits: pause,
  backup pins, the parking policy, the chunking of list answers. No sockets,
  selectors, clocks, signals or threads.
* ``commit``: group commit. One ``queue.batch()`` per turn, its fsync, and
  the reopen after a failed write (catching only what a failed write
  raises); compaction is driven from here.
* ``connection``: one client connection: framing, hello, admission of large
  frames, output buffers, backlog and deferral.
* ``loop``: the selector loop, timers, signals, accept and the shutdown drain.
* ``systemd``: sd_notify (READY, STOPPING, WATCHDOG, STATUS,
  EXTEND_TIMEOUT_USEC) and socket activation.
* ``recorder``, ``metrics_http`` and ``metrics_textfile``: the daemon's figures, GET /metrics
  and the textfile.
* ``cli``: the ``walqueued`` command.

Nothing here imports walqueue.client (or aio, worker): the daemon and its
clients share only walqueue.protocol, walqueue.metrics and
walqueue.unix_socket (tests/unit/test_layers.py).
"""

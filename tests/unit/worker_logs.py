"""Wait for a Worker's log line (an event, not a poll): the Worker logs from its own threads."""

import logging
import threading

REAL_SECONDS = 20.0


class LogWaiter(logging.Handler):
    """Collects walqueue.worker's messages; ``wait_for(text)`` returns once one contains it."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []
        self._changed = threading.Condition()

    def emit(self, record):
        with self._changed:
            self.messages.append(record.getMessage())
            self._changed.notify_all()

    def wait_for(self, text):
        with self._changed:
            if not self._changed.wait_for(lambda: any(text in m for m in self.messages), REAL_SECONDS):
                raise AssertionError(f"no log line with {text!r} in {REAL_SECONDS} s: {self.messages}")
        return next(m for m in self.messages if text in m)

    def __enter__(self):
        logger = logging.getLogger("walqueue.worker")
        self._level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc_info):
        logger = logging.getLogger("walqueue.worker")
        logger.removeHandler(self)
        logger.setLevel(self._level)

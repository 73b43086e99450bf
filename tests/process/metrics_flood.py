"""An attacker on the metrics endpoint: ``python -m tests.process.metrics_flood PORT HOLD silent|trickle``.

It keeps HOLD connections to 127.0.0.1:PORT open at all times and never
finishes a request: ``silent`` sends nothing, ``trickle`` sends the start of
a request head and then one more byte of a header on each connection every
TRICKLE_SECONDS. Whatever the endpoint sends or closes is replaced at once by
a new connection, so a slot the endpoint frees is taken again. It prints
``holding`` once it has established HOLD connections (the test waits for that
line) and runs until the test kills it by pid.
"""

import errno
import selectors
import socket
import sys
import time

TRICKLE_SECONDS = 0.2
HEAD_START = b"GET /metrics HTTP/1.1\r\nX-Slow: "


def main(port: int, hold: int, mode: str) -> None:
    selector = selectors.DefaultSelector()
    connected: set[socket.socket] = set()
    established = 0
    announced = False

    def open_one() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(("127.0.0.1", port))
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            raise SystemExit(f"connect failed: {errno.errorcode.get(code, code)}")
        selector.register(sock, selectors.EVENT_WRITE, "connecting")

    def replace(sock: socket.socket) -> None:
        selector.unregister(sock)
        connected.discard(sock)
        sock.close()
        open_one()

    for _ in range(hold):
        open_one()
    next_trickle = time.monotonic() + TRICKLE_SECONDS
    while True:
        for key, _ in selector.select(max(0.0, next_trickle - time.monotonic())):
            sock = key.fileobj
            if key.data == "connecting":
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    replace(sock)
                    continue
                if mode == "trickle":
                    try:
                        sock.send(HEAD_START)
                    except OSError:
                        replace(sock)
                        continue
                connected.add(sock)
                established += 1
                selector.modify(sock, selectors.EVENT_READ, "open")
            else:
                replace(sock)  # an answer (503, 408) or the endpoint closed it: take another slot
        if not announced and established >= hold:
            print("holding", flush=True)
            announced = True
        if mode == "trickle" and time.monotonic() >= next_trickle:
            for sock in list(connected):
                try:
                    sock.send(b"x")
                except OSError:
                    replace(sock)
            next_trickle = time.monotonic() + TRICKLE_SECONDS
        elif mode != "trickle":
            next_trickle = time.monotonic() + 3600


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

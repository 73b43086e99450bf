#!/usr/bin/env python3
"""A/B walqueued's CPU per request, in-process, turn by turn: low noise on a busy machine. Not a test.

    .venv/bin/python scripts/bench_turns.py [OTHER_SRC] [--clients 16] [--mode ack_and_reserve]
    .venv/bin/python scripts/bench_turns.py [OTHER_SRC] --callgrind --cycles 50 [--clients 16]

The daemon's loop (walqueue.daemon.loop.Loop) runs in this process over
real Unix sockets, on a queue directory in /dev/shm (so an fsync costs next
to nothing: this measures the daemon's own code, not the disk). Each turn,
every one of ``--clients`` connections has exactly one request waiting, as
closed-loop clients have: put then ack_and_reserve (``--mode
ack_and_reserve``), or put, reserve, ack (``--mode client``). Only the time
inside ``Loop.one_turn`` is counted (thread CPU time), so the driver's own
work — a client's encoding and decoding, written here against msgspec
alone, the same for every tree — is left out.

With OTHER_SRC (another tree's ``src``, e.g. a ``git worktree`` of the
base), the two trees run alternately in fresh processes for ``--rounds``
rounds, and the median and minimum of each are reported. ``--child`` runs
one measurement and prints it as JSON. ``--callgrind`` counts instructions
instead, which do not depend on the machine's load: two runs under
valgrind's callgrind, one ``--cycles`` longer than the other, subtracted,
give instructions per request without startup (the driver's included: compare
trees by difference).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(src: str, clients: int, mode: str, warmup_cycles: int, cycles: int) -> dict:
    sys.path.insert(0, os.path.abspath(src))
    import socket
    import struct
    import tempfile
    import time

    import msgspec

    try:  # the daemon serves an Engine; a tree from before walqueue.engine served a Queue
        from walqueue.engine import Engine as open_queue
    except ImportError:
        from walqueue import Queue as open_queue
    from walqueue.daemon.loop import Loop, bind_listener
    from walqueue.daemon.systemd import Notifier

    # The client's side, independent of the tree under test: the wire's own Structs.
    class Message(msgspec.Struct, tag_field="type"):
        pass

    class Hello(Message, tag="hello"):
        id: int
        version: int
        client: str = ""

    class Put(Message, tag="put"):
        id: int
        task_id: str
        payload: dict
        key: str | None = None
        available_at: int = 0
        max_attempts: int = 3

    class Reserve(Message, tag="reserve"):
        id: int
        worker: str
        lease_seconds: int = 30
        limit: int = 1
        wait: float = 0.0

    class Ack(Message, tag="ack"):
        id: int
        task_id: str
        worker: str
        generation: int

    class AckAndReserve(Message, tag="ack_reserve"):
        id: int
        task_id: str
        worker: str
        generation: int
        lease_seconds: int = 30
        limit: int = 1
        wait: float = 0.0

    length = struct.Struct(">I")
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder()  # answers as plain maps: no daemon Structs needed
    payload = {"data": "x" * 100}

    def frame(message) -> bytes:
        body = encoder.encode(message)
        return length.pack(len(body)) + body

    scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=scratch) as directory:
        queue_dir = os.path.join(directory, "queue")
        path = os.path.join(directory, "s.sock")
        listener = bind_listener(path, 0o600)
        loop = Loop(queue_dir, open_queue(queue_dir), listener, socket_path=path, compact_wal_bytes=10**12,
                    max_connections=clients + 8, hook=None, notifier=Notifier({}))
        loop.register_listener()
        socks = []
        for index in range(clients):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            sock.sendall(frame(Hello(id=0, version=1, client=f"bench-{index}")))
            socks.append(sock)
        buffers = [b""] * clients

        for sock in socks:
            sock.setblocking(False)

        def answer_in(index: int) -> dict | None:
            """Connection ``index``'s next answer if all of it is in, else None."""
            data = buffers[index]
            while True:
                try:
                    chunk = socks[index].recv(1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    raise SystemExit(f"the daemon closed connection {index}")
                data += chunk
            buffers[index] = data
            if len(data) < 4 or len(data) < 4 + length.unpack_from(data)[0]:
                return None
            (size,) = length.unpack_from(data)
            buffers[index] = data[4 + size:]
            return decoder.decode(data[4:4 + size])

        while loop.connections.__len__() < clients or any(not c.greeted for c in loop.connections.values()):
            loop.one_turn()
        for index in range(clients):
            while (hello := answer_in(index)) is None:
                loop.one_turn()
            assert hello["type"] == "hello_ok"

        steps = ("put", "ack_and_reserve") if mode == "ack_and_reserve" else ("put", "reserve", "ack")
        held: list[dict | None] = [None] * clients
        serial = [0] * clients
        request_id = [0] * clients
        turns = 0
        requests = 0
        cpu = 0.0
        wall = 0.0
        total = warmup_cycles + cycles
        for cycle in range(total):
            for step in steps:
                for index in range(clients):
                    request_id[index] += 1
                    rid, worker = request_id[index], f"w{index}"
                    if step == "put":
                        serial[index] += 1
                        message = Put(id=rid, task_id=f"t{index}-{serial[index]}", payload=payload)
                    elif step == "reserve" or (step == "ack_and_reserve" and held[index] is None):
                        message = Reserve(id=rid, worker=worker, lease_seconds=3600)
                    elif step == "ack":
                        lease = held[index]
                        message = Ack(id=rid, task_id=lease["task_id"], worker=worker,
                                      generation=lease["generation"])
                    else:
                        lease = held[index]
                        message = AckAndReserve(id=rid, task_id=lease["task_id"], worker=worker,
                                             generation=lease["generation"], lease_seconds=3600)
                    socks[index].sendall(frame(message))
                measured = cycle >= warmup_cycles
                found: list[dict | None] = [None] * clients
                while True:
                    # Usually one turn answers all; one that ran past the loop's read budget
                    # (under valgrind, say) leaves some readers for the next.
                    wall_start, cpu_start = time.perf_counter(), time.thread_time()
                    loop.one_turn()
                    if measured:
                        cpu += time.thread_time() - cpu_start
                        wall += time.perf_counter() - wall_start
                        turns += 1
                    for index in range(clients):
                        if found[index] is None:
                            found[index] = answer_in(index)
                    if all(answer is not None for answer in found):
                        break
                if measured:
                    requests += clients
                for index, answer in enumerate(found):
                    kind = answer["type"]
                    if kind == "leases":
                        held[index] = answer["leases"][0] if answer["leases"] else None
                    elif kind == "done":
                        held[index] = None
                    elif kind != "put_ok":
                        raise SystemExit(f"unexpected answer {answer}")
        for sock in socks:
            sock.close()
        loop.one_turn()
        loop.queue.close()
        loop.close_without_serving()
        listener.close()
    return {"cpu_us_per_request": cpu / requests * 1e6, "wall_us_per_request": wall / requests * 1e6,
            "requests_per_turn": requests / turns, "requests": requests}


def run_child(src: str, clients: int, mode: str, warmup: int, cycles: int) -> dict:
    output = subprocess.run([sys.executable, __file__, "--child", src, str(clients), mode, str(warmup),
                             str(cycles)], check=True, capture_output=True, text=True).stdout
    return json.loads(output)


def instructions(src: str, clients: int, mode: str, warmup: int, cycles: int) -> tuple[int, int]:
    """(instructions, requests measured) of one child run under callgrind."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                           __file__, "--child", src, str(clients), mode, str(warmup), str(cycles)],
                          check=True, capture_output=True, text=True)
    collected = re.search(r"Collected : (\d+)", done.stderr)
    return int(collected.group(1)), json.loads(done.stdout)["requests"]


def instructions_per_request(src: str, clients: int, mode: str, warmup: int, cycles: int) -> float:
    """Instructions per request, startup and warm-up subtracted: a run of ``cycles`` more than another.

    Counts the driver's client side too (the same for every tree), so compare trees by difference.
    """
    short, short_requests = instructions(src, clients, mode, warmup, 1)
    long, long_requests = instructions(src, clients, mode, warmup, 1 + cycles)
    return (long - short) / (long_requests - short_requests)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        src, clients, mode, warmup, cycles = sys.argv[2:7]
        print(json.dumps(child(src, int(clients), mode, int(warmup), int(cycles))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other_src", nargs="?", help="another tree's src/ to compare with this one's")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--mode", choices=("ack_and_reserve", "client"), default="ack_and_reserve")
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true",
                        help="count instructions per request under callgrind instead (slow: try --cycles 100)")
    args = parser.parse_args()
    trees = {"this": str(ROOT / "src")}
    if args.other_src:
        trees = {"other": args.other_src, **trees}
    if args.callgrind:
        print(f"{args.clients} clients, {args.mode}: instructions per request (daemon and driver) under callgrind")
        for name, src in trees.items():
            count = instructions_per_request(src, args.clients, args.mode, args.warmup, args.cycles)
            print(f"  {name:>5} {src}: {count:,.0f}")
        return
    results: dict[str, list[dict]] = {name: [] for name in trees}
    for round_number in range(args.rounds):
        order = list(trees) if round_number % 2 == 0 else list(reversed(trees))
        for name in order:
            results[name].append(run_child(trees[name], args.clients, args.mode, args.warmup, args.cycles))
    print(f"{args.clients} clients, {args.mode}, {args.cycles} cycles, {args.rounds} rounds "
          f"(CPU inside Loop.one_turn per request; queue on /dev/shm)")
    for name, runs in results.items():
        cpu = [run["cpu_us_per_request"] for run in runs]
        print(f"  {name:>5} {trees[name]}: median {statistics.median(cpu):6.1f} us, min {min(cpu):6.1f} us "
              f"({runs[0]['requests_per_turn']:.1f} requests per turn)")


if __name__ == "__main__":
    main()

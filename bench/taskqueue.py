"""Benchmark: enqueue -> lease -> complete cycles through gorge-taskqueue.

Starts throwaway backends (gorge_testing). For each backend:

1. direct bound: the same TaskStore calls (the same SQL or the same Redis
   scripts) issued in this process, without HTTP, by C concurrent clients;
2. the service: gorge-taskqueue under twistd, as an operator runs it, driven
   over HTTP by C concurrent clients (one persistent connection each).

The tasks are split into ``--slices`` slices that alternate between the two
(bound then service, then service then bound, ...), each draining the queue
it filled, and each side's rate is its tasks over its total time: the speed
of a shared machine drifts within a run, and alternating puts the drift on
both sides alike.

A cycle is one enqueue, its share of a lease call (``--lease-limit`` tasks
per call; 1 makes every cycle three requests) and one complete. Prints
cycles/s for both, the ratio service/bound, and the daemon's peak memory.
``--profile DIR`` samples the daemon with py-spy and prints where its time
goes.

Usage: python bench/taskqueue.py [--tasks 5000] [--clients 4] [--lease-limit 10]
                                 [--backends mysql,redis,sqlite] [--slices 6]
                                 [--profile DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemons import (  # noqa: E402
    TOKEN,
    Daemon,
    cpu_seconds,
    load_average,
    start_backend,
    top_entries,
)
from twisted.internet.defer import Deferred, gatherResults  # noqa: E402
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol  # noqa: E402
from twisted.internet.protocol import Protocol  # noqa: E402
from twisted.internet.task import react  # noqa: E402

from gorge.taskqueue.model import EnqueueRequest  # noqa: E402

LEASE_DURATION = 7200
STALL = 30  # seconds without an answer before the bench gives up


async def drive(clients: int, tasks: int, batch: int, enqueue, lease, complete) -> float:
    """Run the cycle with ``clients`` concurrent clients; returns cycles/s."""
    started = time.perf_counter()

    async def enqueuer(k: int) -> None:
        for i in range(k, tasks, clients):
            await enqueue(i)

    await gatherResults([Deferred.fromCoroutine(enqueuer(k)) for k in range(clients)])
    done = []

    async def worker(k: int) -> None:
        owner = f"bench:{k}:gorge-worker"
        while True:
            ids = await lease(owner, batch)
            if not ids:
                return
            for task_id in ids:
                await complete(task_id, owner)
                done.append(task_id)

    await gatherResults([Deferred.fromCoroutine(worker(k)) for k in range(clients)])
    elapsed = time.perf_counter() - started
    if sorted(done) != sorted(set(done)) or len(done) != tasks:
        raise SystemExit(f"bench: completed {len(done)} of {tasks} (duplicates or losses)")
    return tasks / elapsed


async def direct(store, clients: int, tasks: int, batch: int) -> float:
    async def enqueue(i: int) -> None:
        await store.enqueue(EnqueueRequest("BenchWorker", f'{{"i":{i}}}'))

    async def lease(owner: str, n: int) -> list[int]:
        return [t.id for t in await store.lease(owner, n, LEASE_DURATION)]

    async def complete(task_id: int, owner: str) -> None:
        await store.complete(task_id, 10, owner)

    return await drive(clients, tasks, batch, enqueue, lease, complete)


class KeepAliveClient(Protocol):
    """A minimal HTTP/1.1 client on one persistent connection, one request at
    a time: the bench measures the service, so the client must cost little.
    It reads only what the service sends (a ``Content-Length`` answer)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._waiting: Deferred | None = None

    def request(self, head: bytes, body: bytes) -> Deferred:
        self._waiting = Deferred()
        self.transport.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
        return self._waiting

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self._buffer[:end]
        at = head.lower().find(b"\r\ncontent-length:")
        if at < 0:
            raise SystemExit(f"bench: an answer without Content-Length: {head!r}")
        length = int(head[at + 17 :].split(b"\r\n", 1)[0])
        if len(self._buffer) < end + 4 + length:
            return
        payload = self._buffer[end + 4 : end + 4 + length]
        self._buffer = self._buffer[end + 4 + length :]
        status = int(head[9:12])
        waiting, self._waiting = self._waiting, None
        assert waiting is not None
        waiting.callback((status, payload))


async def over_http(reactor, daemon: Daemon, clients: int, tasks: int, batch: int) -> float:
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", daemon.port, timeout=5)
    # One connection per client, as a worker with a persistent pool would hold.
    connections = [await connectProtocol(endpoint, KeepAliveClient()) for _ in range(clients)]
    free = list(connections)
    heads = {}
    for path in ("enqueue", "lease", "complete"):
        heads[path] = (
            f"POST /api/queue/{path} HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
            f"X-Service-Token: {TOKEN}\r\nContent-Type: application/json\r\n"
        ).encode()
    answered = [0]

    async def post(path: str, body: bytes, owner: str = ""):
        connection = free.pop()
        head = heads[path]
        if owner:
            head += b"X-Lease-Owner: %s\r\n" % owner.encode()
        try:
            status, content = await connection.request(head, body)
        finally:
            free.append(connection)
        answered[0] += 1
        answer = json.loads(content)
        if status != 200:
            raise SystemExit(f"bench: {path} answered {status} {answer}")
        return answer["data"]

    async def enqueue(i: int) -> None:
        await post("enqueue", b'{"taskClass":"BenchWorker","data":"{\\"i\\":%d}"}' % i)

    async def lease(owner: str, n: int) -> list[int]:
        return [t["id"] for t in await post("lease", b'{"limit":%d}' % n, owner)]

    async def complete(task_id: int, owner: str) -> None:
        await post("complete", b'{"taskID":%d,"duration":10}' % task_id, owner)

    # One watchdog for the run instead of a timer per request: a service
    # that stops answering fails the bench within STALL seconds.
    seen = [-1]
    run = Deferred.fromCoroutine(drive(clients, tasks, batch, enqueue, lease, complete))
    watchdog = []

    def watch() -> None:
        if answered[0] == seen[0]:
            run.cancel()
            return
        seen[0] = answered[0]
        watchdog[:] = [reactor.callLater(STALL, watch)]

    watch()
    try:
        return await run
    finally:
        if watchdog and watchdog[0].active():
            watchdog[0].cancel()
        for connection in connections:
            connection.transport.loseConnection()


async def measure(reactor, name: str, args) -> tuple:
    """The backend's service and bound rates over ``args.slices`` alternating
    slices, with the daemon's memory and CPU per cycle."""
    load_before = load_average()
    backend = start_backend(name)
    daemon = None
    store = backend.store(reactor, "direct")
    per_slice = args.tasks // args.slices
    seconds = {"bound": 0.0, "service": 0.0}
    rates: dict[str, list[float]] = {"bound": [], "service": []}
    cpu_daemon = cpu_client = cpu_bound = 0.0
    try:
        env = {**backend.env("service"), "GORGE_LOG_LEVEL": args.log_level}
        profile = Path(args.profile) / f"taskqueue-{name}.txt" if args.profile else None
        daemon = Daemon("gorge-taskqueue", env, backend.workdir, profile=profile).start()
        for k in range(args.slices):
            # Alternate which side goes first, so a warm-up or a slow drift
            # falls on both sides alike.
            for side in ("bound", "service") if k % 2 == 0 else ("service", "bound"):
                if side == "bound":
                    before_bound = cpu_seconds()
                    rate = await direct(store, args.clients, per_slice, args.lease_limit)
                    cpu_bound += cpu_seconds() - before_bound
                else:
                    before = daemon.cpu_seconds(), cpu_seconds()
                    rate = await over_http(
                        reactor, daemon, args.clients, per_slice, args.lease_limit
                    )
                    cpu_daemon += daemon.cpu_seconds() - before[0]
                    cpu_client += cpu_seconds() - before[1]
                seconds[side] += per_slice / rate
                rates[side].append(rate)
    finally:
        await store.close()
        if daemon is not None:
            daemon.stop()
        backend.stop()
    done = per_slice * args.slices
    cpu = (cpu_daemon * 1000 / done, cpu_client * 1000 / done, cpu_bound * 1000 / done)
    return (
        name,
        done / seconds["service"],
        done / seconds["bound"],
        rates,
        daemon.peak_mb,
        load_before,
        load_average(),
        profile,
        cpu,
    )


async def main(reactor, args) -> None:
    if args.slices < 1 or args.tasks < args.slices:
        raise SystemExit("bench: --slices must be at least 1 and at most --tasks")
    results = [await measure(reactor, name, args) for name in args.backends.split(",")]
    print(
        f"taskqueue: {args.tasks} tasks in {args.slices} slices, {args.clients} clients, "
        f"lease limit {args.lease_limit}, log level {args.log_level}"
    )
    print(
        f"{'backend':<8} {'service cycles/s':>17} {'direct bound':>13} {'ratio':>6} "
        f"{'taskqueue peak RSS':>19} {'CPU ms/cycle':>13} {'bound CPU':>9}  load (before / after)"
    )
    for name, service, bound, _, peak, before, after, _, cpu in results:
        print(
            f"{name:<8} {service:>17.0f} {bound:>13.0f} {service / bound:>6.2f} "
            f"{peak:>16.0f} MB {cpu[0]:>6.2f}+{cpu[1]:.2f} {cpu[2]:>9.2f}  {before} / {after}"
        )
    print("(each side's rate over all its slices; the slices' rates, cycles/s:)")
    for name, _, _, rates, *_ in results:
        for side in ("bound", "service"):
            print(f"  {name} {side:<8} " + " ".join(f"{r:.0f}" for r in rates[side]))
    print(
        "(CPU ms/cycle: the taskqueue daemon + this process's HTTP client; "
        "bound CPU: this process during the bound's slices)"
    )
    for name, *_, profile, _ in results:
        if profile is None:
            continue
        print(f"\nwhere gorge-taskqueue ({name}) spends its time: own %, with callees %")
        for own, total, frame in top_entries(profile):
            print(f"  {own:5.1f} {total:5.1f}  {frame}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--lease-limit",
        "--batch",
        dest="lease_limit",
        type=int,
        default=10,
        help="tasks asked for per lease call (default 10)",
    )
    parser.add_argument("--backends", default="mysql,redis,sqlite")
    parser.add_argument(
        "--slices",
        type=int,
        default=6,
        help="alternating bound and service runs the tasks are split into (default 6)",
    )
    parser.add_argument(
        "--log-level", default="warn", help="GORGE_LOG_LEVEL of the daemon (default warn)"
    )
    parser.add_argument(
        "--profile", default="", help="directory for py-spy samples of the daemon (needs py-spy)"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    react(lambda reactor: Deferred.fromCoroutine(main(reactor, arguments)))

"""Benchmark: enqueue -> lease (in batches) -> complete cycles through gorge-taskqueue.

Starts a throwaway MariaDB and Redis (gorge.testing). For each backend:

1. direct bound: the same TaskStore calls (the same SQL or the same Redis
   scripts) issued in this process, without HTTP, by C concurrent clients;
2. the service: gorge-taskqueue in its own process on a loopback port, driven
   over HTTP by C concurrent clients (one persistent connection each).

A cycle is one enqueue, its share of a lease batch, and one complete.
Prints cycles/s for both and the ratio service/bound.

Usage: python bench/taskqueue.py [--tasks 5000] [--clients 4] [--batch 10]
                                 [--backends mysql,redis,sqlite]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from twisted.internet.defer import Deferred, gatherResults  # noqa: E402
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol  # noqa: E402
from twisted.internet.protocol import Protocol  # noqa: E402
from twisted.internet.task import react  # noqa: E402

from gorge.taskqueue.model import EnqueueRequest  # noqa: E402

TOKEN = "bench-token"
LEASE_DURATION = 7200

SERVER = r"""
import os, sys
sys.path.insert(0, os.environ["BENCH_ROOT"])
from twisted.internet import reactor
from gorge.taskqueue.service import build_taskqueue_service
from gorge.taskqueue.settings import load_settings

service = build_taskqueue_service(load_settings(os.environ), reactor)
service.startService()
print(service.part("listener").listening_port.getHost().port, flush=True)
if os.environ.get("BENCH_PROFILE"):
    import cProfile
    cProfile.run("reactor.run()", os.environ["BENCH_PROFILE"])
else:
    reactor.run()
"""


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
                await complete(task_id)
                done.append(task_id)

    await gatherResults([Deferred.fromCoroutine(worker(k)) for k in range(clients)])
    elapsed = time.perf_counter() - started
    if sorted(done) != sorted(set(done)) or len(done) != tasks:
        raise SystemExit(f"bench: completed {len(done)} of {tasks} (duplicates or losses)")
    return tasks / elapsed


async def direct(store, clients: int, tasks: int, batch: int) -> float:
    async def enqueue(i: int) -> None:
        await store.enqueue(EnqueueRequest("BenchWorker", '{"i":%d}' % i))

    async def lease(owner: str, n: int) -> list[int]:
        return [t.id for t in await store.lease(owner, n, LEASE_DURATION)]

    async def complete(task_id: int) -> None:
        await store.complete(task_id, 10)

    try:
        return await drive(clients, tasks, batch, enqueue, lease, complete)
    finally:
        await store.close()


class KeepAliveClient(Protocol):
    """A minimal HTTP/1.1 client on one persistent connection, one request at
    a time: the bench measures the service, so the client must cost little."""

    def __init__(self) -> None:
        self._buffer = b""
        self._waiting: Deferred | None = None

    def request(self, path: str, body: bytes, headers: dict[str, str]) -> Deferred:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._waiting = Deferred()
        self.transport.write(
            f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n{head}\r\n"
            .encode() + body)
        return self._waiting

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self._buffer[:end].decode("latin-1").split("\r\n")
        fields = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        rest = self._buffer[end + 4:]
        if fields.get("transfer-encoding") == "chunked":
            payload, consumed = b"", 0
            while True:
                eol = rest.find(b"\r\n", consumed)
                if eol < 0:
                    return
                size = int(rest[consumed:eol].split(b";")[0], 16)
                if len(rest) < eol + 2 + size + 2:
                    return
                payload += rest[eol + 2:eol + 2 + size]
                consumed = eol + 2 + size + 2
                if size == 0:
                    break
        else:
            length = int(fields.get("content-length", "0"))
            if len(rest) < length:
                return
            payload, consumed = rest[:length], length
        self._buffer = rest[consumed:]
        status = int(head[0].split()[1])
        waiting, self._waiting = self._waiting, None
        waiting.callback((status, payload))


async def over_http(reactor, env: dict, clients: int, tasks: int, batch: int) -> float:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        env={**os.environ, **env, "BENCH_ROOT": str(ROOT), "GORGE_SERVICE_TOKEN": TOKEN,
             "GORGE_LISTEN_ADDR": "127.0.0.1:0"},
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline().strip())
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=5)
        # One connection per client, as a worker with a persistent pool would hold.
        connections = [await connectProtocol(endpoint, KeepAliveClient()) for _ in range(clients)]
        free = list(connections)
        headers = {"X-Service-Token": TOKEN, "Content-Type": "application/json"}

        async def post(path: str, body: dict, extra: dict | None = None):
            connection = free.pop()
            try:
                status, content = await connection.request(
                    "/api/queue/" + path, json.dumps(body).encode(),
                    {**headers, **(extra or {})}).addTimeout(30, reactor)
            finally:
                free.append(connection)
            answer = json.loads(content)
            if status != 200:
                raise SystemExit(f"bench: {path} answered {status} {answer}")
            return answer["data"]

        async def enqueue(i: int) -> None:
            await post("enqueue", {"taskClass": "BenchWorker", "data": '{"i":%d}' % i})

        async def lease(owner: str, n: int) -> list[int]:
            return [t["id"] for t in await post("lease", {"limit": n}, {"X-Lease-Owner": owner})]

        async def complete(task_id: int) -> None:
            await post("complete", {"taskID": task_id, "duration": 10})

        try:
            return await drive(clients, tasks, batch, enqueue, lease, complete)
        finally:
            for connection in connections:
                connection.transport.loseConnection()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def main(reactor, args) -> None:
    backends = args.backends.split(",")
    results = []
    mariadb = redis = None
    try:
        if "mysql" in backends:
            from gorge.mysql import make_pool
            from gorge.taskqueue.mysql import MySQLTaskStore
            from gorge.testing.mariadb_server import MariaDBServer

            mariadb = MariaDBServer()
            mariadb.start()
            db = mariadb.create_database("worker", "bench_direct_worker")
            store = MySQLTaskStore(make_pool(mariadb.settings(db), reactor), reactor)
            bound = await direct(store, args.clients, args.tasks, args.batch)
            mariadb.create_database("worker", "bench_http_worker")
            env = {"GORGE_TASKQUEUE_BACKEND": "mysql", "GORGE_TASKQUEUE_MYSQL_HOST": mariadb.host,
                   "GORGE_TASKQUEUE_MYSQL_PORT": str(mariadb.port),
                   "GORGE_TASKQUEUE_MYSQL_USER": mariadb.user,
                   "GORGE_TASKQUEUE_MYSQL_PASS": mariadb.password,
                   "GORGE_TASKQUEUE_NAMESPACE": "bench_http"}
            service = await over_http(reactor, env, args.clients, args.tasks, args.batch)
            results.append(("mysql", service, bound))
        if "redis" in backends:
            from gorge.redis import make_redis
            from gorge.taskqueue.redis import RedisTaskStore
            from gorge.testing.redis_server import RedisServer

            redis = RedisServer()
            redis.start()
            store = RedisTaskStore(make_redis(redis.settings(), reactor), clock=reactor,
                                   key_prefix="bench:direct:")
            bound = await direct(store, args.clients, args.tasks, args.batch)
            env = {"GORGE_TASKQUEUE_BACKEND": "redis",
                   "GORGE_TASKQUEUE_REDIS_ADDR": f"{redis.host}:{redis.port}",
                   "GORGE_TASKQUEUE_REDIS_KEY_PREFIX": "bench:http:"}
            service = await over_http(reactor, env, args.clients, args.tasks, args.batch)
            results.append(("redis", service, bound))
        if "sqlite" in backends:
            from gorge.taskqueue.sqlite import SQLiteTaskStore

            tmp = Path(tempfile.mkdtemp(prefix="gorge-bench-"))
            store = SQLiteTaskStore.open(str(tmp / "direct.sqlite3"), reactor)
            bound = await direct(store, args.clients, args.tasks, args.batch)
            env = {"GORGE_TASKQUEUE_BACKEND": "sqlite",
                   "GORGE_TASKQUEUE_SQLITE_PATH": str(tmp / "http.sqlite3")}
            service = await over_http(reactor, env, args.clients, args.tasks, args.batch)
            results.append(("sqlite", service, bound))
    finally:
        if mariadb is not None:
            mariadb.stop()
        if redis is not None:
            redis.stop()
    print(f"taskqueue: {args.tasks} tasks, {args.clients} clients, lease batch {args.batch}")
    print(f"{'backend':<8} {'service cycles/s':>17} {'direct bound':>13} {'ratio':>6}")
    for name, service, bound in results:
        print(f"{name:<8} {service:>17.0f} {bound:>13.0f} {service / bound:>6.2f}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--backends", default="mysql,redis")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    react(lambda reactor: Deferred.fromCoroutine(main(reactor, arguments)))

"""A Phorge switched over to gorge, and what the tests ask of it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import treq

from gorge_testing.gorge_stack import MAILER_TOKEN, WORKER_SUFFIX, GorgeStack
from tests.mailer.smtpserver import ScriptedFactory, ServerState
from tests.phorge.site import LIBRARY, Checkout, PhorgeSite, until
from tests.webhook.conftest import Receiver

WORKER_BOT = "gorge-worker"
TASK_TABLES = ("worker_activetask", "worker_archivetask")


def executor_pids(worker_pid: int) -> list[int]:
    """gorge-worker's PHP executors: its live children running the executor
    script (a killed one not yet reaped is not counted)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if int(parent) == worker_pid and state != "Z" and b"gorge-executor.php" in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


def gorge_mailer_entry(uri: str) -> dict:
    return {
        "key": "gorge",
        "type": "gorge",
        "inbound": False,
        "options": {"uri": uri, "token": MAILER_TOKEN},
    }


@dataclass
class Switched:
    site: PhorgeSite
    gorge: GorgeStack
    smtp: ServerState
    smtp_port: object
    receiver: Receiver
    token: str

    @classmethod
    def build(
        cls, checkout: Checkout, mariadb, workdir: Path, label: str, php: str = "conduit"
    ) -> Switched:
        """Storage, the worker's bot and the sinks; nothing started yet.
        ``php``: where gorge-worker runs PHP tasks (GorgeStack)."""
        from twisted.internet import reactor

        site = PhorgeSite(checkout, mariadb, workdir / "phorge", label, libraries=[LIBRARY])
        site.upgrade_storage()
        token = site.helper_sync("setup", username=WORKER_BOT)["token"]
        smtp = ServerState()
        smtp_port = reactor.listenTCP(0, ScriptedFactory(smtp), interface="127.0.0.1")
        receiver = Receiver()
        gorge = GorgeStack(site, workdir, smtp_port.getHost().port, php=php)
        gorge.worker_token = token
        return cls(site, gorge, smtp, smtp_port, receiver, token)

    @property
    def watched(self) -> list:
        return [p for p in [self.site.web, *self.gorge.alive()] if p is not None]

    async def until(self, check, what: str, bound: float | None = None):
        kwargs = {} if bound is None else {"bound": bound}
        return await until(check, what, watch=self.watched, **kwargs)

    # -- the task tables ---------------------------------------------------------

    def task_marker(self) -> int:
        """The highest task ID so far: later tasks are the ones a step caused."""
        highest = 0
        for table in TASK_TABLES:
            row = self.site.rows("worker", f"SELECT MAX(id) AS m FROM {table}")[0]
            highest = max(highest, row["m"] or 0)
        return highest

    def tasks_since(self, marker: int) -> list[dict]:
        rows = []
        for table in TASK_TABLES:
            for row in self.site.rows(
                "worker",
                f"SELECT t.*, d.data FROM {table} t"
                " LEFT JOIN worker_taskdata d ON d.id = t.dataID WHERE t.id > %s",
                marker,
            ):
                row["table"] = table
                rows.append(row)
        return sorted(rows, key=lambda r: r["id"])

    def task(self, task_id: int) -> dict | None:
        for table in TASK_TABLES:
            found = self.site.rows("worker", f"SELECT * FROM {table} WHERE id = %s", task_id)
            if found:
                return {**found[0], "table": table}
        return None

    def archived(self, task_id: int) -> dict | None:
        row = self.task(task_id)
        return row if row and row["table"] == "worker_archivetask" else None

    async def settled(self, marker: int, what: str, *, retrying_ok: bool = False) -> list[dict]:
        """Wait until every task after ``marker`` is archived; all of them.

        ``retrying_ok``: a task that failed and waits out Phorge's retry
        delay (five minutes by default) counts as settled too. For a test
        that only needs the site's own set-up tasks out of the way: one of
        them failing once on a loaded machine is Phorge's business, not the
        test's, and is printed rather than waited on."""

        def waiting_on_retry(row: dict) -> bool:
            return row["leaseOwner"] is None and row["failureCount"] > 0

        def done():
            rows = self.tasks_since(marker)
            active = [r for r in rows if r["table"] != "worker_archivetask"]
            if retrying_ok:
                active = [r for r in active if not waiting_on_retry(r)]
            if rows and not active:
                return rows
            return None

        try:
            rows = await self.until(done, f"all tasks after {marker} archived ({what})")
        except AssertionError as failure:
            raise AssertionError(f"{failure}; {self.explain_active(marker)}") from None
        if any(r["table"] != "worker_archivetask" for r in rows):
            explained = self.explain_active(marker)
            print(f"\nsettled with tasks waiting on a retry ({what}): {explained}")
        return rows

    def explain_active(self, marker: int) -> str:
        """The active tasks after ``marker``, with what gorge-worker logged
        about each and Phorge's Conduit errors, for a failure message."""
        waiting = [
            {k: r[k] for k in ("id", "taskClass", "leaseOwner", "leaseExpires", "failureCount")}
            for r in self.tasks_since(marker)
            if r["table"] != "worker_archivetask"
        ]
        worker = self.gorge.daemons.get("worker")
        lines: list[str] = []
        if worker is not None:
            for row in waiting:
                needle = f"task_id={row['id']} "
                lines += [ln for ln in worker.log_text().splitlines() if needle in ln + " "][-5:]
        errors = self.site.rows(
            "conduit",
            "SELECT method, error, duration FROM conduit_methodcalllog"
            " WHERE error != '' ORDER BY id DESC LIMIT 5",
        )
        return f"still active: {waiting}; worker log: {lines}; recent Conduit errors: {errors}"

    def make_due(self, task_id: int, owner: str | None = None) -> None:
        """Time travel instead of waiting out a retry or yield delay: the task,
        waiting with ``owner`` (none: a failure's retry), is due now."""
        held = "leaseOwner IS NULL" if owner is None else "leaseOwner = %s"
        self.site.execute(
            "worker",
            f"UPDATE worker_activetask SET leaseExpires = UNIX_TIMESTAMP() - 1"
            f" WHERE id = %s AND {held}",
            task_id,
            *(() if owner is None else (owner,)),
        )

    def forget_task(self, task_id: int) -> None:
        """Remove a delayed task a test made only to call worker.execute with."""
        self.site.execute("worker", "DELETE FROM worker_activetask WHERE id = %s", task_id)

    async def php_runs(self) -> int:
        """Tasks gorge-worker has handed to PHP so far, whichever the path."""
        if self.gorge.php == "conduit":
            return self.conduit_calls("worker.execute")
        response = await treq.get(self.gorge.daemons["worker"].url + "/metrics", timeout=30)
        text = (await response.content()).decode()
        return int(
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("gorge_worker_php_executor_runs_total{")
            )
        )

    def conduit_calls(self, method: str) -> int:
        return self.site.rows(
            "conduit", "SELECT COUNT(*) AS n FROM conduit_methodcalllog WHERE method = %s", method
        )[0]["n"]

    # -- Phorge objects -----------------------------------------------------------

    async def create_maniphest_task(self, title: str) -> dict:
        result = await self.site.call(
            "maniphest.edit", {"transactions": [{"type": "title", "value": title}]}, self.token
        )
        return result["object"]

    async def edit_maniphest_task(self, phid: str, title: str) -> None:
        await self.site.call(
            "maniphest.edit",
            {"objectIdentifier": phid, "transactions": [{"type": "title", "value": title}]},
            self.token,
        )

    async def published_story_key(self, title: str) -> str:
        """A new Maniphest task's feed story, once its publishing is over: the
        chronological key a FeedPublisherWorker task is scheduled with."""
        first = self.task_marker()
        task = await self.create_maniphest_task(title)
        story = await self.until(
            lambda: self.site.rows(
                "feed",
                "SELECT chronologicalKey FROM feed_storyreference WHERE objectPHID = %s",
                task["phid"],
            ),
            "feed story written",
        )
        await self.settled(first, "publishing the first time")
        return str(story[0]["chronologicalKey"])

    def mail(self, mail_id: int) -> dict:
        return self.site.rows("metamta", "SELECT * FROM metamta_mail WHERE id = %s", mail_id)[0]

    def mail_task(self, mail_id: int) -> dict | None:
        """The PhabricatorMetaMTAWorker task of a mail (its data is the bare ID)."""
        for table in TASK_TABLES:
            found = self.site.rows(
                "worker",
                f"SELECT t.* FROM {table} t JOIN worker_taskdata d ON d.id = t.dataID"
                " WHERE t.taskClass = 'PhabricatorMetaMTAWorker' AND d.data = %s",
                str(mail_id),
            )
            if found:
                return {**found[0], "table": table}
        return None

    def deliveries_to(self, address: str) -> list:
        return [d for d in self.smtp.deliveries if address in d.rcpt_to]

    def leased_by_gorge(self, rows: list[dict]) -> bool:
        # gorge-worker's owner is its name plus each lease call's number.
        return all(WORKER_SUFFIX + ":" in (r["leaseOwner"] or "") for r in rows)

    # -- start and stop -------------------------------------------------------------

    async def stop_listening(self) -> None:
        await self.smtp_port.stopListening()
        await self.receiver.port.stopListening()

    def close(self) -> None:
        self.gorge.kill_all()
        self.site.close()

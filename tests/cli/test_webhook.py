"""``gorge webhook`` end to end: the command line as a process, against a real
``twistd gorge-webhook`` process (docs/webhook.md, The gorge webhook command)."""

from __future__ import annotations

import json
import sys

import pytest
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from gorge_testing.procs import free_port
from tests.support.paths import REPO_ROOT
from tests.support.twistd import daemon_environ
from tests.webhook.conftest import T0, receiver  # noqa: F401 - a fixture
from tests.webhook.test_processes import Daemon, namespace_db, wait_for  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "cli-token"
VERBS = ["stats", "ls", "show", "retry", "hooks"]
NEVER = {"retry": "never", "transactionPHIDs": [], "triggerPHIDs": []}
FOREVER = {"retry": "forever", "transactionPHIDs": [], "triggerPHIDs": []}


class Result:
    def __init__(self, out: bytes, err: bytes, code: int) -> None:
        self.stdout, self.stderr, self.returncode = out.decode(), err.decode(), code

    def one_line(self) -> str:
        assert self.stderr.count("\n") == 1, self.stderr
        return self.stderr.strip()


async def gorge(*args: str, url: str | None = None, token: str | None = TOKEN) -> Result:
    """The command as a child process, waited for on the reactor (the test's
    receiver keeps answering the daemon meanwhile)."""
    env = daemon_environ({}, drop=("GORGE_",))
    if url is not None:
        env["GORGE_WEBHOOK_URL"] = url
    if token is not None:
        env["GORGE_SERVICE_TOKEN"] = token
    out, err, code = await getProcessOutputAndValue(
        sys.executable, ["-m", "gorge.cli", *args], env=env, path=str(REPO_ROOT), reactor=reactor
    )
    return Result(out, err, code)


@pytest.mark.parametrize("verb", VERBS)
async def test_every_verb_has_help(verb):
    r = await gorge("webhook", verb, "--help")
    assert r.returncode == 0 and r.stdout.startswith(f"usage: gorge webhook {verb}")
    assert "exit status" in r.stdout


async def test_the_verbs_against_a_running_daemon(
    mariadb,
    namespace_db,  # noqa: F811
    receiver,  # noqa: F811
    tmp_path,
):
    namespace, herald = namespace_db
    good = herald.insert_hook(uri=f"{receiver.base}/ok", name="good")
    bad = herald.insert_hook(uri=f"{receiver.base}/status/500", name="bad")
    off = herald.insert_hook(uri=f"{receiver.base}/ok", name="off", status="disabled")
    sent = [herald.insert_request(hook=good, properties=NEVER) for _ in range(3)]
    failed = [herald.insert_request(hook=bad, properties=NEVER) for _ in range(2)]
    retired = herald.insert_request(hook=off, properties=NEVER)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    daemon = Daemon(
        mariadb,
        namespace,
        tmp_path / "d.log",
        GORGE_LISTEN_ADDR=f"127.0.0.1:{port}",
        GORGE_SERVICE_TOKEN=TOKEN,
    )
    try:
        await wait_for(
            lambda: herald.status_counts() == {"sent": 3, "failed": 3}, 60, daemons=[daemon]
        )

        r = await gorge("webhook", "stats", url=url)
        assert r.returncode == 0
        lines = r.stdout.splitlines()
        assert [line.split() for line in lines[:5]] == [
            ["REPLICA", "SITE"],
            ["queued", "0", "0"],
            ["sent", "3", "3"],
            ["failed", "3", "3"],
            ["hooks", "2", "2"],
        ]
        assert lines[5].startswith("(hooks: not disabled; site counted ")

        r = await gorge("webhook", "ls", url=url)
        lines = r.stdout.splitlines()
        assert lines[0].split() == [
            "ID",
            "STATUS",
            "RESULT",
            "ERROR",
            "LAST",
            "ATTEMPT",
            "RETRY",
            "HOOK",
            "CREATED",
        ]
        assert [int(line.split()[0]) for line in lines[1:]] == [retired, *failed[::-1], *sent[::-1]]
        assert lines[1].split()[1:5] == ["failed", "none", "hook/disabled", "-"]
        assert lines[2].split()[1:4] == ["failed", "fail", "http/500"]
        r = await gorge(
            "webhook", "ls", "--status", "failed", "--result", "fail", "--json", url=url
        )
        listed = json.loads(r.stdout)
        assert [i["id"] for i in listed["requests"]] == failed[::-1]
        assert listed["nextCursor"] is None
        r = await gorge(
            "webhook", "ls", "--hook", good, "--limit", "2", "--since", str(T0), url=url
        )
        assert [int(line.split()[0]) for line in r.stdout.splitlines()[1:3]] == sent[:0:-1]
        assert r.stdout.splitlines()[-1] == f"older requests may match: add --cursor {sent[1]}"

        r = await gorge("webhook", "show", str(sent[0]), url=url)
        assert r.returncode == 0
        assert r.stdout.startswith(f"request {sent[0]}: sent, last result okay, error http/200\n")
        phid = herald.request(sent[0])["phid"]
        assert f"  phid: {phid}\n" in r.stdout
        assert (
            json.loads((await gorge("webhook", "show", phid, "--json", url=url)).stdout)["id"]
            == sent[0]
        )

        r = await gorge("webhook", "hooks", url=url)
        rows = [line.split() for line in r.stdout.splitlines()]
        assert rows[0] == ["PHID", "NAME", "STATUS", "BREAKER", "FAILURES", "QUEUED"]
        assert rows[1:] == [
            [good, "good", "enabled", "closed", "0/10", "in", "300s", "0"],
            [bad, "bad", "enabled", "closed", "2/10", "in", "300s", "0"],
            [off, "off", "disabled", "closed", "0/10", "in", "300s", "0"],
        ]

        # retry one: delivered again, once.
        r = await gorge("webhook", "retry", str(sent[0]), url=url)
        assert (r.returncode, r.stdout) == (0, f"request {sent[0]} ({phid}): queued again\n")
        await wait_for(
            lambda: receiver.count("/ok") == 4 and herald.request(sent[0])["status"] == "sent",
            30,
            daemons=[daemon],
        )
        # retry by hook and time: the failed ones, which fail again.
        r = await gorge("webhook", "retry", "--hook", bad, "--since", str(T0), url=url)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"queued 2 requests of {bad} again (created ")
        await wait_for(
            lambda: (
                receiver.count("/status/500") == 4
                and herald.status_counts() == {"sent": 3, "failed": 3}
            ),
            30,
            daemons=[daemon],
        )

        # A queued request is refused; the other ids are still handled.
        queued = herald.insert_request(hook=bad, properties=FOREVER)
        await wait_for(
            lambda: herald.request(queued)["lastRequestResult"] == "fail", 30, daemons=[daemon]
        )
        r = await gorge("webhook", "retry", str(queued), str(retired), url=url)
        assert r.returncode == 1
        assert r.one_line().startswith(
            f"gorge webhook retry: request {queued}: request {queued} is already queued"
        )
        assert r.stdout.startswith(f"request {retired} (")

        r = await gorge("webhook", "show", "99999", url=url)
        assert (r.returncode, r.one_line()) == (
            1,
            "gorge webhook show: request 99999: no webhook request '99999'",
        )
        r = await gorge("webhook", "show", "abc", url=url)
        assert (r.returncode, r.one_line()) == (
            2,
            "gorge webhook show: argument REQUEST: not a request id or PHID-HWBR-... PHID: 'abc'",
        )
        r = await gorge("webhook", "ls", "--since", "someday", url=url)
        assert r.returncode == 2 and "argument --since: not a time" in r.one_line()
        r = await gorge("webhook", "retry", "--hook", bad, url=url)
        assert (r.returncode, r.one_line()) == (2, "gorge webhook retry: --hook needs --since")
        r = await gorge("webhook", "stats", url=url, token="wrong")
        assert (r.returncode, r.one_line()) == (
            3,
            "gorge webhook: gorge-webhook refused the service token (set "
            "GORGE_SERVICE_TOKEN or --token)",
        )
        await daemon.terminate()
    finally:
        daemon.kill()
    closed = f"http://127.0.0.1:{free_port()}"
    r = await gorge("webhook", "stats", url=closed)
    assert (r.returncode, r.one_line()) == (
        3,
        f"gorge webhook: cannot reach gorge-webhook at {closed}: connection refused",
    )


def test_since_and_until_take_past_relative_times():
    from argparse import ArgumentTypeError

    from gorge.cli.command import parse_when

    now = 1_795_947_000.5
    assert [
        parse_when(w, now, past=True) - 1_795_947_000
        for w in ("-90", "-30m", "-2h", "-7d", "+1h", "now")
    ] == [-90, -1800, -7200, -604800, 3600, 0]
    with pytest.raises(ArgumentTypeError):
        parse_when("-2h", now)  # only where the past is meant

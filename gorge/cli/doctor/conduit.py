"""``conduit-bot``: the token gorge-worker calls Phorge with reaches
``worker.execute`` as an administrator."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Callable

from gorge.cli.doctor.report import GUIDE, Check, fail, ok, skip
from gorge.cli.doctor.site import Site


def check_conduit_bot(site: Site, post: Callable[[str, dict], dict]) -> list[Check]:
    name = "conduit-bot"
    worker = site.daemons.get("worker")
    if worker is None:
        return []
    url = worker.env.get("GORGE_WORKER_CONDUIT_URL", "")
    token = worker.env.get("GORGE_WORKER_CONDUIT_TOKEN", "")
    if not url:
        if worker.env.get("GORGE_WORKER_PHORGE_ROOT"):
            return [
                skip(
                    name,
                    "PHP tasks run in local executors (GORGE_WORKER_PHORGE_ROOT); no bot needed",
                )
            ]
        return [skip(name, "gorge-worker runs no PHP (neither executors nor Conduit)")]
    base = url.rstrip("/")
    try:
        answer = post(
            f"{base}/api/worker.execute", {"taskClass": "", "__conduit__": {"token": token}}
        )
    except OSError as e:
        return [fail(name, f"cannot reach Phorge at {base}: {e}", "check GORGE_WORKER_CONDUIT_URL")]
    code = answer.get("error_code")
    info = answer.get("error_info") or ""
    if code == "ERR-NO-TASK-CLASS":
        who = ""
        try:
            me = post(f"{base}/api/user.whoami", {"__conduit__": {"token": token}})
            if isinstance(me.get("result"), dict):
                who = f" as {me['result'].get('userName')}"
        except OSError:
            pass
        return [ok(name, f"the token calls worker.execute{who} (an administrator)")]
    fixes = {
        "ERR-NOT-ADMIN": "the bot is no administrator: ./bin/user empower --user <bot>",
        "ERR-INVALID-AUTH": "the token is wrong or revoked: generate a new one for the bot "
        "and set GORGE_WORKER_CONDUIT_TOKEN",
        "ERR-CONDUIT-CALL": "Phorge's web server has not loaded the library (load-libraries) "
        "or it is older than gorge-worker",
    }
    return [
        fail(
            name,
            f"worker.execute answered [{code}] {info}".strip(),
            fixes.get(code or "", f"see {GUIDE}, step 2"),
        )
    ]


def conduit_post(timeout: float) -> Callable[[str, dict], dict]:
    def post(url: str, params: dict) -> dict:
        body = urllib.parse.urlencode({"params": json.dumps(params), "output": "json"}).encode()
        request = urllib.request.Request(url, data=body, method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
        try:
            answer = json.loads(raw)
        except ValueError:
            raise OSError(f"{url} answered without Conduit's JSON") from None
        return answer if isinstance(answer, dict) else {}

    return post

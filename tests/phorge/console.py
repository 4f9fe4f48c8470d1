"""What the console and setup-check tests share: the ``gorge.daemons``
setting of a switched-over site (every daemon with a service token), and
people with web sessions."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import treq

from gorge_testing.gorge_stack import MAILER_TOKEN, QUEUE_TOKEN
from tests.phorge.switched import Switched

# gorge-worker and gorge-webhook run without a token in the shared stack;
# these modules give them one, so that every daemon's token is a secret a
# page could leak.
WORKER_TOKEN = "worker-console-token-3f9a"
WEBHOOK_TOKEN = "webhook-console-token-77c1"
TOKENS = {
    "taskqueue": QUEUE_TOKEN,
    "worker": WORKER_TOKEN,
    "webhook": WEBHOOK_TOKEN,
    "mailer": MAILER_TOKEN,
}

_people = itertools.count(1)


@dataclass(frozen=True)
class Person:
    username: str
    phid: str
    session: str

    @property
    def cookies(self) -> dict[str, str]:
        return {"phsid": self.session}


def daemons_setting(s: Switched) -> dict:
    return {
        name: {"uri": f"http://127.0.0.1:{s.gorge.ports[name]}", "token": TOKENS[name]}
        for name in TOKENS
    }


async def give_tokens(s: Switched) -> None:
    """Restart gorge-worker and gorge-webhook with service tokens and name
    all four daemons in ``gorge.daemons``."""
    for name, token in (("webhook", WEBHOOK_TOKEN), ("worker", WORKER_TOKEN)):
        await s.gorge.stop(name)
        await s.gorge.start_ready(name, GORGE_SERVICE_TOKEN=token)
    s.site.configure({"gorge.daemons": daemons_setting(s)})


async def take_tokens_back(s: Switched) -> None:
    """The shared stack as the other modules expect it."""
    s.site.configure({"gorge.daemons": None})
    for name in ("webhook", "worker"):
        if name in s.gorge.daemons:
            await s.gorge.stop(name)
        await s.gorge.start_ready(name)


async def start_worker(s: Switched) -> None:
    await s.gorge.start_ready("worker", GORGE_SERVICE_TOKEN=WORKER_TOKEN)


async def person(s: Switched, prefix: str, admin: bool) -> Person:
    username = f"{prefix}{next(_people)}"
    made = await s.site.helper("web-user", username=username, admin=admin)
    return Person(username, made["userPHID"], made["sessionKey"])


async def get_page(s: Switched, who: Person, path: str) -> tuple[int, str]:
    response = await treq.get(s.site.base_uri + path, cookies=who.cookies, timeout=60)
    return response.code, (await response.content()).decode("utf-8", "replace")


async def open_issue_keys(s: Switched, admin: Person) -> list[str]:
    """Load Setup Issues as an administrator (Phorge runs every check for
    that page and stores the unresolved keys, which the banner reads), then
    the stored keys."""
    code, _ = await get_page(s, admin, "/config/issue/")
    assert code == 200
    return (await s.site.helper("setup-issue-keys"))["keys"]

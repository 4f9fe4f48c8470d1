"""The cycle of a hook with more slots than busy hooks (traffic to a few
hooks): the slot keeps to its hook, writes each result at once and claims the
hook's next row while it does; the rules stay those of every delivery."""

from __future__ import annotations

import json

import pytest
from twisted.internet import reactor
from twisted.web import resource, server

from tests.webhook.conftest import T0

pytestmark = pytest.mark.integration


class WatchingReceiver(resource.Resource):
    """Answers 200 to every POST and notes, at each arrival, which object it
    is for and the status the database shows for every row of that hook."""

    isLeaf = True

    def __init__(self, herald) -> None:
        super().__init__()
        self._herald = herald
        self.arrivals: list[tuple[str, str, dict[str, str]]] = []
        self.in_flight: dict[str, int] = {}
        self.peak_per_hook = 0

    def render_POST(self, request):
        hook = request.path.decode()
        body = json.loads(request.content.read())
        statuses = {
            phid.decode(): status
            for phid, status in self._herald.query(
                "SELECT r.objectPHID, r.status FROM herald_webhookrequest r"
                " JOIN herald_webhook h ON h.phid = r.webhookPHID WHERE h.webhookURI LIKE %s",
                (f"%{hook}",),
            )
        }
        self.arrivals.append((hook, body["object"]["phid"], statuses))
        self.in_flight[hook] = self.in_flight.get(hook, 0) + 1
        self.peak_per_hook = max(self.peak_per_hook, self.in_flight[hook])
        # Answered on the next turn of the reactor, so that overlapping POSTs
        # to one hook would show in ``in_flight``.
        reactor.callLater(0, self._answer, request, hook)
        return server.NOT_DONE_YET

    def _answer(self, request, hook: str) -> None:
        self.in_flight[hook] -= 1
        request.write(b"ok")
        request.finish()


@pytest.fixture
def watching(herald):
    receiver = WatchingReceiver(herald)
    site = server.Site(receiver)
    site.log = lambda request: None
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    yield receiver, f"http://127.0.0.1:{port.getHost().port}"
    port.stopListening()


def obj(hook: int, n: int) -> str:
    return f"PHID-TASK-{hook:02d}{n:018d}"


async def test_each_post_of_a_hook_follows_the_written_result_of_the_one_before(
    herald, watching, make_harness
):
    receiver, base = watching
    # Eight slots, two hooks: every slot that is working has its own hook's
    # next row to go on with.
    harness = make_harness(max_concurrent=8)
    hooks = [herald.insert_hook(uri=f"{base}/h{h}") for h in range(2)]
    for n in range(12):
        for h, phid in enumerate(hooks):
            herald.insert_request(hook=phid, object_phid=obj(h, n), created=T0 - 100 + n)

    await harness.run_tick()

    assert herald.status_counts() == {"sent": 24}
    assert receiver.peak_per_hook == 1
    # Each write a hook's next POST waited on is measured as such (all but a
    # few: the last row of each hook, and rows taken in the first fill).
    waited = harness.metric("gorge_webhook_write_seconds_count", next_waits="yes")
    unwaited = harness.metric("gorge_webhook_write_seconds_count", next_waits="no")
    assert waited + unwaited == 24 and waited >= 16, (waited, unwaited)
    for h in range(2):
        arrived = [
            (phid, statuses) for hook, phid, statuses in receiver.arrivals if hook == f"/h{h}"
        ]
        # Per-hook order by request id, each row once.
        assert [phid for phid, _ in arrived] == [obj(h, n) for n in range(12)]
        for n, (_, statuses) in enumerate(arrived):
            # Every earlier row's result was written before this POST left.
            assert [statuses[obj(h, k)] for k in range(n)] == ["sent"] * n
            assert statuses[obj(h, n)] == "queued"


async def test_after_a_failure_the_next_row_of_the_hook_waits_for_the_breaker(
    herald, receiver, make_harness
):
    # A breaker that opens on the first failure: the row behind the failed
    # one must not go out, though its slot had it in hand.
    harness = make_harness(max_concurrent=4, breaker_threshold=1)
    hook = herald.insert_hook(uri=f"{receiver.base}/status/500")
    ids = [
        herald.insert_request(
            hook=hook,
            created=T0 - 10 + n,
            properties={"retry": "forever", "transactionPHIDs": []},
        )
        for n in range(3)
    ]
    await harness.run_tick()
    assert receiver.count() == 1
    assert [herald.request(i)["lastRequestResult"] for i in ids] == ["fail", "none", "none"]
    # The rows behind it were never claimed: they are due again at once when
    # the breaker closes, not after a lease.
    assert [
        herald.request(i)["dateModified"] == herald.request(i)["dateCreated"] for i in ids[1:]
    ] == [
        True,
        True,
    ]

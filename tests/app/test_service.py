"""gorge.app: ordered lifecycle, poll loop, drains, start-up refusal, systemd notify."""

import os
import socket
import tempfile

import pytest
from twisted.application.service import Service
from twisted.internet import task
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import CannotListenError
from twisted.web.resource import Resource
from twisted.web.server import Site

from gorge.app.inflight import InFlight
from gorge.app.poller import Poller
from gorge.app.systemd import SystemdNotifier
from gorge.app.tree import DaemonRoot, FunctionService, OrderedService, ServiceTree
from gorge.app.twistd import run_make_service
from gorge.config import ConfigError
from gorge.web.listener import listener


class Recorder(Service):
    def __init__(self, name, events, stop_deferred=None):
        self.setName(name)
        self.events = events
        self.stop_deferred = stop_deferred

    def startService(self):
        super().startService()
        self.events.append(("start", self.name))

    def stopService(self):
        super().stopService()
        self.events.append(("stopping", self.name))
        d = self.stop_deferred or succeed(None)
        d.addCallback(lambda _: self.events.append(("stopped", self.name)))
        return d


def test_ordered_service_starts_in_order_and_stops_one_at_a_time_in_reverse():
    events = []
    slow = Deferred()
    parent = OrderedService(
        Recorder("pool", events), Recorder("loop", events, slow), Recorder("http", events)
    )
    parent.startService()
    assert events == [("start", "pool"), ("start", "loop"), ("start", "http")]
    events.clear()
    done = parent.stopService()
    # "pool" must not be asked to stop while "loop" is still draining
    assert events == [("stopping", "http"), ("stopped", "http"), ("stopping", "loop")]
    assert not done.called
    slow.callback(None)
    assert events[-2:] == [("stopping", "pool"), ("stopped", "pool")]
    assert done.called


def test_ordered_service_keeps_stopping_after_a_child_fails():
    events = []
    failing = Recorder("bad", events, Deferred())
    parent = OrderedService(Recorder("first", events), failing)
    parent.startService()
    done = parent.stopService()
    failing.stop_deferred.errback(RuntimeError("x"))
    assert ("stopped", "first") in events
    assert done.called


def test_service_tree_starts_named_children_in_order_and_stops_them_in_reverse():
    events = []
    slow = Deferred()

    async def drain():
        events.append(("stopping", "drain"))
        await slow
        events.append(("stopped", "drain"))

    tree = ServiceTree("daemon")
    tree.add("pool", Recorder("ignored", events))
    tree.add("drain", stop=drain)
    tree.add(
        "loop",
        start=lambda: events.append(("start", "loop")),
        stop=lambda: events.append(("stopped", "loop")),
        part="the consumer",
    )
    tree.startService()
    assert events == [("start", "pool"), ("start", "loop")]
    events.clear()
    done = tree.stopService()
    # "pool" is not asked to stop while "drain" is still waiting.
    assert events == [("stopped", "loop"), ("stopping", "drain")]
    assert not done.called
    slow.callback(None)
    assert events[-2:] == [("stopping", "pool"), ("stopped", "pool")]
    assert done.called and not tree.running


def test_service_tree_parts_are_reachable_by_name():
    tree = ServiceTree("daemon")
    pool = tree.add("pool", Recorder("x", []))
    assert pool.name == "pool" and tree.part("pool") is pool
    tree.add("loop", start=lambda: None, part=["consumer"])
    assert tree.part("loop") == ["consumer"]
    tree.keep("site", "a site")
    assert tree.part("site", str) == "a site" and tree.has_part("site")
    assert not tree.has_part("missing")
    with pytest.raises(KeyError, match="daemon has no part 'missing' .*loop, pool, site"):
        tree.part("missing")
    with pytest.raises(TypeError, match="part 'site' is a str, not a int"):
        tree.part("site", int)
    with pytest.raises(ValueError, match="already has a part named 'site'"):
        tree.keep("site", "another")
    with pytest.raises(ValueError, match="already has a part named 'pool'"):
        tree.add("pool", stop=lambda: None)
    with pytest.raises(TypeError, match="not both"):
        tree.add("both", Recorder("y", []), stop=lambda: None)


def test_service_tree_is_a_daemon_root():
    assert isinstance(ServiceTree("daemon"), DaemonRoot)


def test_poller_ticks_on_interval_without_overlap_and_survives_failures():
    clock = task.Clock()
    ticks, gates = [], []

    async def tick():
        ticks.append(clock.seconds())
        if len(ticks) == 2:
            raise RuntimeError("one bad tick")
        if len(ticks) == 3:
            gate = Deferred()
            gates.append(gate)
            await gate

    poller = Poller(tick, 1.0, clock, "test")
    poller.start()
    clock.pump([1.0, 1.0])
    assert ticks == [0.0, 1.0, 2.0]
    clock.pump([1.0, 1.0])  # tick 3 still running: no overlap
    assert ticks == [0.0, 1.0, 2.0]
    gates[0].callback(None)
    clock.pump([1.0])
    assert len(ticks) >= 4
    stopped = poller.stop()
    assert stopped.called


def test_poller_stop_waits_for_the_running_tick():
    clock = task.Clock()
    gate = Deferred()
    finished = []

    async def tick():
        await gate
        finished.append(True)

    poller = Poller(tick, 1.0, clock, "test")
    poller.start()
    stopped = poller.stop()
    assert not stopped.called
    gate.callback(None)
    assert stopped.called and finished == [True]


def test_poller_wake_runs_next_tick_now():
    clock = task.Clock()
    ticks = []

    async def tick():
        ticks.append(clock.seconds())

    poller = Poller(tick, 10.0, clock, "test")
    poller.start()
    clock.advance(1)
    poller.wake()
    clock.advance(0)
    assert ticks == [0.0, 1.0]
    poller.stop()


def test_poller_reports_progress_only_for_good_ticks():
    clock = task.Clock()
    progress = []
    outcomes = iter([None, RuntimeError("x"), None])

    async def tick():
        outcome = next(outcomes)
        if outcome:
            raise outcome

    poller = Poller(tick, 1.0, clock, "test", on_progress=lambda: progress.append(clock.seconds()))
    poller.start()
    clock.pump([1.0, 1.0])
    assert progress == [0.0, 2.0]
    poller.stop()


def test_inflight_drain_waits_then_times_out():
    clock = task.Clock()
    inflight = InFlight()
    first, second = Deferred(), Deferred()
    inflight.track(first)
    inflight.track(second)
    assert len(inflight) == 2
    drained = inflight.drain(5, clock)
    first.callback(None)
    assert not drained.called
    second.errback(RuntimeError("failed work still counts as finished"))
    second.addErrback(lambda f: None)
    assert drained.result is True
    assert len(inflight) == 0

    stuck = inflight.track(Deferred())
    drained = inflight.drain(5, clock)
    clock.advance(5)
    assert drained.result is False
    assert not stuck.called  # not cancelled: abandoning is the caller's choice


def test_inflight_drain_with_nothing_pending_is_immediate():
    assert InFlight().drain(1, task.Clock()).result is True


def test_function_service_calls_start_and_stop():
    calls = []
    svc = FunctionService(
        start=lambda: calls.append("start"), stop=lambda: calls.append("stop"), name="fn"
    )
    svc.startService()
    d = svc.stopService()
    assert calls == ["start", "stop"] and d.called


def test_run_make_service_turns_config_error_into_exit_2(capsys):
    def build():
        raise ConfigError("GORGE_WEBHOOK_POLL_INTERVAL_MS", "not an integer: 'x'")

    with pytest.raises(SystemExit) as info:
        run_make_service("gorge-webhook", build, environ={})
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == "gorge-webhook: GORGE_WEBHOOK_POLL_INTERVAL_MS: not an integer: 'x'\n"


def test_run_make_service_checks_the_log_level(capsys):
    with pytest.raises(SystemExit) as info:
        run_make_service("gorge-mailer", lambda: Service(), environ={"GORGE_LOG_LEVEL": "loud"})
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith("gorge-mailer: GORGE_LOG_LEVEL: ")


class _PluginOptions(dict):
    """A subcommand's parsed options; ``parent`` is twistd's own options."""

    def __init__(self, **server_options) -> None:
        super().__init__()
        self.parent = {
            "nodaemon": False,
            "logfile": None,
            "syslog": False,
            "logger": None,
            **server_options,
        }


@pytest.mark.parametrize(
    "server_options,installed",
    [
        ({"nodaemon": True}, True),
        ({"nodaemon": True, "logfile": "-"}, True),
        ({"nodaemon": True, "logger": object()}, False),  # --logger: twistd uses that one
        ({"nodaemon": True, "logfile": "gorge.log"}, False),
        ({"nodaemon": True, "syslog": True}, False),
        ({}, False),  # daemonized: twistd writes twistd.log
    ],
)
def test_the_daemon_logs_through_its_observer_when_twistd_would_print_to_stdout(
    server_options, installed, monkeypatch
):
    import logging

    from twisted.application.service import Application
    from twisted.logger import ILogObserver

    root_logger = logging.getLogger()
    # Installing also forwards stdlib logging; keep that out of this process.
    monkeypatch.setattr(root_logger, "handlers", list(root_logger.handlers))
    monkeypatch.setattr(root_logger, "level", root_logger.level)

    root = run_make_service(
        "gorge-mailer", DaemonRoot, environ={}, options=_PluginOptions(**server_options)
    )
    application = Application("gorge-mailer")
    root.setServiceParent(application)
    observer = application.getComponent(ILogObserver)
    assert (observer is not None) is installed
    assert observer is root.log_observer
    # Outside twistd (no parent options) nothing is chosen for anyone.
    assert run_make_service("gorge-mailer", DaemonRoot, environ={}).log_observer is None


def test_listener_bind_failure_aborts_start_up():

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        svc = listener(f"tcp:{port}:interface=127.0.0.1", Site(Resource()))
        with pytest.raises(CannotListenError):
            svc.privilegedStartService()
            svc.startService()
    finally:
        taken.close()


class NotifySocket:
    def __init__(self):
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)

    def messages(self):
        out = []
        while True:
            try:
                out.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return out

    def close(self):
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


def test_systemd_notifier_ready_watchdog_stopping():
    fake = NotifySocket()
    try:
        clock = task.Clock()
        notifier = SystemdNotifier({"NOTIFY_SOCKET": fake.path, "WATCHDOG_USEC": "10000000"}, clock)
        notifier.progress()  # not ready yet: no ping
        assert fake.messages() == []
        notifier.ready()
        notifier.ready()  # once only
        assert fake.messages() == ["READY=1", "WATCHDOG=1"]
        clock.advance(1)
        notifier.progress()  # not due yet (interval 5 s)
        assert fake.messages() == []
        clock.advance(5)
        notifier.progress()
        assert fake.messages() == ["WATCHDOG=1"]
        clock.advance(60)  # a wedged loop calls progress() no more: no pings
        assert fake.messages() == []
        notifier.stopping()
        assert fake.messages() == ["STOPPING=1"]
    finally:
        fake.close()


def test_systemd_notifier_without_socket_is_silent():
    notifier = SystemdNotifier({}, task.Clock())
    assert not notifier.enabled
    notifier.ready()
    notifier.progress()
    notifier.stopping()


def test_watchdog_heartbeat_pings_while_the_reactor_turns():
    from gorge.app.systemd import watchdog_heartbeat

    fake = NotifySocket()
    try:
        clock = task.Clock()
        notifier = SystemdNotifier({"NOTIFY_SOCKET": fake.path, "WATCHDOG_USEC": "2000000"}, clock)
        notifier.ready()
        assert fake.messages() == ["READY=1", "WATCHDOG=1"]
        heartbeat = watchdog_heartbeat(notifier, clock)
        heartbeat.startService()
        clock.pump([1.0, 1.0, 1.0])
        assert fake.messages() == ["WATCHDOG=1"] * 3
        stopped = heartbeat.stopService()
        assert stopped.called
        clock.pump([1.0, 1.0])
        assert fake.messages() == []
    finally:
        fake.close()

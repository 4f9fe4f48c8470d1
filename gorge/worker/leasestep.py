"""What the consume loop does next: pure decisions over the loop's state.

Each turn of the loop (:class:`gorge.worker.consumer.Consumer`) gathers what
it knows into :class:`LeaseFacts` and asks :func:`next_step` which of four
turns to take:

* ``HIBERNATING``: inside the hibernation window; no lease call, turn again
  within a poll interval (the watchdog must keep hearing from the loop);
* ``FULL``: no free slot; a freed slot wakes the loop, a poll interval at
  the latest;
* ``ALL_DELEGATED``: Phorge's web server is not taking calls and every class
  this worker asks for is delegated; ask again after a poll interval;
* ``LEASE``: ask for at most the free slots, only the classes that run while
  paused, and let the queue hold the call only when the last call succeeded.

After a lease call, :func:`queue_holds_after`, :func:`idle_after` and
:func:`delay_after_lease` say what the answer changes and when the loop turns
again; :func:`wants_wake` says whether a freed slot should lease at once.
Nothing here reads a clock, calls the queue or logs: the consumer carries the
steps out and logs each change of state once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class LoopSettings:
    lease_limit: int = 4
    max_workers: int = 4
    poll_interval: float = 1.0
    idle_timeout: float = 180.0
    hibernate: float = 0.0
    drain_timeout: float = 30.0
    # Seconds the queue may hold an empty lease call (docs/worker.md,
    # Long-poll); 0 asks once per poll interval.
    lease_wait: float = 0.0
    # Whether the log level lets debug lines through: a filtered line still
    # costs its event (measured: a tenth of the worker's time per task).
    log_debug: bool = True
    # docs/worker.md, Heartbeat leases.
    heartbeat: float = 15.0
    heartbeat_lease: int = 60

    @property
    def batch_threshold(self) -> int:
        """Free slots worth an immediate lease call: half a batch, at least one."""
        return max(1, min(self.lease_limit, self.max_workers) // 2)


@dataclass
class LoopState:
    """What the loop remembers from one turn to the next."""

    # The last answer filled the batch: the queue probably has more.
    more_waiting: bool = False
    # The queue held our last empty lease call for the wait asked: keep one
    # call in flight whenever slots are free (an older queue answers at once,
    # and is then asked once per poll interval).
    queue_holds: bool = False
    hibernate_until: float | None = None
    idle: bool = False
    idle_since: float | None = None


class Turn(enum.Enum):
    HIBERNATING = "hibernating"
    FULL = "full"
    ALL_DELEGATED = "all delegated"
    LEASE = "lease"


@dataclass(frozen=True)
class LeaseFacts:
    now: float
    free: int  # slots a new task may take (consumer.Consumer._free)
    hibernate_until: float | None
    # Delegated classes wait (DelegationGate.paused); ``classes`` then holds
    # only the classes that run here.
    paused: bool
    # The classes to ask for; None asks for every class (the fallback).
    classes: list[str] | None
    attempted: bool  # a lease call has completed
    failing: bool  # and the last one failed


@dataclass(frozen=True)
class LeaseStep:
    turn: Turn
    # The hibernation window ended with this turn.
    woke: bool = False
    # For the turns that wait: seconds until the loop turns again.
    delay: float = 0.0
    # For LEASE: how many, which classes, how long the queue may hold it.
    limit: int = 0
    classes: list[str] | None = None
    wait: float = 0.0


def next_step(facts: LeaseFacts, settings: LoopSettings) -> LeaseStep:
    poll = settings.poll_interval
    woke = False
    if facts.hibernate_until is not None:
        if facts.now < facts.hibernate_until:
            return LeaseStep(Turn.HIBERNATING, delay=min(facts.hibernate_until - facts.now, poll))
        woke = True
    if facts.free <= 0:
        # Not "empty": idle tracking is unchanged.
        return LeaseStep(Turn.FULL, woke=woke, delay=poll)
    if facts.paused and not facts.classes:
        # Asking for no class would ask for every class.
        return LeaseStep(Turn.ALL_DELEGATED, woke=woke, delay=poll)
    # The first call, and the first after a failure, answer at once:
    # readiness (and systemd's READY) must not wait for a held call. Nor
    # while paused: the call after the resume must not wait behind a held one.
    held = facts.attempted and not facts.failing and not facts.paused
    return LeaseStep(
        Turn.LEASE,
        woke=woke,
        limit=min(settings.lease_limit, facts.free),
        classes=facts.classes,
        wait=settings.lease_wait if held else 0.0,
    )


def queue_holds_after(step: LeaseStep, count: int, elapsed: float, holds: bool) -> bool:
    """Whether the queue holds empty calls, as the last answer shows: an
    empty answer long before the wait ended comes from a queue that does
    not hold calls (or one shutting down)."""
    if step.wait > 0 and count == 0:
        return elapsed >= step.wait / 2
    return holds


@dataclass(frozen=True)
class Idleness:
    idle: bool
    since: float | None
    # A hibernation window that starts now, if any.
    hibernate_until: float | None = None


def idle_after(
    count: int, busy: bool, idle: bool, since: float | None, now: float, settings: LoopSettings
) -> Idleness:
    """Idleness after a lease answer of ``count`` tasks, ``busy`` while
    tasks are still running or reporting."""
    if count:
        return Idleness(False, None)
    if busy:
        return Idleness(idle, since)
    if since is None:
        return Idleness(idle, now)
    timeout = settings.idle_timeout
    if timeout <= 0 or now - since <= timeout:
        return Idleness(idle, since)
    if settings.hibernate > 0:
        return Idleness(True, since, now + settings.hibernate)
    return Idleness(True, since)


def delay_after_lease(
    *, more_waiting: bool, held: bool, free: int, settings: LoopSettings
) -> float | None:
    """When the loop turns after a lease answer; None leaves it to a freed
    slot (:func:`wants_wake`).

    After a held call the next one goes out at once: the queue does the
    waiting. A call that did not ask to wait keeps the poll cadence."""
    if (more_waiting or held) and free >= settings.batch_threshold:
        return 0.0
    if not held or free <= 0:
        return settings.poll_interval
    return None


def wants_wake(state: LoopState, *, free: int, settings: LoopSettings) -> bool:
    """A slot freed (the caller checked nothing else is leasing and the loop
    is not stopping): lease now if the queue had more and a batch fits."""
    return (
        (state.more_waiting or state.queue_holds)
        and state.hibernate_until is None
        and free >= settings.batch_threshold
    )

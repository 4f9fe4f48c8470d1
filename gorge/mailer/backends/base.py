"""The backend interface and the config-entry helpers every backend uses.

A backend module (``gorge/mailer/backends/<type>.py``) exposes::

    def build(entry: BackendEntry, *, reactor, http_client) -> Backend

* ``entry`` -- one parsed element of the backend list:
  ``key``, ``type``, effective ``priority`` (auto-assigned negatives
  included), ``options`` (every value already a ``str``: numbers/booleans
  were coerced, ``587`` -> ``"587"``, ``true`` -> ``"true"``) and
  ``source`` (the setting the list came from, for error lines).
* ``reactor`` -- provides ``IReactorTime`` (``seconds``, ``callLater``) and,
  for the backends that need them, ``IReactorTCP``/``IReactorSSL``/
  ``IReactorProcess``. Tests pass a ``task.Clock``/``MemoryReactorClock``
  or the real reactor. Never import the global reactor.
* ``http_client`` -- the service's one ``IAgent`` (one connection pool
  per service, see :func:`gorge.client.exchange.make_agent`); the provider
  backends send through :func:`gorge.mailer.backends.http.post`, which
  never follows redirects. Non-HTTP backends ignore it.

``build`` validates every option it reads and raises ``ConfigError`` via
``entry.error(field, reason)`` / the ``entry.*`` getters for anything it
cannot use (missing credential, bad port, unknown protocol). It must not do
I/O: no dialling, no DNS. A backend that depends on a local file looks at it
once when built and again in ``reload()`` (see :class:`Reloadable`), never
per send on the reactor thread.

The returned object satisfies :class:`Backend`. Its ``send`` contract:

* ``await backend.send(message, deadline=d)`` -> :class:`Outcome`, never an
  exception for a delivery failure (an unexpected exception is a bug; the
  dispatcher then answers ``ERR_OUTCOME_UNKNOWN`` because it cannot know how
  far the attempt got).
* ``deadline`` is an absolute time on the injected clock
  (``reactor.seconds()`` scale): the attempt must have ended by then. Clip
  the backend's own caps to it (``min(own_cap, deadline - now)``); if it is
  already past, return ``Outcome.transient("...: deadline reached before
  start")`` without dialling.
* The dispatcher runs the attempt as ``Deferred.fromCoroutine(send(...))``
  and may ``cancel()`` it (dispatch deadline, client disconnect, shutdown).
  Cancellation arrives as ``CancelledError`` at the ``await`` the coroutine
  is suspended on. The backend must abort its I/O (hang up, kill the
  process) and *return* a classified outcome: ``TRANSIENT`` when provably
  nothing was handed over (still connecting, before the DATA terminator /
  before request bytes were sent), else ``UNKNOWN``. A ``CancelledError``
  that escapes is treated as ``UNKNOWN``.
* ``message`` has passed every rule of :mod:`gorge.mailer.message`; bodies
  are already truncated.
* Never log credentials or the message body. The dispatcher logs each
  failed attempt (``MAILER_SEND_FAILED``) with ``outcome.cause``, so a
  backend need not log failures itself.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gorge.config import ConfigError
from gorge.mailer.message import Message
from gorge.mailer.outcome import Outcome

_TRUE = frozenset({"1", "t", "true", "yes", "y", "on"})
_FALSE = frozenset({"0", "f", "false", "no", "n", "off"})


@runtime_checkable
class Backend(Protocol):
    """One configured delivery backend (one element of the list)."""

    key: str
    type: str
    priority: int  # effective priority

    async def send(self, message: Message, *, deadline: float) -> Outcome: ...


@runtime_checkable
class Reloadable(Protocol):
    """A backend with local state to read again on SIGHUP (sendmail's binary)."""

    def reload(self) -> None: ...


@dataclass(frozen=True)
class BackendEntry:
    """One element of the backend list, shape-checked, not yet built.

    ``source`` names where the list came from (``GORGE_MAILER_CONFIG``,
    ``GORGE_MAILER_CONFIG_FILE`` or ``GORGE_MAILER_TYPE`` for the flat
    single-backend variables); ``setting(field)`` turns it into the
    ``ConfigError`` setting ``"<source> [<key>].<field>"``, so the exit line
    reads e.g. ``gorge-mailer: GORGE_MAILER_CONFIG [primary].port: not an
    integer: 'abc'``.
    """

    key: str
    type: str
    priority: int
    options: Mapping[str, str] = field(default_factory=dict, repr=False)
    source: str = "GORGE_MAILER_CONFIG"

    def setting(self, name: str) -> str:
        return f"{self.source} [{self.key}].{name}"

    def error(self, name: str, reason: str) -> ConfigError:
        """A ``ConfigError`` naming this entry and ``name`` (an option key or
        ``type``/``key``). Raise it. ``reason`` must not contain option
        values that may be credentials."""
        return ConfigError(self.setting(name), reason)

    def str(self, name: str, default: str = "") -> builtins.str:
        """The option as given, or ``default`` when absent or empty."""
        value = self.options.get(name, "")
        return value if value != "" else default

    def required(self, name: builtins.str) -> builtins.str:
        """A non-empty option, else ``ConfigError`` "<type>: <name> is
        required" (for example ``sendgrid: api-key is required``)."""
        value = self.options.get(name, "")
        if value.strip() == "":
            raise self.error(name, f"{self.type}: {name} is required")
        return value

    def int(
        self,
        name: builtins.str,
        default: builtins.int,
        *,
        min: builtins.int | None = None,
        max: builtins.int | None = None,
    ) -> int:
        """An integer option (accepts ``"587"``; numbers arrive as strings).
        Absent/empty -> ``default``; anything else unparseable or out of
        range -> ``ConfigError``."""
        raw = self.options.get(name, "").strip()
        if raw == "":
            return default
        try:
            value = int(raw, 10)
        except ValueError:
            raise self.error(name, f"not an integer: {raw[:40]!r}") from None
        if min is not None and value < min:
            raise self.error(name, f"must be >= {min}")
        if max is not None and value > max:
            raise self.error(name, f"must be <= {max}")
        return value

    def port(self, name: builtins.str = "port", default: builtins.int = 25) -> builtins.int:
        """A TCP port 1..65535."""
        return self.int(name, default, min=1, max=65535)

    def bool(self, name: builtins.str, default: bool = False) -> bool:
        """``1/0, t/f, true/false, yes/no, on/off`` (case-insensitive)."""
        raw = self.options.get(name, "").strip().lower()
        if raw == "":
            return default
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise self.error(name, f"not a boolean: {raw[:20]!r}")

    def choice(
        self, name: builtins.str, default: builtins.str, choices: tuple[builtins.str, ...]
    ) -> builtins.str:
        """A case-insensitive choice; returns the lower-cased value."""
        raw = self.options.get(name, "").strip().lower()
        if raw == "":
            return default
        if raw not in choices:
            shown = ", ".join(c if c else '""' for c in choices)
            raise self.error(name, f"must be one of {shown}")
        return raw

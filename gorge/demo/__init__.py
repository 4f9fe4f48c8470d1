"""``gorge demo``: the four services on SQLite in one reactor, end to end.

:mod:`~gorge.demo.run` drives it; :mod:`~gorge.demo.services` builds the
services, :mod:`~gorge.demo.seed` says what is seeded and where each item
must end, :mod:`~gorge.demo.receiver` and :mod:`~gorge.demo.smtp` are the
webhook receiver and SMTP sink running beside them,
:mod:`~gorge.demo.handlers` the extra task handlers, :mod:`~gorge.demo.state`
what has been observed and :mod:`~gorge.demo.progress` what is printed.
"""

from gorge.demo.run import DemoOptions, main

__all__ = ["DemoOptions", "main"]

"""``gorge doctor``: a live site checked against every prerequisite of the
switch-over (docs/phorge.md), with canaries sent through it.

``command`` is the command line and the order of the checks; ``site`` reads
both sides of the site once (the daemons' settings files, Phorge through its
checkout); one module per group of checks (``daemons`` with ``version``,
``phorgeconfig``, ``database`` with ``grants``, ``conduit``, ``webhook``,
``mail``) and ``canary``; ``report`` prints what they found."""

from gorge.cli.doctor.command import main

__all__ = ["main"]

"""Backend types and how to build them.

``BACKEND_TYPES`` maps a type name to ``"module:function"``; the module is
imported only when an entry of that type is built, so an install that uses
SMTP never imports the provider code. Every builder has the signature
``build(entry: BackendEntry, *, reactor, http_client) -> Backend``
(see :mod:`gorge.mailer.backends.base` for the full contract).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from gorge.log.logger import Logger
from gorge.mailer.backends.base import Backend, BackendEntry

log = Logger()

BACKEND_TYPES: dict[str, str] = {
    "smtp": "gorge.mailer.backends.smtp:build",
    "sendmail": "gorge.mailer.backends.sendmail:build",
    "ses": "gorge.mailer.backends.ses:build",
    "sendgrid": "gorge.mailer.backends.sendgrid:build",
    "mailgun": "gorge.mailer.backends.mailgun:build",
    "postmark": "gorge.mailer.backends.postmark:build",
    "test": "gorge.mailer.backends.test:build",
}

Builder = Callable[..., Backend]


def load_builder(type_name: str) -> Builder:
    """The ``build`` function for ``type_name``; ``KeyError`` if unknown."""
    module_name, _, func = BACKEND_TYPES[type_name].partition(":")
    return getattr(importlib.import_module(module_name), func)


def build_backend(entry: BackendEntry, *, reactor: Any, http_client: Any) -> Backend:
    """Build one entry; an unknown type is a ``ConfigError`` on ``.type``.

    A backend module may list the option keys it reads in ``OPTIONS``;
    other keys are ignored and named at debug level."""
    if entry.type not in BACKEND_TYPES:
        raise entry.error("type", f"unknown mailer type: {entry.type[:40]}")
    module_name = BACKEND_TYPES[entry.type].partition(":")[0]
    backend = load_builder(entry.type)(entry, reactor=reactor, http_client=http_client)
    known = getattr(importlib.import_module(module_name), "OPTIONS", None)
    if known is not None:
        for name in sorted(set(entry.options) - set(known)):
            log.debug(
                "MAILER_OPTION_IGNORED mailer={mailer} option={option}",
                mailer=entry.key,
                option=name[:40],
            )
    return backend


__all__ = ["BACKEND_TYPES", "Backend", "BackendEntry", "build_backend", "load_builder"]

"""An alias kept for deployments whose twistd command line still names
``--logger=gorge.logging.observer_from_env``: the log output now lives in
:mod:`gorge.log.output`. New units name that module."""

from gorge.log.output import observer_from_env

__all__ = ["observer_from_env"]

"""The error of a queue call that did not succeed."""

from __future__ import annotations


class QueueError(Exception):
    """A queue call that did not succeed; ``str()`` is the spec's description."""

    def __init__(
        self,
        description: str,
        *,
        status: int | None = None,
        code: str | None = None,
        transient: bool = False,
        task_ids: list | None = None,
    ):
        super().__init__(description)
        self.status = status
        self.code = code
        # The ids in a rejected lease answer: those rows stay leased to us
        # until their lease expires, so they must be named in the log.
        self.task_ids = task_ids
        # A body that is no JSON envelope came from something in front of the
        # queue (a proxy's error page), so its status says nothing about us.
        self.transient = transient

    @property
    def retryable(self) -> bool:
        """Any 4xx except 408/429 will not get better by retrying,
        unless the answer was not the queue's own JSON envelope."""
        if self.transient or self.status is None or not 400 <= self.status < 500:
            return True
        return self.status in (408, 429)

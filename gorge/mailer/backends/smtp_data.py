"""The message as it goes after DATA: dot-stuffed, in chunks."""

from __future__ import annotations

#: Content goes to the transport in pieces this big; the transport pulls the
#: next one only once it flushed the previous, and large pieces keep a 1 MiB
#: message to a handful of reactor turns.
CHUNK_SIZE = 256 * 1024


def dot_stuff(data: bytes, *, terminate: bool = True) -> bytes:
    """Dot-stuffed DATA content ending in CRLF, followed by the terminating
    ``.\\r\\n`` unless ``terminate`` is false. ``data`` must already use CRLF
    line ends only, as :func:`gorge.mailer.mime.build_mime` guarantees."""
    if data.startswith(b"."):
        data = b"." + data
    data = data.replace(b"\r\n.", b"\r\n..")
    if not data.endswith(b"\r\n"):
        data += b"\r\n"
    return data + b".\r\n" if terminate else data


def stuff_mime(data: bytes) -> bytes:
    """:func:`dot_stuff` (without the dot) for :func:`build_mime` output.

    Only the top header block can hold a line starting with ``.`` (a custom
    header name may); below it every line is a boundary, one of our part
    headers or base64, none of which can. Stuffing just the head spares a
    scan of a multi-megabyte body."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return dot_stuff(data, terminate=False)
    head = dot_stuff(data[: end + 2], terminate=False)
    body = data[end + 2 :]
    return head + (body if body.endswith(b"\r\n") else body + b"\r\n")


class _Content:
    """The dot-stuffed DATA content as ``FileSender`` reads it.

    Every read returns the next :data:`CHUNK_SIZE` bytes, whatever size the
    sender asks for (its own chunks are 16 KiB). With ``terminate`` the last
    piece carries the terminating dot, so a small message and its dot leave
    in one write."""

    def __init__(self, data: bytes, *, terminate: bool) -> None:
        self._data = (data + b".\r\n") if terminate else data
        self._offset = 0
        self.terminate = terminate

    def read(self, size: int = -1) -> bytes:
        piece = self._data[self._offset : self._offset + CHUNK_SIZE]
        self._offset += len(piece)
        return piece

    @property
    def dot_taken(self) -> bool:
        return self.terminate and self._offset >= len(self._data)

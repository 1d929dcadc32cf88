"""kopf's watch streams, read so that an answer cut short is a broken connection.

kopf (1.45) reads a watch answer line by line and, when the answer ends, parses what is left
after the last newline as a line. An answer that ends cleanly in the middle of an event (a
proxy between the operator and the apiserver that ends its own answer when the apiserver broke
its) then fails to parse, the `JSONDecodeError` ends kopf's watcher, and the operator stops.
Read here, a last line that is not whole JSON is a `ClientPayloadError`, which kopf's watcher
takes as a broken connection: it watches again from the last version it saw.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp

CHUNK = 1 << 20  # kopf's: huge objects (Secrets, big CRs) read in few iterations


async def whole_lines(
    content: aiohttp.StreamReader, chunk_size: int = CHUNK
) -> AsyncIterator[bytes]:
    """The answer's non-empty lines; its end inside a line raises `ClientPayloadError`."""
    rest = b""
    async for data in content.iter_chunked(chunk_size):
        *lines, rest = (rest + data).split(b"\n")
        for line in lines:
            if line:
                yield line
    if not rest.strip():
        return
    try:
        json.loads(rest)
    except ValueError:
        raise aiohttp.ClientPayloadError(
            f"the answer ended inside a line ({len(rest)} bytes after the last newline)"
        ) from None
    yield rest  # whole, only its newline missing: as kopf reads it


def install() -> None:
    """kopf's stream reader becomes `whole_lines` (kopf looks it up at each watch)."""
    # Not public: checked, so that an upgrade of kopf that moved it fails here, at start.
    from kopf._cogs.clients import api

    if not callable(getattr(api, "iter_jsonlines", None)):
        raise RuntimeError("kopf's watch line reader (kopf._cogs.clients.api.iter_jsonlines) moved")
    api.iter_jsonlines = whole_lines

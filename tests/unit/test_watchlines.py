"""The watch answer's lines, read from aiohttp's own stream reader as kopf reads them."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp.base_protocol import BaseProtocol

from etoperator.watchlines import whole_lines

EVENT = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "j"}}}).encode()


async def read(chunks: list[bytes], chunk_size: int = 7) -> list[bytes]:
    loop = asyncio.get_running_loop()
    content = aiohttp.StreamReader(BaseProtocol(loop), 1 << 16, loop=loop)
    for chunk in chunks:
        content.feed_data(chunk)
    content.feed_eof()
    return [line async for line in whole_lines(content, chunk_size)]


def test_lines_split_across_chunks_come_whole() -> None:
    body = EVENT + b"\n\n" + EVENT + b"\n"
    assert asyncio.run(read([body[:5], body[5:40], body[40:]])) == [EVENT, EVENT]


def test_a_last_line_without_its_newline_is_read_when_whole() -> None:
    assert asyncio.run(read([EVENT + b"\n" + EVENT])) == [EVENT, EVENT]


def test_an_answer_that_ends_inside_a_line_is_a_broken_connection() -> None:
    with pytest.raises(aiohttp.ClientPayloadError, match="ended inside a line"):
        asyncio.run(read([EVENT + b"\n" + EVENT[: len(EVENT) // 2]]))

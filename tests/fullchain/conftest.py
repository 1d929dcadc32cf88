from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import real_nodes_missing
from tests.harness import Chain, start_chain


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    why = real_nodes_missing()
    if why:
        pytest.fail(why)
    c = start_chain(tmp_path_factory.mktemp("chain"))
    try:
        yield c
    finally:
        c.stop()

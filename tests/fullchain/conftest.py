from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import real_nodes_missing
from tests.harness import Chain, start_chain


@pytest.fixture(scope="package")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    """One chain for the tier's modules (they run in one process, tests/conftest.py); each
    test works in a namespace of its own."""
    why = real_nodes_missing()
    if why:
        pytest.fail(why)
    c = start_chain(tmp_path_factory.mktemp("chain"))
    try:
        yield c
    finally:
        c.stop()

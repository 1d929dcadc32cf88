from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.harness import Chain, start_chain


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "real nodes need root (network and mount namespaces, cgroups, containerd)"
    for tool in ("unshare", "nsenter", "ip", "iptables", "buildah", "mmdebstrap"):
        if not shutil.which(tool):
            return f"{tool} is missing: run `make setup`"
    return None


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    why = _why_not()
    if why:
        pytest.fail(why)
    c = start_chain(tmp_path_factory.mktemp("chain"))
    try:
        yield c
    finally:
        c.stop()

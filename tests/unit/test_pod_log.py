"""A pod's log as the tests read it from a node's kubelet files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from localcluster.node import RealNode


def test_a_log_file_removed_while_read_is_left_out(tmp_path: Path) -> None:
    """A pod's log read as the kubelet removes it (its pod deleted by a ScaleIn): a file
    listed and gone before it was read failed the reader (the Torchrun tour in CI). A link to
    no file is that moment held still."""
    node = RealNode("node-1", 1, cast(Any, None), cast(Any, None), cast(Any, None), tmp_path, "")
    pod = node.pod_log_dir("ns", "w", "uid")
    (pod / "worker").mkdir(parents=True)
    (pod / "worker" / "0.log").write_text("2026-11-30T10:00:00Z stdout F step 1\n")
    (pod / "worker" / "1.log").symlink_to(pod / "worker" / "gone.log")
    assert node.pod_log("ns", "w", "uid") == "step 1\n"

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


def test_a_poller_reads_each_record_once_and_whole(tmp_path: Path) -> None:
    """A poller's reads (the Torchrun tests' logbook, every 0.3 s): each returns only what was
    written since the last, whole records only (a line the kubelet was still writing, or a
    long line split into CRI's partial records, comes whole at the next read), and a file
    removed meanwhile (the pod deleted) costs nothing read before."""
    node = RealNode("node-1", 1, cast(Any, None), cast(Any, None), cast(Any, None), tmp_path, "")
    pod = node.pod_log_dir("ns", "w", "uid")
    (pod / "worker").mkdir(parents=True)
    log = pod / "worker" / "0.log"
    read: dict[str, tuple[int, str]] = {}
    log.write_text("T stdout F STEP 1\nT stdout P STEP ")
    assert node.pod_log_since("ns", "w", "uid", read) == "STEP 1\n"
    with log.open("a") as f:
        f.write("2 first\nT stdout F  part two\nT stderr F warn")
    assert node.pod_log_since("ns", "w", "uid", read) == "STEP 2 first part two\n"
    assert node.pod_log_since("ns", "w", "uid", read) == ""
    with log.open("a") as f:
        f.write("ing\n")
    assert node.pod_log_since("ns", "w", "uid", read) == "warning\n"
    # the whole log, as pod_log reads it, is what the reads gave together
    assert node.pod_log("ns", "w", "uid") == "STEP 1\nSTEP 2 first part two\nwarning\n"
    log.unlink()
    assert node.pod_log_since("ns", "w", "uid", read) == ""


def test_a_container_s_runs_read_in_their_order(tmp_path: Path) -> None:
    """A container restarted ten times: its eleventh run's log (10.log) comes after its third's
    (2.log), as `kubectl logs` tells them; a long line's parts read so far end the log."""
    node = RealNode("node-1", 1, cast(Any, None), cast(Any, None), cast(Any, None), tmp_path, "")
    pod = node.pod_log_dir("ns", "w", "uid")
    (pod / "worker").mkdir(parents=True)
    for run in range(11):
        (pod / "worker" / f"{run}.log").write_text(f"T stdout F run {run}\n")
    (pod / "worker" / "10.log").write_text("T stdout F run 10\nT stdout P saving\n")
    runs = [f"run {run}\n" for run in range(11)]
    assert node.pod_log("ns", "w", "uid") == "".join(runs) + "saving"

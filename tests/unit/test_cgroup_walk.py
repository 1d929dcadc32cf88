"""Reading a cgroup tree while it changes: a container's group goes once its processes are gone,
so a group listed by the walk can be gone by the time it is read."""

from pathlib import Path

from localcluster.nodeclean import tree_pids


def test_a_group_gone_between_listing_and_reading_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").write_text("11\n12\n")
    live = tmp_path / "pod-a" / "ctr-1"
    live.mkdir(parents=True)
    (live / "cgroup.procs").write_text("21\n")
    gone = tmp_path / "pod-a" / "ctr-2"
    gone.mkdir()
    # listed by the walk, unreadable by the time it is read: what a vanished group looks like
    (gone / "cgroup.procs").symlink_to(tmp_path / "removed")

    assert sorted(tree_pids(tmp_path)) == [11, 12, 21]


def test_an_empty_or_missing_tree_has_no_processes(tmp_path: Path) -> None:
    assert tree_pids(tmp_path / "never-made") == []
    (tmp_path / "cgroup.procs").write_text("")
    assert tree_pids(tmp_path) == []

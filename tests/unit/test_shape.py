"""`make lint`'s shape check (hack/shape.py) fails on each kind of offence, naming it, and
passes the project as it is."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.modules import load

ROOT = Path(__file__).resolve().parents[2]


def shape() -> ModuleType:
    return load("hack/shape.py")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the parts the check reads."""
    for part in ("etoperator", "localcluster", "bench"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "hack").mkdir()
    shutil.copy(ROOT / "hack" / "shape-baseline.txt", tmp_path / "hack")
    shutil.copy(ROOT / "README.md", tmp_path)
    return tmp_path


def test_the_project_passes() -> None:
    assert shape().offences(ROOT) == []


@pytest.mark.parametrize(
    "path, text, said",
    [
        ("etoperator/planning/x.py", "import kubernetes\n", "a pure part imports kubernetes"),
        ("etoperator/builders/x.py", "from etoperator import kube\n", "imports etoperator.kube"),
        ("bench/x.py", "from tests.harness import Cluster\n", "imports the tests"),
        ("localcluster/x.py", "from etoperator.reconcile import job\n", "public face"),
        ("etoperator/x.py", "def f():\n" + "    pass\n" * 50, "function etoperator/x.py:f: 51"),
        ("etoperator/y.py", "class C:\n" + "    a = 1\n" * 300, "class etoperator/y.py:C: 301"),
        ("bench/z.py", "a = 1\n" * 401, "module bench/z.py: 401"),
        ("README.md", "line\n" * 301, "README.md: 301"),
    ],
)
def test_each_offence_fails_naming_its_offender(
    tree: Path, path: str, text: str, said: str
) -> None:
    (tree / path).write_text(text)
    found = shape().offences(tree)
    assert any(said in line for line in found), found


def baselined(tree: Path, lines: int = 450) -> Path:
    """A module over the limit that the baseline lists at its size."""
    target = tree / "localcluster" / "big.py"
    target.write_text("a = 1\n" * lines)
    with open(tree / "hack" / "shape-baseline.txt", "a") as f:
        f.write(f"module localcluster/big.py {lines}\n")
    return target


def test_a_part_of_the_baseline_may_not_grow(tree: Path) -> None:
    target = baselined(tree)
    assert shape().offences(tree) == []
    target.write_text(target.read_text() + "# one more line\n")
    assert any("grew from" in line and "big.py" in line for line in shape().offences(tree))


def test_a_baseline_looser_than_the_code_fails(tree: Path) -> None:
    """A part that shrank must have its line lowered (or removed once within its limit):
    otherwise it could grow back to the old size unseen."""
    target = baselined(tree)
    target.write_text("a = 1\n" * 449)  # one line less
    found = shape().offences(tree)
    assert any("lower its line" in line and "big.py" in line for line in found), found
    target.write_text("a = 1\n")
    found = shape().offences(tree)
    assert any("remove its line" in line and "module localcluster/big.py" in line for line in found)

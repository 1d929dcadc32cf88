"""The code's shape, checked by `make lint`: import layers and sizes, each failure naming its
offender. Standard library only (ast): no dependency to install for it.

Layers: the pure parts (planning/, builders/, api/, status.py, naming.py, clock.py) import
no client (kubernetes, kopf, paramiko, urllib3) and nothing of reconcile/, kube.py or the
handlers; bench/ and localcluster/ import nothing of tests/; localcluster/ reaches the operator
only through its public face (PUBLIC).

Sizes: a function at most 50 lines, a class 300, a module 400, the README 300. The parts that
were larger when the check came are listed in hack/shape-baseline.txt with their size then: each
may shrink, none may grow, and no new one may join (a ratchet, paid down over time); a line
looser than the code fails too, so that what shrank cannot grow back.

    python hack/shape.py [ROOT]          exit 1 and one line per offence
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

FUNCTION, CLASS, MODULE, README = 50, 300, 400, 300
TREES = ("etoperator", "localcluster", "bench")
PURE = (
    "etoperator/planning", "etoperator/builders", "etoperator/api", "etoperator/status.py",
    "etoperator/naming.py", "etoperator/clock.py",
)  # fmt: skip
CLIENTS = ("kubernetes", "kopf", "paramiko", "urllib3")
IMPURE = ("etoperator.reconcile", "etoperator.kube", "etoperator.apiwire", "etoperator.handlers",
          "etoperator.runtime")  # fmt: skip
# What localcluster/ may use of the operator: its command (how anyone runs it), its names,
# models, builders of manifests and the client it talks to the apiserver with.
PUBLIC = (
    "etoperator.cli", "etoperator.naming", "etoperator.kube", "etoperator.api",
    "etoperator.clock", "etoperator.builders",
)  # fmt: skip
BASELINE = "hack/shape-baseline.txt"


def imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            if "." not in node.module:  # `from etoperator import kube`
                for alias in node.names:
                    yield node.lineno, f"{node.module}.{alias.name}"


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layer_offences(rel: str, tree: ast.Module) -> Iterator[str]:
    pure = any(rel == p or rel.startswith(p + "/") for p in PURE)
    for line, name in imports(tree):
        where = f"{rel}:{line}"
        if pure and (under(name, CLIENTS) or under(name, IMPURE)):
            yield f"{where}: a pure part imports {name}"
        if rel.startswith(("bench/", "localcluster/")) and under(name, ("tests",)):
            yield f"{where}: imports the tests ({name})"
        inside = rel.startswith("localcluster/") and under(name, ("etoperator",))
        if inside and name != "etoperator" and not under(name, PUBLIC):
            yield f"{where}: reaches past the operator's public face ({name})"


def sizes(rel: str, text: str, tree: ast.Module) -> Iterator[tuple[str, int, int]]:
    """(what, lines, limit) of every part over its limit."""
    lines = len(text.splitlines())
    if lines > MODULE:
        yield f"module {rel}", lines, MODULE
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            kind, limit = (
                ("class", CLASS) if isinstance(node, ast.ClassDef) else ("function", FUNCTION)
            )
            if n > limit:
                yield f"{kind} {rel}:{node.name}", n, limit


def baseline(root: Path) -> dict[str, int]:
    path = root / BASELINE
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            what, _, n = line.rpartition(" ")
            out[what] = int(n)
    return out


def offences(root: Path) -> list[str]:
    known = baseline(root)
    found: list[str] = []
    seen: dict[str, int] = {}
    for tree_name in TREES:
        for path in sorted((root / tree_name).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            text = path.read_text()
            tree = ast.parse(text, rel)
            found.extend(layer_offences(rel, tree))
            for what, n, limit in sizes(rel, text, tree):
                seen[what] = n
                if what not in known:
                    found.append(f"{what}: {n} lines (at most {limit})")
                elif n > known[what]:
                    found.append(f"{what}: {n} lines, grew from {known[what]} (at most {limit})")
    found.extend(slack(known, seen))
    readme = len((root / "README.md").read_text().splitlines())
    if readme > README:
        found.append(f"README.md: {readme} lines (at most {README})")
    return found


def slack(known: dict[str, int], seen: dict[str, int]) -> Iterator[str]:
    """Baseline lines looser than the code: a ratchet that is not tightened as parts shrink
    lets them grow back unseen."""
    for what, n in known.items():
        if what not in seen:
            yield f"{what}: now within its limit; remove its line from {BASELINE}"
        elif seen[what] < n:
            yield f"{what}: now {seen[what]} lines; lower its line in {BASELINE} from {n}"


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    found = offences(root)
    for line in found:
        print(f"shape: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

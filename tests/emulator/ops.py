"""Selectors and patches, as the API server applies them."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any


class PatchError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- label selectors --------------------------------------------------------------------------


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


_SET = re.compile(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$")
_EQ = re.compile(r"^([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)$")


def _in(key: str, values: set[str], inside: bool) -> Callable[[dict[str, str]], bool]:
    return lambda labels: (labels.get(key) in values) == inside


def _has(key: str, present: bool) -> Callable[[dict[str, str]], bool]:
    return lambda labels: (key in labels) == present


def label_matcher(selector: str | None) -> Callable[[dict[str, str]], bool]:
    """A predicate over labels; ValueError on a malformed selector."""
    if not selector:
        return lambda labels: True
    tests: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_top(selector):
        if m := _SET.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            tests.append(_in(key, values, op == "in"))
        elif m := _EQ.match(term):
            key, op, value = m.groups()
            tests.append(_in(key, {value}, op != "!="))
        elif re.match(r"^![\w./-]+$", term):
            tests.append(_has(term[1:], False))
        elif re.match(r"^[\w./-]+$", term):
            tests.append(_has(term, True))
        else:
            raise ValueError(f"unable to parse requirement: {term!r}")
    return lambda labels: all(t(labels) for t in tests)


def _dig(obj: Any, dotted: str) -> Any:
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def field_matcher(selector: str | None) -> Callable[[dict[str, Any]], bool]:
    if not selector:
        return lambda obj: True
    tests = []
    for term in _split_top(selector):
        m = re.match(r"^([\w.]+)\s*(==|=|!=)\s*(.*)$", term)
        if not m:
            raise ValueError(f"invalid field selector: {term!r}")
        path, op, value = m.groups()

        def test(obj: dict[str, Any], p: str = path, o: str = op, v: str = value) -> bool:
            actual = _dig(obj, p)
            actual_s = "" if actual is None else str(actual)
            return (actual_s == v) if o != "!=" else (actual_s != v)

        tests.append(test)
    return lambda obj: all(t(obj) for t in tests)


# -- patches ----------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Merge patch, except that lists of objects with `name` merge by name (containers, env,
    volumes, ports...) and `$patch: delete` removes an entry."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        elif (
            isinstance(value, list)
            and isinstance(out.get(key), list)
            and value
            and all(isinstance(x, dict) and "name" in x for x in value)
            and all(isinstance(x, dict) and "name" in x for x in out[key])
        ):
            merged = {x["name"]: x for x in out[key]}
            order = [x["name"] for x in out[key]]
            for item in value:
                if item.get("$patch") == "delete":
                    merged.pop(item["name"], None)
                    continue
                if item["name"] not in merged:
                    order.append(item["name"])
                merged[item["name"]] = strategic_merge_patch(merged.get(item["name"]), item)
            out[key] = [merged[n] for n in order if n in merged]
        else:
            out[key] = strategic_merge_patch(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    cur = doc
    for p in parts[:-1]:
        if isinstance(cur, list):
            cur = cur[int(p)]
        elif isinstance(cur, dict) and p in cur:
            cur = cur[p]
        else:
            raise PatchError(422, f"path /{'/'.join(parts)} does not exist")
    return cur, parts[-1]


def _get(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for p in parts:
        try:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        except (KeyError, IndexError, ValueError, TypeError):
            raise PatchError(422, f"path /{'/'.join(parts)} does not exist") from None
    return cur


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902; a failed `test` is 422, as on a real API server."""
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        if kind == "test":
            if _get(doc, parts) != op.get("value"):
                raise PatchError(422, f"test operation failed at {op.get('path')}")
            continue
        if kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, _pointer(op["from"])))
            if kind == "move":
                doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
            doc = json_patch(doc, [{"op": "add", "path": op["path"], "value": value}])
            continue
        if not parts:
            if kind in ("add", "replace"):
                doc = copy.deepcopy(op["value"])
                continue
            raise PatchError(422, "cannot remove the root")
        parent, last = _parent(doc, parts)
        if kind == "add":
            if isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                parent.insert(idx, copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind == "replace":
            _get(doc, parts)
            if isinstance(parent, list):
                parent[int(last)] = copy.deepcopy(op["value"])
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            _get(doc, parts)
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        else:
            raise PatchError(422, f"unknown JSON patch op {kind!r}")
    return doc

"""Structural-schema behaviour of a CRD: defaults, pruning, validation and the CEL rules we use.

CEL is evaluated by translating the small subset our CRDs use (has(), field access, size(),
comparisons, &&, ||, !) into a Python expression over a read-only view; anything outside that
subset is reported as an error, so a rule this emulator cannot judge is never silently passed.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema  # type: ignore[import-untyped]

Schema = dict[str, Any]


def apply_defaults(obj: Any, schema: Schema) -> Any:
    if isinstance(obj, dict) and schema.get("type") == "object":
        for key, sub in (schema.get("properties") or {}).items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                obj[key] = apply_defaults(obj[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in obj:
                if key not in (schema.get("properties") or {}):
                    obj[key] = apply_defaults(obj[key], extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(x, schema["items"]) for x in obj]
    return obj


def prune(obj: Any, schema: Schema, root: bool = False) -> Any:
    if isinstance(obj, dict) and schema.get("type") == "object":
        props = schema.get("properties") or {}
        keep_unknown = (
            schema.get("x-kubernetes-preserve-unknown-fields")
            or isinstance(schema.get("additionalProperties"), dict)
            or schema.get("additionalProperties") is True
        )
        out = {}
        for key, value in obj.items():
            if root and key in ("apiVersion", "kind", "metadata"):
                out[key] = value
            elif key in props:
                out[key] = prune(value, props[key])
            elif isinstance(schema.get("additionalProperties"), dict):
                out[key] = prune(value, schema["additionalProperties"])
            elif keep_unknown:
                out[key] = value
        return out
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [prune(x, schema["items"]) for x in obj]
    return obj


def _to_jsonschema(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {}
        for k, v in schema.items():
            if k.startswith("x-kubernetes-") or k in ("default", "description", "format"):
                continue
            out[k] = _to_jsonschema(v)
        if schema.get("nullable"):
            out.pop("nullable", None)
            t = out.get("type")
            if isinstance(t, str):
                out["type"] = [t, "null"]
        return out
    if isinstance(schema, list):
        return [_to_jsonschema(x) for x in schema]
    return schema


def _path(err: jsonschema.ValidationError) -> str:
    parts = []
    for p in err.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else f".{p}")
    return "".join(parts).lstrip(".") or "<root>"


def validate(obj: Any, schema: Schema) -> list[str]:
    """Problems with `obj`, in the API server's `field: message` style."""
    validator = jsonschema.Draft7Validator(_to_jsonschema(schema))
    problems = [f"{_path(e)}: {e.message}" for e in validator.iter_errors(obj)]
    problems += _cel(obj, schema, "")
    return sorted(problems)


# -- CEL subset -----------------------------------------------------------------------------


class _View:
    """`self` in a CEL rule: attribute access on a dict."""

    def __init__(self, value: Any) -> None:
        self._v = value

    def __getattr__(self, name: str) -> Any:
        v = self._v.get(name) if isinstance(self._v, dict) else None
        if v is None:
            raise KeyError(name)
        return _View(v) if isinstance(v, dict) else v


def _has(view: _View, dotted: str) -> bool:
    cur: Any = view._v
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False
        cur = cur[part]
    return True


_TOKEN = re.compile(
    r"\s*(has\(self\.[\w.]+\)|size\(|self(?:\.\w+)*|\d+|&&|\|\||!=|==|<=|>=|<|>|!|\(|\)|'[^']*')"
)


def _translate(rule: str) -> str:
    out, pos = [], 0
    while pos < len(rule):
        m = _TOKEN.match(rule, pos)
        if not m:
            if rule[pos:].strip() == "":
                break
            raise ValueError(f"unsupported CEL at {rule[pos:]!r}")
        tok = m.group(1)
        pos = m.end()
        if tok.startswith("has("):
            out.append(f"_has(self, {tok[9:-1]!r})")
        elif tok == "size(":
            out.append("len(")
        elif tok == "&&":
            out.append(" and ")
        elif tok == "||":
            out.append(" or ")
        elif tok == "!":
            out.append(" not ")
        else:
            out.append(tok)
    return "".join(out)


def eval_cel(rule: str, value: Any) -> bool:
    expr = _translate(rule)
    return bool(eval(expr, {"__builtins__": {"len": len}, "_has": _has}, {"self": _View(value)}))


def _cel(obj: Any, schema: Schema, path: str) -> list[str]:
    problems: list[str] = []
    if obj is None:
        return problems
    for rule in schema.get("x-kubernetes-validations") or []:
        try:
            ok = eval_cel(rule["rule"], obj)
        except KeyError as exc:
            ok, rule = False, {**rule, "message": f"no such key: {exc}"}
        if not ok:
            problems.append(
                f"{path or '<root>'}: Invalid value: {rule.get('message') or rule['rule']}"
            )
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj:
                problems += _cel(obj[key], sub, f"{path}.{key}".lstrip("."))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            problems += _cel(item, schema["items"], f"{path}[{i}]")
    return problems

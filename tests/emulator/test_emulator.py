"""The emulator's own tests: the API behaviours the operator, kopf and kubectl rely on."""

from __future__ import annotations

import datetime
import json
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etoperator import kube
from tests.emulator.server import Emulator
from tests.harness import ROOT, wait_for
from tests.integration.jobs import job

Emu = tuple[Emulator, kube.Kube, Path]


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Emulator, kube.Kube, Path]]:
    tmp = tmp_path_factory.mktemp("emu")
    e = Emulator(ROOT / "crds", bookmark_interval=0.2)
    e.start(tmp / "tls")
    kc = e.kubeconfig(tmp / "kubeconfig")
    yield e, kube.Kube(kube.load_config(str(kc))), kc
    e.stop()


def raw(
    e: Emulator,
    method: str,
    path: str,
    body: Any = None,
    ctype: str = "application/json",
    accept: str = "application/json",
) -> tuple[int, Any]:
    ctx = ssl.create_default_context(cafile=str(e.ca))
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        e.url + path, data=data, method=method, headers={"Content-Type": ctype, "Accept": accept}
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "data": data,
    }


def test_discovery(emu: Emu) -> None:
    e, _, _ = emu
    assert raw(e, "GET", "/version")[1]["major"] == "1"
    groups = {g["name"] for g in raw(e, "GET", "/apis")[1]["groups"]}
    assert {"kai.alibabacloud.com", "rbac.authorization.k8s.io"} <= groups
    res = raw(e, "GET", "/apis/kai.alibabacloud.com/v1alpha1")[1]["resources"]
    names = {r["name"]: r for r in res}
    assert names["trainingjobs"]["shortNames"] == ["tj"]
    assert {"trainingjobs/status", "trainingjobs/scale", "scaleins/status"} <= set(names)


def test_metadata_and_conflicts(emu: Emu) -> None:
    e, api, _ = emu
    obj = api.create(cm("c1", a="1"))
    meta = obj["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"]
    stale = meta["resourceVersion"]
    api.patch("ConfigMap", "default", "c1", {"data": {"a": "2"}})
    with pytest.raises(kube.Conflict):
        api.patch(
            "ConfigMap",
            "default",
            "c1",
            {"metadata": {"resourceVersion": stale}, "data": {"a": "3"}},
        )
    with pytest.raises(kube.AlreadyExists):
        api.create(cm("c1"))
    gen = api.create({**cm(""), "metadata": {"generateName": "gen-", "namespace": "default"}})
    assert gen["metadata"]["name"].startswith("gen-") and len(gen["metadata"]["name"]) == 9


def test_json_patch_test_failure_is_422(emu: Emu) -> None:
    e, api, _ = emu
    api.create(cm("c2", a="1"))
    code, body = raw(
        e,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/c2",
        [
            {"op": "test", "path": "/data/a", "value": "nope"},
            {"op": "replace", "path": "/data/a", "value": "x"},
        ],
        ctype="application/json-patch+json",
    )
    assert code == 422 and "test operation failed" in body["message"]
    code, _ = raw(
        e,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/c2",
        [
            {"op": "test", "path": "/data/a", "value": "1"},
            {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
        ],
        ctype="application/json-patch+json",
    )
    assert code == 200


def test_strategic_merge_by_name(emu: Emu) -> None:
    e, api, _ = emu
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p1", "namespace": "default"},
        "spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]},
    }
    api.create(pod)
    out = api.patch(
        "Pod",
        "default",
        "p1",
        {"spec": {"containers": [{"name": "b", "image": "2"}]}},
        content_type="application/strategic-merge-patch+json",
    )
    assert [(c["name"], c["image"]) for c in out["spec"]["containers"]] == [("a", "1"), ("b", "2")]


def test_selectors(emu: Emu) -> None:
    _, api, _ = emu
    api.create(cm("s1", {"app": "x", "tier": "a"}))
    api.create(cm("s2", {"app": "x", "tier": "b"}))
    api.create(cm("s3", {"app": "y"}))

    def names(sel: str) -> list[str]:
        return sorted(o["metadata"]["name"] for o in api.list("ConfigMap", "default", sel))

    assert names("app=x") == ["s1", "s2"]
    assert names("app=x,tier!=a") == ["s2"]
    assert names("tier in (a,b)") == ["s1", "s2"]
    assert names("app,!tier") == ["s3"]
    ev = api._call(
        "GET",
        "/api/v1/namespaces/default/configmaps",
        query=[("fieldSelector", "metadata.name=s3")],
    )
    assert [o["metadata"]["name"] for o in ev["items"]] == ["s3"]


def test_status_subresource_and_schema(emu: Emu) -> None:
    _, api, _ = emu
    body = job("sj")
    body["metadata"]["namespace"] = "default"
    body["status"] = {"phase": "Hacked"}
    body["spec"]["unknownField"] = 1
    obj = api.create(body)
    assert "status" not in obj  # ignored on create
    assert "unknownField" not in obj["spec"]  # pruned
    assert obj["spec"]["backoffLimit"] == 6  # defaulted
    api.patch("TrainingJob", "default", "sj", {"status": {"phase": "Running"}}, sub="status")
    out = api.patch(
        "TrainingJob", "default", "sj", {"status": {"phase": "X"}, "spec": {"backoffLimit": 2}}
    )
    assert out["status"]["phase"] == "Running" and out["spec"]["backoffLimit"] == 2
    assert out["metadata"]["generation"] == 2
    with pytest.raises(kube.ApiError) as err:
        api.patch("TrainingJob", "default", "sj", {"spec": {"backoffLimit": -1}})
    assert err.value.status == 422


def test_scale_subresource(emu: Emu) -> None:
    e, api, _ = emu
    body = job("sc", maxReplicas=5)
    body["metadata"]["namespace"] = "default"
    api.create(body)
    code, scale = raw(
        e, "GET", "/apis/kai.alibabacloud.com/v1alpha1/namespaces/default/trainingjobs/sc/scale"
    )
    assert code == 200 and scale["spec"]["replicas"] == 2
    code, _ = raw(
        e,
        "PATCH",
        "/apis/kai.alibabacloud.com/v1alpha1/namespaces/default/trainingjobs/sc/scale",
        {"spec": {"replicas": 4}},
        ctype="application/merge-patch+json",
    )
    assert code == 200
    scaled = api.get("TrainingJob", "default", "sc")
    assert scaled is not None and scaled["spec"]["etReplicaSpecs"]["worker"]["replicas"] == 4


def watch_lines(e: Emulator, path: str, stop_after: int) -> list[dict[str, Any]]:
    ctx = ssl.create_default_context(cafile=str(e.ca))
    out = []
    with urllib.request.urlopen(e.url + path, context=ctx, timeout=10) as resp:
        for line in resp:
            out.append(json.loads(line))
            if len(out) >= stop_after:
                break
    return out


def test_watch_resume_bookmarks_and_timeout(emu: Emu) -> None:
    e, api, _ = emu
    first = api.create(cm("w1", {"w": "1"}))
    rv = first["metadata"]["resourceVersion"]
    api.patch("ConfigMap", "default", "w1", {"data": {"x": "1"}})
    api.create(cm("w2", {"w": "1"}))
    api.create(cm("w3", {"other": "1"}))
    events = watch_lines(
        e,
        f"/api/v1/namespaces/default/configmaps?watch=1&labelSelector=w%3D1"
        f"&resourceVersion={rv}&timeoutSeconds=2",
        2,
    )
    assert [(ev["type"], ev["object"]["metadata"]["name"]) for ev in events] == [
        ("MODIFIED", "w1"),
        ("ADDED", "w2"),
    ]
    marks = watch_lines(
        e,
        "/api/v1/namespaces/default/configmaps?watch=1&labelSelector=none%3D1"
        "&allowWatchBookmarks=true&timeoutSeconds=2",
        1,
    )
    assert marks[0]["type"] == "BOOKMARK" and marks[0]["object"]["metadata"]["resourceVersion"]
    # timeoutSeconds ends the stream.
    assert (
        watch_lines(
            e,
            "/api/v1/namespaces/default/configmaps?watch=1&labelSelector=none%3D1&timeoutSeconds=1",
            5,
        )
        == []
    )


def test_live_watch_sees_changes(emu: Emu) -> None:
    e, api, _ = emu
    got: list[dict[str, Any]] = []
    t = threading.Thread(
        target=lambda: got.extend(
            watch_lines(
                e,
                "/api/v1/namespaces/default/configmaps?watch=1&labelSelector=live%3D1"
                "&timeoutSeconds=5",
                2,
            )
        )
    )
    t.start()
    wait_for(lambda: any(w.res.plural == "configmaps" for w in e.store.watchers), 5)
    api.create(cm("l1", {"live": "1"}))
    api.delete("ConfigMap", "default", "l1")
    t.join(10)
    assert [g["type"] for g in got] == ["ADDED", "DELETED"]


def test_finalizers_and_garbage_collection(emu: Emu) -> None:
    _, api, _ = emu
    owner = api.create(cm("owner"))
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    child = cm("child")
    child["metadata"]["ownerReferences"] = [ref]
    api.create(child)
    held = cm("held")
    held["metadata"].update(ownerReferences=[ref], finalizers=["test/hold"])
    api.create(held)
    api.delete("ConfigMap", "default", "owner")
    assert api.get("ConfigMap", "default", "child") is None
    h = api.get("ConfigMap", "default", "held")
    assert h is not None and h["metadata"]["deletionTimestamp"]
    api.patch("ConfigMap", "default", "held", {"metadata": {"finalizers": None}})
    assert api.get("ConfigMap", "default", "held") is None


def test_delete_collection(emu: Emu) -> None:
    e, api, _ = emu
    for n in ("d1", "d2"):
        api.create(cm(n, {"coll": "1"}))
    code, _ = raw(e, "DELETE", "/api/v1/namespaces/default/configmaps?labelSelector=coll%3D1")
    assert code == 200 and api.list("ConfigMap", "default", "coll=1") == []


def test_events_and_tables_through_kubectl(emu: Emu) -> None:
    e, api, kc = emu
    body = job("tbl")
    body["metadata"]["namespace"] = "default"
    obj = api.create(body)
    api.patch(
        "TrainingJob",
        "default",
        "tbl",
        {"status": {"phase": "Running", "replicas": 2}},
        sub="status",
    )
    api.event(obj, "Warning", "Testing", "an event for describe", datetime.datetime.now())

    def run(*a: str) -> str:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(kc), *a], capture_output=True, text=True, check=True
        ).stdout

    table = run("get", "tj", "tbl")
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "WORKERS", "TARGET", "AGE"]
    assert row.split()[:4] == ["tbl", "Running", "2", "2"]
    described = run("describe", "trainingjob", "tbl")
    assert "an event for describe" in described and "Testing" in described
    run("delete", "tj", "tbl")
    assert api.get("TrainingJob", "default", "tbl") is None


def test_dependent_created_after_its_owner_is_collected(emu: Emu) -> None:
    _, api, _ = emu
    late = cm("late")
    late["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "ghost",
            "uid": "no-such-uid",
            "controller": True,
        }
    ]
    api.create(late)
    wait_for(lambda: api.get("ConfigMap", "default", "late") is None, 5, "orphan collected")

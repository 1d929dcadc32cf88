from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from etoperator import naming
from etoperator.api.fields import InvalidSpec
from etoperator.api.models import parse_job
from etoperator.api.scalers import parse_scaler
from localcluster.manifests import job, scalein, scaleout


@pytest.mark.parametrize(
    "name,ok",
    [
        ("a", True),
        ("job-1", True),
        ("a" * naming.MAX_JOB_NAME, True),
        ("a" * (naming.MAX_JOB_NAME + 1), False),
        ("Job", False),
        ("-a", False),
        ("a-", False),
        ("a_b", False),
        ("a.b", False),
        ("", False),
        ("a;rm -rf", False),
        ("9lives", False),  # its Services would not be DNS-1035 labels
        ("v9", True),
    ],
)
def test_job_name_problem(name: str, ok: bool) -> None:
    assert (naming.job_name_problem(name) is None) == ok


@pytest.mark.parametrize(
    "pod,index",
    [
        ("j-worker-0", 0),
        ("j-worker-10", 10),
        ("j-worker-1", 1),
        ("j-worker-01", None),
        ("j-worker-", None),
        ("j-worker-1x", None),
        ("k-worker-1", None),
        ("j-launcher", None),
    ],
)
def test_worker_index(pod: str, index: int | None) -> None:
    assert naming.worker_index("j", pod) == index


def test_scaler_ref_round_trip() -> None:
    ref = naming.scaler_ref("ScaleIn", "ns", "s")
    assert ref == "ScaleIn:ns/s"
    assert naming.parse_scaler_ref(ref) == ("ScaleIn", "ns", "s")
    assert naming.parse_scaler_ref("") is None
    assert naming.parse_scaler_ref("Pod:ns/x") is None


def body(**kw: Any) -> dict[str, Any]:
    b = job("j", **kw)
    b["metadata"].update(namespace="ns", uid="u1")
    return b


def test_parse_job_defaults() -> None:
    b = body()
    del b["spec"]["etReplicaSpecs"]["worker"]["replicas"]
    spec = parse_job(b)
    assert spec.worker.replicas == 1 and spec.worker.min_replicas == 1
    assert spec.worker.max_replicas is None and spec.worker.restart_policy == "Never"
    assert spec.backoff_limit == 6 and spec.clean_pod_policy == "Running"
    assert spec.restart_policy == "Never" and spec.slots_per_worker == 1
    assert spec.launcher.restart_policy == "Never" and not spec.suspended


def test_slots_default_to_gpu_limit() -> None:
    b = body()
    c = b["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    c["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    assert parse_job(b).slots_per_worker == 4
    b["spec"]["slotsPerWorker"] = 2
    assert parse_job(b).slots_per_worker == 2


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda b: b["spec"]["etReplicaSpecs"]["worker"].update(minReplicas=5), "minReplicas"),
        (lambda b: b["spec"]["etReplicaSpecs"]["worker"].update(maxReplicas=1), "maxReplicas"),
        (lambda b: b["spec"]["etReplicaSpecs"]["worker"].update(replicas="2"), "integer"),
        (lambda b: b["spec"]["etReplicaSpecs"].pop("worker"), "worker"),
        (lambda b: b["spec"].update(cleanPodPolicy="Some"), "cleanPodPolicy"),
        (lambda b: b["spec"].update(backoffLimit=-1), "backoffLimit"),
        (lambda b: b["metadata"].update(name="x" * 60), "63-character"),
        (
            lambda b: b["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"].update(
                containers=[]
            ),
            "containers",
        ),
        (lambda b: b["metadata"].update(annotations={naming.ANN_SSH_SECRET: "Bad Name"}), "Secret"),
    ],
)
def test_parse_job_refuses(mutate: Callable[[dict[str, Any]], object], needle: str) -> None:
    b = body()
    mutate(b)
    with pytest.raises(InvalidSpec, match=needle):
        parse_job(b)


def _launcher_spec(b: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = b["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]
    return spec


@pytest.mark.parametrize(
    "pod_ctx,container_ctx,refused",
    [
        ({"runAsUser": 1000}, None, True),
        (None, {"runAsUser": 1000}, True),
        ({"runAsUser": 1000}, {"runAsUser": 0}, False),  # the container's own wins
        ({"runAsUser": 0}, None, False),
        ({"fsGroup": 1000}, None, False),
    ],
)
def test_a_non_root_launcher_is_refused_at_once(
    pod_ctx: dict[str, Any] | None, container_ctx: dict[str, Any] | None, refused: bool
) -> None:
    """ssh in the launcher needs the job's key under /root/.ssh and a passwd entry: a launcher
    that runs as another user could never reach a worker, so the job says so before any pod."""
    b = body()
    spec = _launcher_spec(b)
    if pod_ctx is not None:
        spec["securityContext"] = pod_ctx
    if container_ctx is not None:
        spec["containers"][0]["securityContext"] = container_ctx
    if refused:
        with pytest.raises(InvalidSpec, match=r"launcher.*runs as uid 1000.*root"):
            parse_job(b)
    else:
        parse_job(b)


@pytest.mark.parametrize("path", ["/root/./.ssh", "/root//.ssh/", "/etc/../etc/edl", "/root/.ssh/"])
def test_reserved_mount_paths_are_compared_normalized(path: str) -> None:
    b = body()
    _launcher_spec(b)["containers"][0]["volumeMounts"] = [{"name": "x", "mountPath": path}]
    with pytest.raises(InvalidSpec, match="where the operator mounts its own volume"):
        parse_job(b)


def test_parse_job_does_not_mutate_input() -> None:
    b = body()
    before = copy.deepcopy(b)
    spec = parse_job(b)
    spec.worker.template["spec"]["containers"][0]["name"] = "changed"
    assert b == before


def test_suspend_annotation() -> None:
    b = body(annotations={naming.ANN_SUSPENDED: "true"})
    assert parse_job(b).suspended


@pytest.mark.parametrize(
    "manifest,needle",
    [
        (scalein("s", "j"), "exactly one"),
        (scalein("s", "j", count=1, pod_names=["j-worker-0"]), "exactly one"),
        (scalein("s", "j", pod_names=[]), "from 1 to"),
        (scalein("s", "j", pod_names=["j-worker-0", "j-worker-0"]), "twice"),
        (scalein("s", "j", pod_names=["$(reboot)"]), "invalid pod name"),
        (scaleout("s", "j", 0), "at least 1"),
        (scaleout("s", "Bad_Job", 1), "not a valid"),
        (scaleout("s", "j", 1, timeout=2_147_479), "spec.timeout must be at most 86400"),
    ],
)
def test_parse_scaler_refuses(manifest: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidSpec, match=needle):
        parse_scaler(manifest["kind"], manifest)


def test_a_variable_longer_than_one_argument_may_be_is_refused() -> None:
    """The script's variables reach it as `env NAME=value` arguments: Linux refuses one over
    128 KiB (MAX_ARG_STRLEN, its NUL counted), and the script would never start."""
    m = scaleout("s", "j", 1)
    m["spec"].update(script="/s.sh", env=[{"name": "BIG", "value": "é" * 65534}])  # 131068 B
    with pytest.raises(InvalidSpec, match=r"spec.env\[0\] \(BIG\) is 131072 bytes"):
        parse_scaler("ScaleOut", m)
    m["spec"]["env"] = [{"name": "BIG", "value": "x" * 131067}]  # BIG=... and its NUL: 128 KiB
    assert parse_scaler("ScaleOut", m).env[0][1] == "x" * 131067


def test_scaler_env_and_script() -> None:
    m = scaleout("s", "j", 1)
    m["spec"].update(script="/scripts/notify.sh", env=[{"name": "A", "value": "x y"}])
    spec = parse_scaler("ScaleOut", m)
    assert spec.env == (("A", "x y"),) and spec.timeout == 60
    m["spec"]["env"] = [{"name": "A=B; rm", "value": "x"}]
    with pytest.raises(InvalidSpec, match="variable name"):
        parse_scaler("ScaleOut", m)
    # A NUL byte can reach no process's environment: refused before any exec is tried.
    m["spec"]["env"] = [{"name": "A", "value": "x\0y"}]
    with pytest.raises(InvalidSpec, match=r"spec.env\[0\].value .*NUL"):
        parse_scaler("ScaleOut", m)
    m["spec"]["env"] = []
    m["spec"]["script"] = "relative.sh"
    with pytest.raises(InvalidSpec, match="absolute"):
        parse_scaler("ScaleOut", m)


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("resources", None, "containers[0].resources must be an object"),
        ("env", "x", "containers[0].env must be a list"),
        ("env", [{"name": 1}], "containers[0].env[0].name must be a string"),
        ("volumeMounts", "x", "containers[0].volumeMounts must be a list"),
        ("volumeMounts", [{"name": "v"}], "volumeMounts[0].mountPath must be a string"),
        ("command", "sh -c x", "containers[0].command must be a list"),
    ],
)
def test_malformed_templates_name_the_field(field: str, value: Any, needle: str) -> None:
    """What a cluster without the schema (or an object older than it) would let through."""
    b = job("j")
    b["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["containers"][0][field] = value
    with pytest.raises(InvalidSpec, match=re.escape(needle)):
        parse_job(b)


def test_template_labels_must_be_strings() -> None:
    b = job("j")
    b["spec"]["etReplicaSpecs"]["worker"]["template"]["metadata"] = {"labels": "abc"}
    with pytest.raises(InvalidSpec, match=r"template\.metadata\.labels must be an object"):
        parse_job(b)


@pytest.mark.parametrize(
    "spec,job",
    [
        ({"selector": {"name": "j"}}, "j"),
        ({"selector": "j"}, ""),
        ({"selector": ["j"]}, ""),
        ({"selector": {"name": 5}}, ""),
        ("spec", ""),
        (None, ""),
        ({}, ""),
    ],
)
def test_the_job_a_scaler_selects_whatever_its_shape(spec: Any, job: str) -> None:
    """Scalers written before the schema (or without it) may hold anything: the watch index and
    the event handler read their job without raising, and parsing says what is wrong."""
    body = {"metadata": {"name": "s", "namespace": "ns"}, "spec": spec}
    assert naming.selected_job(body) == job
    if not job:
        with pytest.raises(InvalidSpec, match="spec"):
            parse_scaler("ScaleOut", body)

"""Kueue on the local cluster: the real manager (hack/build-kueue.sh builds it from its module),
as a process beside the control plane, with its CRDs and webhooks.

What an administrator's install does, done here without a Service: the webhook server listens on
loopback with a certificate of the cluster's CA, and the webhook configurations and the CRDs'
conversion webhooks name it by URL. Only the webhooks of what this manager serves are
registered (Kueue's own kinds and batch Jobs): the others' handlers are not running, and a
webhook that fails closed would refuse every pod. The TrainingJob kind is named in
`integrations.externalFrameworks`; `ElasticJobsViaWorkloadSlices` is on.
"""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localcluster import procs
from localcluster.controlplane import ROOT, ControlPlane, _http_ok

BUILD = ROOT / "hack" / "build-kueue.sh"
EXTERNAL = "TrainingJob.v1alpha1.kai.alibabacloud.com"
# VisibilityOnDemand serves pending workloads through an APIService (a Service in front of it
# and a certificate at /visibility): not registered here.
FEATURES = "ElasticJobsViaWorkloadSlices=true,VisibilityOnDemand=false"
SERVED_GROUPS = {"kueue.x-k8s.io", "batch"}
# CRDs whose older version Kueue converts (its kustomization's conversion patches).
CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")


def built() -> Path:
    """The directory with bin/kueue, crd/ and webhook.yaml."""
    env = os.environ.get("ETOPERATOR_KUEUE_DIR")
    return Path(env) if env else procs.built(BUILD)


def config(port: int, health: int, metrics: int, cert_dir: Path) -> dict[str, Any]:
    """The manager's Configuration: no leader election (one manager), our certificate."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [EXTERNAL]},
    }


def webhooks(manifests: str, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, keeping only the webhooks of what the manager serves,
    each reaching it at `url` + its path."""
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        kept = []
        for hook in doc.get("webhooks") or []:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not groups <= SERVED_GROUPS:
                continue
            path = hook["clientConfig"]["service"]["path"]
            kept.append({**hook, "clientConfig": {"url": url + path, "caBundle": ca_bundle}})
        out.append({**doc, "webhooks": kept})
    return out


def with_conversion(crd: dict[str, Any], url: str, ca_bundle: str) -> dict[str, Any]:
    if crd["spec"]["names"]["plural"] not in CONVERTED:
        return crd
    conversion = {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {"url": f"{url}/convert", "caBundle": ca_bundle},
            "conversionReviewVersions": ["v1"],
        },
    }
    return {**crd, "spec": {**crd["spec"], "conversion": conversion}}


@dataclass
class Kueue:
    dir: Path
    cp: ControlPlane
    home: Path = field(default_factory=built)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> Kueue:
        """CRDs, the manager, then its webhooks once it serves them."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = procs.free_port()
        ca_bundle = base64.b64encode(self.cp.ca.read_bytes()).decode()
        self._apply_crds(ca_bundle)
        self._spawn(self.port)
        hooks = webhooks((self.home / "webhook.yaml").read_text(), self.url, ca_bundle)
        self._kubectl("apply", "-f", "-", input=yaml.safe_dump_all(hooks))
        procs.wait_until(self._admits, "kueue's webhooks", 60, self.proc, self.log)
        return self

    @property
    def log(self) -> Path:
        return self.dir / "kueue.log"

    def _apply_crds(self, ca_bundle: str) -> None:
        # libyaml's loader and dumper: 1.6 MB of CRDs took 3.8 CPU-seconds in Python's own,
        # at every cluster start.
        crds = [
            yaml.load(p.read_text(), Loader=yaml.CSafeLoader)
            for p in sorted((self.home / "crd").glob("*.yaml"))
        ]
        docs = [with_conversion(c, self.url, ca_bundle) for c in crds]
        # Server-side: the Workload CRD is larger than a client-side apply's annotation may be.
        text = yaml.dump_all(docs, Dumper=yaml.CSafeDumper)
        self._kubectl("apply", "--server-side", "-f", "-", input=text)
        names = [f"crd/{c['metadata']['name']}" for c in crds]
        # Polled, not `kubectl wait`: on a loaded machine that exited 1 within seconds (once).
        procs.wait_until(lambda: self._established(names), "Kueue's CRDs established", 60)
        self._kubectl("create", "namespace", "kueue-system", check=False)

    def _spawn(self, port: int) -> None:
        certs = self.dir / "certs"
        certs.mkdir(exist_ok=True)
        pair = self.cp.serving_cert("kueue-webhook", ("127.0.0.1", "localhost"))
        (certs / "tls.crt").write_bytes(pair.cert.read_bytes())
        (certs / "tls.key").write_bytes(pair.key.read_bytes())
        self.health = procs.free_port()
        cfg = config(port, self.health, procs.free_port(), certs)
        (self.dir / "config.yaml").write_text(yaml.safe_dump(cfg))
        # The administrator's manager: cluster-wide rights, as its ClusterRole grants.
        kc = self.cp.user_kubeconfig("kueue-manager", "kueue-manager", ("system:masters",))
        self.proc = procs.spawn(
            [
                *self._own_etc(certs),
                str(self.home / "bin" / "kueue"),
                f"--config={self.dir / 'config.yaml'}",
                f"--feature-gates={FEATURES}",
                "--zap-log-level=info",
            ],
            self.log,
            env=procs.go_env(
                {**os.environ, "KUBECONFIG": str(kc), "POD_NAMESPACE": "kueue-system"}
            ),
        )
        procs.wait_until(
            lambda: _http_ok(f"http://127.0.0.1:{self.health}/readyz"),
            "kueue's manager", 90, self.proc, self.log,
        )  # fmt: skip
        ctx = ssl.create_default_context(cafile=str(self.cp.ca))
        procs.wait_until(lambda: _serving(self.url, ctx), "kueue's webhook server", 60)

    def _own_etc(self, certs: Path) -> list[str]:
        """The manager reads its metrics certificate from /etc/kueue/metrics/certs, a path it
        does not let us change: it runs in a mount namespace of its own where /etc is an
        overlay holding that certificate (the machine's /etc is not touched)."""
        upper, work = self.dir / "etc", self.dir / "etc-work"
        (upper / "kueue" / "metrics").mkdir(parents=True, exist_ok=True)
        work.mkdir(exist_ok=True)
        target = upper / "kueue" / "metrics" / "certs"
        if not target.exists():
            target.symlink_to(certs)
        opts = f"lowerdir=/etc,upperdir={upper},workdir={work}"
        script = 'mount -t overlay overlay -o "$1" /etc && shift && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", opts]

    def _admits(self) -> bool:
        """A ResourceFlavor passes the webhooks (a dry run: nothing is made)."""
        flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                  "metadata": {"name": "probe"}}  # fmt: skip
        res = self._kubectl(
            "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(flavor), check=False
        )
        return res.returncode == 0

    def _established(self, names: list[str]) -> bool:
        path = '{range .items[*]}{.status.conditions[?(@.type=="Established")].status} {end}'
        got = self._kubectl("get", *names, "-o", f"jsonpath={path}", check=False)
        return got.returncode == 0 and got.stdout.split() == ["True"] * len(names)

    def _kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(self.cp.kubectl_path()), "--kubeconfig", str(self.cp.admin_kubeconfig), *args],
            capture_output=True, text=True, input=input, timeout=120,
        )  # fmt: skip
        if check and res.returncode != 0:
            raise procs.StartError(f"kubectl {' '.join(args[:3])}: {res.stderr.strip()[-2000:]}")
        return res

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        procs.stop(self.proc)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: Kueue gone, as when its pod dies (its webhooks then refuse)."""
        if self.running():
            assert self.proc is not None
            os.killpg(self.proc.pid, 9)
            self.proc.wait()

    def restart(self) -> None:
        """The manager again (its CRDs and webhook configurations stayed), once it admits."""
        self.kill()
        self._spawn(self.port)
        procs.wait_until(self._admits, "kueue's webhooks", 60, self.proc, self.log)


def _serving(url: str, ctx: ssl.SSLContext) -> bool:
    try:
        urllib.request.urlopen(f"{url}/healthz", timeout=2, context=ctx)
    except urllib.error.HTTPError:
        return True  # it answered TLS with our CA: serving
    except OSError:
        time.sleep(0.2)
        return False
    return True

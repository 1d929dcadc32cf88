"""The configuration files of a node's daemons: containerd, the CNI bridge, the kubelet and
kube-proxy (pure: what they are given, as text or plain data)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from localcluster.network import Network
from localcluster.nodeclean import cni_network

if TYPE_CHECKING:
    from localcluster.node import RealNode

PAUSE_IMAGE = "localhost/etoperator/pause:local"
CLUSTER_DOMAIN = "cluster.local"


def containerd_config(node: RealNode) -> str:
    """containerd 2.x (config version 3): its state under the node's directory, runc from our
    build, the CNI bridge; no OOM score below our own (root here lacks CAP_SYS_RESOURCE) and no
    AppArmor (not on this kernel)."""
    d = node.dir / "containerd"
    return f"""version = 3
root = "{node.store_root}"
state = "{node.run_dir / "state"}"
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{node.sock}"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{node.bins.cni}"]
    conf_dir = "{node.dir / "cni"}"
    max_conf_num = 1
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{node.bins.node / "runc"}"
        SystemdCgroup = false
[plugins.'io.containerd.internal.v1.opt']
  path = "{d / "opt"}"
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_config(net: Network, n: int, ipam_dir: Path) -> dict[str, object]:
    """The node's pod network. Its addresses are handed out from a store of its own: in a store
    shared by nodes (the plugin's default, in this machine's /var/lib/cni) each node found the
    other's last address, started again from the bottom of its range and gave a new pod the
    address of one just deleted, which the node still reached at the old pod's MAC for ~40 s.
    No masquerade: a pod sees its peers' own addresses, on this node or another (routed node to
    node, Network.add_node), as in a cluster's pod network."""
    return {
        "cniVersion": "1.0.0",
        "name": cni_network(net.slot),
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": net.pod_cidr(n)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(node: RealNode, cert: Path, key: Path, resolv: Path) -> dict[str, object]:
    """A kubelet for cgroup v1 and no swap accounting, that never deletes the local images
    (there is no registry to pull them again) and never evicts for disk."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{node.sock}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{node.cgroup_root}",
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "clusterDNS": [node.dns],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv),
        "podLogsDir": str(node.dir / "pod-logs"),
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(node.cp.ca)},
        },
        "authorization": {"mode": "Webhook"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "imageMinimumGCAge": "876000h",
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "healthzPort": 10248,
        "staticPodPath": "",
        "registerNode": True,
        "maxPods": 110,
        "podCIDR": node.net.pod_cidr(node.n),
        "shutdownGracePeriod": "0s",
    }


def kube_proxy_config(node: RealNode, kubeconfig: Path) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node.name,
        "mode": "iptables",
        "clusterCIDR": node.net.cluster_cidr,
        "conntrack": {"maxPerCore": 0},  # a global sysctl: leave it alone
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
    }

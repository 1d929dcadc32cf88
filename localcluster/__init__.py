"""A local cluster on one machine: the real control plane, real nodes (containerd, runc, the
kubelet, kube-proxy, CoreDNS) or kubemark's hollow ones, Kueue if asked, and the operator under
its deploy/ RBAC. Its face for Python callers is localcluster/world.py (`start_chain`,
`start_hollow`, `World`); `make demo` is localcluster/demo.py, its tour localcluster/tour.py."""

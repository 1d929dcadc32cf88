"""A local cluster on one machine: a real control plane, kubelets without a container runtime
that speak the real protocols, and the operator under its deploy/ RBAC."""

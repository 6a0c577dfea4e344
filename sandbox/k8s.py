"""A trial as Kubernetes objects: one Pod, and a NetworkPolicy that fences it (no IO).

``trial_manifests(spec, argv, cluster)`` renders the same ``SandboxSpec`` the local
backends run as a multi-document manifest (JSON documents, which are YAML, separated by
``---``), for ``kubectl apply -f -``:

- **Pod** ``lego-trial-<label>``: ``restartPolicy: Never``, ``activeDeadlineSeconds`` from
  ``timeout_s``; non-root (the spec's uid/gid), no privilege escalation, every capability
  dropped, the RuntimeDefault seccomp profile, a read-only root filesystem with an
  ``emptyDir`` ``/tmp``, no service-account token, no service links; memory/pids as
  limits; labelled ``lego.trial=<label>`` (the reaper's and the policy's handle). The
  workspace is an ``emptyDir`` at its target that an init container fills from the task
  image's own copy (the image holds the repository at the target); a read-only mount
  becomes an ``image`` volume when ``cluster.images`` names one for its target (the
  harness runtime as an image), a writable one an ``emptyDir`` (HOME).
- **NetworkPolicy** selecting exactly that pod: no ingress; egress only to the proxy's
  pods (namespace + pod selector) on the proxy's port, plus DNS to kube-dns when
  ``cluster.allow_dns`` (a proxy addressed by Service name needs it); with
  ``Network.NONE`` no egress at all.

On Kubernetes the harness reaches the proxy at its Service (``spec.env`` carries that
URL); ``ProxyRoute.inside_port`` is a local-backend notion and is not used.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel.errors import SandboxError
from sandbox.spec import Network, SandboxSpec

WORKSPACE_SEED = "/lego-workspace"
CPU_LIMIT = "2"
DEFAULT_MEMORY_MB = 4096


@dataclass(frozen=True, slots=True)
class ProxyPeer:
    """The proxy's pods as a NetworkPolicy names them."""

    namespace: str
    pod_labels: Mapping[str, str]
    port: int


@dataclass(frozen=True, slots=True)
class Cluster:
    namespace: str
    image: str  # the task image: its toolchain, and the repository at the workspace target
    proxy: ProxyPeer
    images: Mapping[str, str] = field(default_factory=dict)  # mount target -> image ref
    allow_dns: bool = False


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value / name part (63 chars, alphanumeric ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")
    if not cleaned:
        raise SandboxError(f"label {text!r} has nothing a Kubernetes label can hold")
    return cleaned


def _volume_name(index: int) -> str:
    return f"mount-{index}"


def _pod(spec: SandboxSpec, argv: Sequence[str], cluster: Cluster, name: str) -> dict[str, Any]:
    trial = label_value(spec.label)
    memory = f"{spec.memory_mb or DEFAULT_MEMORY_MB}Mi"
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    init: list[dict[str, Any]] = []
    for index, mount in enumerate(spec.mounts):
        volume = _volume_name(index)
        if mount.writable:
            volumes.append({"name": volume, "emptyDir": {}})
        elif mount.target in cluster.images:
            reference = cluster.images[mount.target]
            volumes.append({"name": volume, "image": {"reference": reference}})
        else:
            raise SandboxError(
                f"no Kubernetes source for the read-only mount at {mount.target}: "
                "name an image for it in Cluster.images"
            )
        mounts.append({"name": volume, "mountPath": mount.target, "readOnly": not mount.writable})
    container_security = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    resources = {
        "limits": {"memory": memory, "cpu": CPU_LIMIT},
        "requests": {"memory": memory, "cpu": "500m"},
    }
    if spec.workspace is not None:
        target = spec.workspace.target
        volumes.append({"name": "workspace", "emptyDir": {}})
        mounts.append({"name": "workspace", "mountPath": target})
        init.append(
            {
                "name": "workspace",
                "image": cluster.image,
                "command": ["/bin/sh", "-c", f"cp -a {target}/. {WORKSPACE_SEED}/"],
                "volumeMounts": [{"name": "workspace", "mountPath": WORKSPACE_SEED}],
                "securityContext": container_security,
                "resources": resources,
            }
        )
    container: dict[str, Any] = {
        "name": "trial",
        "image": cluster.image,
        "command": list(argv),
        "workingDir": spec.cwd,
        "env": [{"name": key, "value": value} for key, value in spec.env.items()],
        "volumeMounts": mounts,
        "securityContext": container_security,
        "resources": resources,
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": max(1, math.ceil(spec.timeout_s)),
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostname": "lego-sandbox",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": spec.uid,
            "runAsGroup": spec.gid,
            "fsGroup": spec.gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if init:
        pod_spec["initContainers"] = init
    labels = {
        "app.kubernetes.io/name": "lego-trial",
        "lego.trial": trial,
        "lego.network": spec.network.value.replace("_", "-"),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": cluster.namespace, "labels": labels},
        "spec": pod_spec,
    }


def _policy(spec: SandboxSpec, cluster: Cluster, name: str) -> dict[str, Any]:
    egress: list[dict[str, Any]] = []
    if spec.network is Network.PROXY_ONLY:
        proxy = cluster.proxy
        egress.append(
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": proxy.namespace}
                        },
                        "podSelector": {"matchLabels": dict(proxy.pod_labels)},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": proxy.port}],
            }
        )
        if cluster.allow_dns:
            egress.append(
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                            },
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                        }
                    ],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                }
            )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": {
            "podSelector": {"matchLabels": {"lego.trial": label_value(spec.label)}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


def trial_manifests(spec: SandboxSpec, argv: Sequence[str], cluster: Cluster) -> str:
    if spec.network is Network.PROXY_ONLY and not cluster.proxy.pod_labels:
        raise SandboxError("a proxy-only pod needs the proxy's pod labels to allow")
    if not argv:
        raise SandboxError("no command to run")
    name = re.sub(r"[^a-z0-9-]+", "-", f"lego-trial-{spec.label.lower()}")[:63].rstrip("-")
    documents = [_pod(spec, argv, cluster, name), _policy(spec, cluster, name)]
    return "\n---\n".join(json.dumps(doc, indent=2) for doc in documents) + "\n"

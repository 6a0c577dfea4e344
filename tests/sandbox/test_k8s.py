"""The Kubernetes Pod and NetworkPolicy of a trial, validated offline against Kubernetes'
own schemas (as tests/deploy validates deploy/), on a broken copy too, plus the facts the
fence relies on."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernel.errors import SandboxError
from sandbox.k8s import Cluster, ProxyPeer, trial_manifests
from sandbox.spec import Mount, Network, ProxyRoute, SandboxSpec, Workspace
from tests.support.k8s import k8s_errors

CLUSTER = Cluster(
    namespace="rollouts",
    image="registry.local/tasks/demo-1:v1",
    proxy=ProxyPeer(
        namespace="lego", pod_labels={"app.kubernetes.io/name": "lego-proxy"}, port=8000
    ),
    images={"/opt/harness": "registry.local/lego/harness:v1"},
    allow_dns=True,
)
AGENT = SandboxSpec(
    label="demo-1/group-0/sample_3",
    workspace=Workspace(Path("/img"), Path("/u"), Path("/w")),
    mounts=(
        Mount(Path("/h"), "/home/agent", writable=True),
        Mount(Path("/harness"), "/opt/harness"),
    ),
    network=Network.PROXY_ONLY,
    proxy=ProxyRoute("127.0.0.1", 8000, 8000),
    env={"OPENAI_BASE_URL": "http://lego-proxy.lego:8000/s/KEY/v1", "HOME": "/home/agent"},
    timeout_s=1800.5,
    memory_mb=2048,
)


def documents(spec: SandboxSpec, cluster: Cluster = CLUSTER) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(trial_manifests(spec, ["codex", "exec"], cluster))]


def test_the_manifests_are_valid_kubernetes() -> None:
    docs = documents(AGENT)
    assert [doc["kind"] for doc in docs] == ["Pod", "NetworkPolicy"]
    assert k8s_errors(docs) == []
    broken = copy.deepcopy(docs)
    broken[0]["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = "yes"
    broken[1]["spec"]["policyTypes"] = "Egress"
    assert len(k8s_errors(broken)) == 2


def test_the_pod_is_locked_down() -> None:
    pod = documents(AGENT)[0]
    spec = pod["spec"]
    assert pod["metadata"]["name"] == "lego-trial-demo-1-group-0-sample-3"
    assert pod["metadata"]["labels"]["lego.trial"] == "demo-1-group-0-sample_3"
    assert spec["securityContext"]["runAsUser"] == 1000
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    assert spec["activeDeadlineSeconds"] == 1801
    (trial,) = spec["containers"]
    assert trial["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert trial["resources"]["limits"]["memory"] == "2048Mi"
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in trial["volumeMounts"]}
    assert volumes[mounts["/opt/harness"]]["image"] == {
        "reference": "registry.local/lego/harness:v1"
    }
    assert volumes[mounts["/home/agent"]] == {"name": "mount-0", "emptyDir": {}}
    assert volumes[mounts["/testbed"]] == {"name": "workspace", "emptyDir": {}}
    assert spec["initContainers"][0]["command"][-1] == "cp -a /testbed/. /lego-workspace/"


def test_egress_reaches_only_the_proxy_and_dns() -> None:
    policy = documents(AGENT)[1]["spec"]
    assert policy["podSelector"] == {"matchLabels": {"lego.trial": "demo-1-group-0-sample_3"}}
    assert policy["ingress"] == []
    proxy, dns = policy["egress"]
    assert proxy == {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "lego"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "lego-proxy"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 8000}],
    }
    assert {port["port"] for port in dns["ports"]} == {53}


def test_grading_pods_have_no_egress() -> None:
    grading = SandboxSpec(label="demo-1-grade", workspace=AGENT.workspace, network=Network.NONE)
    docs = documents(grading)
    assert docs[1]["spec"]["egress"] == []
    assert docs[0]["metadata"]["labels"]["lego.network"] == "none"
    assert k8s_errors(docs) == []


def test_a_read_only_mount_needs_an_image() -> None:
    spec = SandboxSpec(label="t", mounts=(Mount(Path("/x"), "/opt/other"),))
    with pytest.raises(SandboxError, match="name an image for it"):
        trial_manifests(spec, ["true"], CLUSTER)

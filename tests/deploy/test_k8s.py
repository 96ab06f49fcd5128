"""k8s/: `kubectl kustomize` renders both overlays, kubernetes-validate (offline schemas, strict)
accepts every object, and the objects refer to each other correctly: selectors, ConfigMap and
Secret names, volumes, $(VAR) references, probes, GPU requests, and valid service Settings."""

import base64
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy import REPO, image_env, kubectl, run_tool

OVERLAYS = ("cpu", "gpu")
# The oldest Kubernetes these manifests promise to work on, and the newest schema bundled.
K8S_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
WORKLOAD_KINDS = ("Deployment", "Job", "CronJob")
IMAGE_TAGS = {"cpu": "cpu", "gpu": "cuda"}
DOCKERFILES = {"cpu": REPO / "docker" / "Dockerfile", "gpu": REPO / "docker" / "Dockerfile.gpu"}


def render(directory: Path) -> list[dict[str, Any]]:
    result = run_tool([kubectl(), "kustomize", str(directory)])
    assert result.returncode == 0, f"kubectl kustomize {directory}:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: render(REPO / "k8s" / "overlays" / overlay) for overlay in OVERLAYS}


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def probsearch_containers(
    objects: list[dict[str, Any]],
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container running the probsearch image."""
    for workload in objects:
        if workload["kind"] in WORKLOAD_KINDS:
            for container in pod_spec(workload)["containers"]:
                if container["image"].split(":")[0] == "probsearch":
                    yield workload, container


def env_sources(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The variables a container gets from its envFrom ConfigMaps/Secrets and env entries."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
        else:
            secret = find(objects, "Secret", source["secretRef"]["name"])
            env.update({k: base64.b64decode(v).decode() for k, v in secret["data"].items()})
    env.update({e["name"]: e.get("value", "") for e in container.get("env", [])})
    return env


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_validates(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, version: str
) -> None:
    errors = []
    for obj in rendered[overlay]:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {error.message}")
    assert errors == [], "\n".join(errors)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_holds_the_whole_deployment(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    objects = rendered[overlay]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert kinds == {
        ("Namespace", "probsearch"),
        ("ConfigMap", "probsearch-config"),
        ("Secret", "probsearch-secrets"),
        ("PersistentVolumeClaim", "probsearch-data"),
        ("Deployment", "redis"),
        ("Service", "redis"),
        ("Deployment", "probsearch-api"),
        ("Service", "probsearch-api"),
        ("HorizontalPodAutoscaler", "probsearch-api"),
        ("PodDisruptionBudget", "probsearch-api"),
        ("Job", "probsearch-bootstrap"),
        ("Job", "probsearch-reindex"),
        ("CronJob", "probsearch-reindex"),
    }
    namespaced = [o for o in objects if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in namespaced} == {"probsearch"}
    hpa = find(objects, "HorizontalPodAutoscaler", "probsearch-api")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "probsearch-api",
    }
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert "replicas" not in find(objects, "Deployment", "probsearch-api")["spec"], (
        "the HPA owns the replica count; a fixed one would be reset on every apply"
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_api_probes_readiness_and_liveness_on_its_port(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    api = find(rendered[overlay], "Deployment", "probsearch-api")
    (container,) = pod_spec(api)["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ports, probe


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_select_the_pods(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    objects = rendered[overlay]
    for name in ("probsearch-api", "redis"):
        labels = find(objects, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        deployment = find(objects, "Deployment", name)
        selectors = [
            deployment["spec"]["selector"]["matchLabels"],
            find(objects, "Service", name)["spec"]["selector"],
        ]
        if name == "probsearch-api":
            pdb = find(objects, "PodDisruptionBudget", name)
            selectors.append(pdb["spec"]["selector"]["matchLabels"])
        for selector in selectors:
            assert selector.items() <= labels.items(), f"{selector} does not select {name}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_references_resolve(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    """ConfigMaps, Secrets and claims exist; every $(VAR) in command/args is defined (else
    Kubernetes passes the text through unexpanded); every container has requests and limits."""
    objects = rendered[overlay]
    claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    for workload in (o for o in objects if o["kind"] in WORKLOAD_KINDS):
        spec = pod_spec(workload)
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, where
        for container in spec.get("initContainers", []) + spec["containers"]:
            env = env_sources(objects, container)  # fails on a missing ConfigMap/Secret
            words = container.get("command", []) + container.get("args", [])
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(words)):
                assert var in env, f"{where}: $({var}) is not defined in the container's env"
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= resources.get("requests", {}).keys(), where
            assert {"cpu", "memory"} <= resources.get("limits", {}).keys(), where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_containers_get_valid_settings_and_the_right_image(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from models.settings import Settings

    containers = list(probsearch_containers(rendered[overlay]))
    assert len(containers) == 4  # api, bootstrap, reindex Job, reindex CronJob
    for workload, container in containers:
        where = f"{overlay}: {workload['kind']}/{workload['metadata']['name']}"
        assert container["image"] == f"probsearch:{IMAGE_TAGS[overlay]}", where
        env = image_env(DOCKERFILES[overlay]) | env_sources(rendered[overlay], container)
        for key in (k for k in env if k.startswith("PROBSEARCH_")):
            monkeypatch.setenv(key, env[key])
        try:
            Settings()
        except ValueError as error:
            pytest.fail(f"{where}: its environment is no valid Settings: {error}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_only_in_the_gpu_overlay(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    for workload, container in probsearch_containers(rendered[overlay]):
        gpus = container["resources"]["limits"].get("nvidia.com/gpu")
        spec = pod_spec(workload)
        tolerations = {t["key"] for t in spec.get("tolerations", [])}
        if overlay == "gpu":
            assert str(gpus) == "1", workload["metadata"]["name"]
            assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
            assert "nvidia.com/gpu" in tolerations
        else:
            assert gpus is None and "nodeSelector" not in spec and not tolerations


def test_documented_customisations_render(tmp_path: Path) -> None:
    """README.md's own overlay: external Redis component plus API keys from an env file."""
    (tmp_path / "api-keys.env").write_text("PROBSEARCH_API_KEYS=0123456789abcdef-key\n")
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize takes only relative paths to other kustomizations.
                "resources": [os.path.relpath(REPO / "k8s" / "overlays" / "cpu", tmp_path)],
                "components": [
                    os.path.relpath(REPO / "k8s" / "components" / "external-redis", tmp_path)
                ],
                "configMapGenerator": [
                    {
                        "name": "probsearch-config",
                        "behavior": "merge",
                        "literals": ["PROBSEARCH_REDIS_URL=redis://cache.internal:6379/2"],
                    }
                ],
                "secretGenerator": [
                    {"name": "probsearch-secrets", "behavior": "replace", "envs": ["api-keys.env"]}
                ],
            }
        )
    )
    objects = render(tmp_path)
    assert not [o for o in objects if o["metadata"]["name"] == "redis"]
    config = find(objects, "ConfigMap", "probsearch-config")["data"]
    assert config["PROBSEARCH_REDIS_URL"] == "redis://cache.internal:6379/2"
    assert config["PROBSEARCH_DEVICE"] == "cpu"
    keys = find(objects, "Secret", "probsearch-secrets")["data"]["PROBSEARCH_API_KEYS"]
    assert base64.b64decode(keys).decode() == "0123456789abcdef-key"
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)

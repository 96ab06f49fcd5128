"""k8s/components/external-milvus: both overlays plus the component render; every object
validates; the API and the reindex Job and CronJob get PROBSEARCH_SHORTLIST_BACKEND=milvus and
the URI the overlay sets (a patch, or the Secret), as valid Settings."""

import base64
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy import REPO
from tests.deploy.test_k8s import K8S_VERSIONS, env_sources, find, pod_spec, render

COMPONENT = REPO / "k8s" / "components" / "external-milvus"
OVERLAY_URI = "http://my-release-milvus.milvus.svc.cluster.local:19530"
DEFAULT_URI = "http://milvus-milvus.milvus.svc.cluster.local:19530"
MILVUS_WORKLOADS = (
    ("Deployment", "probsearch-api"),
    ("Job", "probsearch-reindex"),
    ("CronJob", "probsearch-reindex"),
)


def write_overlay(directory: Path, base: str, extra: dict[str, Any]) -> Path:
    """An overlay of k8s/overlays/<base> with the component, as its README shows."""
    directory.mkdir(parents=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "k8s" / "overlays" / base, directory)],
        "components": [os.path.relpath(COMPONENT, directory)],
        "images": [
            {
                "name": "probsearch",
                "newName": "registry.example/probsearch",
                "newTag": f"0.1.0-{base}-milvus",
            }
        ],
        **extra,
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def uri_patch(uri: str) -> dict[str, Any]:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probsearch-config"},
              "data": {"PROBSEARCH_MILVUS_URI": uri}}  # fmt: skip
    return {"patches": [{"patch": yaml.safe_dump(config)}]}


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def objects(request, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp(f"milvus-{request.param}")
    return render(write_overlay(root / "overlay", request.param, uri_patch(OVERLAY_URI)))


def milvus_env(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    (container,) = pod_spec(find(objects, kind, name))["containers"]
    assert container["image"].startswith("registry.example/probsearch:0.1.0-")
    assert container["image"].endswith("-milvus")
    return env_sources(objects, container)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates(objects: list[dict[str, Any]], version: str) -> None:
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(("kind", "name"), MILVUS_WORKLOADS)
def test_api_and_reindex_search_and_write_the_overlays_milvus(
    objects: list[dict[str, Any]], kind: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from models.settings import Settings

    env = milvus_env(objects, kind, name)
    assert env["PROBSEARCH_SHORTLIST_BACKEND"] == "milvus"
    assert env["PROBSEARCH_MILVUS_URI"] == OVERLAY_URI
    for key in (k for k in env if k.startswith("PROBSEARCH_")):
        monkeypatch.setenv(key, env[key])
    settings = Settings()
    assert (settings.shortlist_backend, settings.milvus_uri) == ("milvus", OVERLAY_URI)


def test_without_a_patch_the_component_names_the_operators_default(tmp_path: Path) -> None:
    objects = render(write_overlay(tmp_path / "overlay", "cpu", {}))
    for kind, name in MILVUS_WORKLOADS:
        assert milvus_env(objects, kind, name)["PROBSEARCH_MILVUS_URI"] == DEFAULT_URI


def test_a_uri_in_the_secret_wins_over_the_configmap(tmp_path: Path) -> None:
    secret = {"name": "probsearch-secrets", "behavior": "merge",
              "literals": [f"PROBSEARCH_MILVUS_URI={OVERLAY_URI}"]}  # fmt: skip
    objects = render(write_overlay(tmp_path / "overlay", "cpu", {"secretGenerator": [secret]}))
    stored = find(objects, "Secret", "probsearch-secrets")["data"]["PROBSEARCH_MILVUS_URI"]
    assert base64.b64decode(stored).decode() == OVERLAY_URI
    for kind, name in MILVUS_WORKLOADS:
        assert milvus_env(objects, kind, name)["PROBSEARCH_MILVUS_URI"] == OVERLAY_URI

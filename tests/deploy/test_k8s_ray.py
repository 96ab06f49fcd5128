"""k8s/components/ray-reindex: the CPU overlay plus the component renders; the RayJob validates
against KubeRay's RayJob CRD schema (v1, vendored in tests/deploy/schemas) and every other object
against Kubernetes' own; the RayJob runs `reindex --engine ray` with the overlay's image, the
shared volume and settings that exist."""

import gzip
import json
import os
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy import REPO
from tests.deploy.test_k8s import K8S_VERSIONS, env_sources, find, render

# openAPIV3Schema of ray.io/v1 RayJob from KubeRay v1.7.0-rc.0-5-gfeeaf72fa
# (ray-operator/config/crd/bases/ray.io_rayjobs.yaml), as gzipped JSON.
RAYJOB_SCHEMA = Path(__file__).parent / "schemas" / "rayjob-v1.schema.json.gz"


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    overlay = tmp_path_factory.mktemp("ray-overlay")
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(REPO / "k8s" / "overlays" / "cpu", overlay)],
                "components": [
                    os.path.relpath(REPO / "k8s" / "components" / "ray-reindex", overlay)
                ],
                # README's instruction: name the image again in the overlay using the component.
                "images": [
                    {
                        "name": "probsearch",
                        "newName": "registry.example/probsearch",
                        "newTag": "0.1.0-cpu-ray",
                    }
                ],
            }
        )
    )
    return render(overlay)


def rayjob(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "RayJob", "probsearch-reindex-ray")


def pod_specs(job: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = job["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [group["template"]["spec"] for group in groups]


def test_the_rayjob_validates_against_the_kuberay_crd(objects: list[dict[str, Any]]) -> None:
    schema = json.loads(gzip.decompress(RAYJOB_SCHEMA.read_bytes()))
    job = rayjob(objects)
    jsonschema.validate(job, schema)
    broken = {**job, "spec": {**job["spec"], "suspend": "yes"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_other_object_validates(objects: list[dict[str, Any]], version: str) -> None:
    for obj in objects:
        if obj["kind"] != "RayJob":
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_job_reindexes_on_ray_with_the_overlays_image(objects: list[dict[str, Any]]) -> None:
    job = rayjob(objects)
    assert job["spec"]["suspend"] is True
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:2] == ["probsearch", "reindex"]
    assert words[words.index("--engine") + 1] == "ray"
    head = pod_specs(job)[0]["containers"][0]
    env = env_sources(objects, head)
    for word in words:
        if word.startswith("$"):
            assert word[1:] in env, f"{word} is not set in the head container"
    claims = {c["metadata"]["name"] for c in objects if c["kind"] == "PersistentVolumeClaim"}
    for spec in pod_specs(job):
        images = [c["image"] for c in spec["containers"]]
        assert images == ["registry.example/probsearch:0.1.0-cpu-ray"]
        volumes = {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]}
        assert volumes <= claims

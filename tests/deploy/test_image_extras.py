"""pymilvus is an optional extra that both images take (EXTRAS=milvus); milvus-lite, which needs
faiss-cpu, comes only from the test setup (scripts/bootstrap.sh) and never beside faiss-gpu-cu12:
the Dockerfiles' install step runs under sh with pip stubbed, and the extras' requirements are
read from pyproject.toml and pymilvus's own metadata."""

import importlib.metadata
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.deploy import REPO, dockerfile_stages

CPU, GPU = REPO / "docker" / "Dockerfile", REPO / "docker" / "Dockerfile.gpu"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def install_step(dockerfile: Path, extras: str) -> subprocess.CompletedProcess[str]:
    """The builder's `pip install /src[...]` RUN under sh, EXTRAS set, pip only echoing."""
    (run,) = [a for i, a in dockerfile_stages(dockerfile)[1] if i == "RUN" and "/src[" in a]
    script = 'pip() { echo "$@"; }\n' + run
    env = {**os.environ, "EXTRAS": extras}
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)


@pytest.mark.parametrize(("dockerfile", "flavour"), [(CPU, "cpu"), (GPU, "gpu")])
@pytest.mark.parametrize("extras", ["", "milvus", "ray,milvus"])
def test_both_images_take_the_milvus_extra(dockerfile: Path, flavour: str, extras: str) -> None:
    done = install_step(dockerfile, extras)
    assert done.returncode == 0, done.stderr
    wanted = f"/src[{flavour}{',' + extras if extras else ''}]"
    assert done.stdout.split()[-1] == wanted


@pytest.mark.parametrize(
    ("dockerfile", "extras"),
    [(CPU, "milvus-lite"), (CPU, "ray,milvus-lite"), (GPU, "milvus-lite"), (GPU, "milvus,cpu")],
)
def test_the_images_refuse_what_brings_faiss_cpu(dockerfile: Path, extras: str) -> None:
    done = install_step(dockerfile, extras)
    assert done.returncode != 0 and done.stdout == ""
    assert f"EXTRAS={extras}" in done.stderr


def extra_closure(name: str) -> set[str]:
    """The requirements of one of probsearch's extras, its self-references followed."""
    found: set[str] = set()
    for requirement in EXTRAS[name]:
        inner = re.fullmatch(r"probsearch\[(.+)\]", requirement)
        if inner:
            found |= {r for extra in inner[1].split(",") for r in extra_closure(extra)}
        else:
            found.add(re.split(r"[<>=!;\[ ]", requirement)[0])
    return found


def test_pymilvus_is_optional_and_brings_no_milvus_lite() -> None:
    base = {re.split(r"[<>=!;\[ ]", r)[0] for r in PYPROJECT["project"]["dependencies"]}
    assert "pymilvus" not in base and "milvus-lite" not in base
    assert extra_closure("milvus") == {"pymilvus"}
    assert {"pymilvus", "milvus-lite"} <= extra_closure("milvus-lite")
    assert "faiss-cpu" not in extra_closure("gpu") | extra_closure("milvus")
    lite = [r for r in importlib.metadata.requires("pymilvus") or [] if "milvus-lite" in r]
    assert lite and all("extra ==" in r for r in lite), lite  # pymilvus pulls it only on request


def test_the_test_setup_installs_milvus_lite() -> None:
    bootstrap = (REPO / "scripts" / "bootstrap.sh").read_text()
    # the tests' purpose ("all", the default), whose extras tests/deploy/test_bootstrap.py
    # shows reaching pip
    assert re.search(r"all\) extras='\.\[[^']*milvus-lite[^']*\]'", bootstrap)
    assert "scripts/bootstrap.sh" in (REPO / ".ci" / "run").read_text()

"""The Dockerfiles pass hadolint, build a venv in one stage and run it non-root in another, check
/healthz, and copy every package that pyproject.toml installs; .dockerignore keeps the rest out."""

import re
import tomllib
from pathlib import Path

import pytest

from tests.deploy import REPO, dockerfile_stages, find_tool, run_tool

DOCKERFILES = [REPO / "docker" / "Dockerfile", REPO / "docker" / "Dockerfile.gpu"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    result = run_tool(
        [find_tool("hadolint"), "--no-color", "--failure-threshold", "style", str(dockerfile)]
    )
    assert result.returncode == 0, f"hadolint {dockerfile.name}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_final_stage_copies_the_venv_and_runs_non_root(dockerfile: Path) -> None:
    stages = dockerfile_stages(dockerfile)[1:]
    assert len(stages) >= 2, "expected a builder stage and a runtime stage"
    final = stages[-1]
    copies = [args for instr, args in final if instr == "COPY"]
    assert any(args.startswith("--from=builder /opt/venv") for args in copies), copies
    users = [args for instr, args in final if instr == "USER"]
    assert users, "the final stage must switch to a non-root USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, (
        f"USER {users[-1]}: use a numeric non-zero uid so Kubernetes' runAsNonRoot can check it"
    )
    # Only runtime dependencies: nothing is built or pip-installed in the final stage.
    runs = " ".join(args for instr, args in final if instr == "RUN")
    for builder_only in ("pip install", "build-essential", "gcc", "python3-venv", "-dev "):
        assert builder_only not in runs, f"final stage of {dockerfile.name} runs {builder_only!r}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_healthcheck_probes_healthz_without_curl(dockerfile: Path) -> None:
    checks = [args for instr, args in dockerfile_stages(dockerfile)[-1] if instr == "HEALTHCHECK"]
    assert len(checks) == 1, "one HEALTHCHECK in the final stage"
    assert "/healthz" in checks[0] and "urllib.request" in checks[0], checks[0]
    assert "curl" not in checks[0] and "wget" not in checks[0], "slim images have neither"


def _installed_packages() -> list[str]:
    """Top-level packages that `pip install .` puts in the image (pyproject's find include)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = {p.rstrip("*").rstrip(".") for p in patterns}
    return sorted(t for t in tops if (REPO / t / "__init__.py").is_file())


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_installed_package_is_copied(dockerfile: Path) -> None:
    builder = dockerfile_stages(dockerfile)[1]
    sources = {
        src.rstrip("/")
        for instr, args in builder
        if instr == "COPY" and not args.startswith("--from")
        for src in args.split()[:-1]
    }
    needed = {"pyproject.toml", "README.md", *_installed_packages()}
    assert needed <= sources, f"{dockerfile.name} does not COPY {sorted(needed - sources)}"
    for src in sources:
        assert (REPO / src).exists(), f"{dockerfile.name} copies {src}, which does not exist"


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax: `*` stays within a path segment, `**` crosses segments."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "$")


def _ignored(path: str, lines: list[str]) -> bool:
    """Whether the build context leaves `path` out (the last matching line wins; a line that
    matches a parent directory matches everything under it)."""
    prefixes = ["/".join(path.split("/")[: n + 1]) for n in range(path.count("/") + 1)]
    ignored = False
    for line in lines:
        negate = line.startswith("!")
        regex = _dockerignore_regex(line.lstrip("!").strip("/"))
        if any(regex.match(prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_sources_and_drops_the_rest() -> None:
    text = (REPO / ".dockerignore").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    kept = ["pyproject.toml", "README.md"] + [f"{p}/__init__.py" for p in _installed_packages()]
    dropped = [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "data/shapes/images.jsonl",
        "models/__pycache__/gaussian.cpython-311.pyc",
        "probsearch.egg-info/PKG-INFO",
    ]
    assert [p for p in kept if _ignored(p, lines)] == [], "needed in the build context"
    assert [p for p in dropped if not _ignored(p, lines)] == [], "must stay out of the context"

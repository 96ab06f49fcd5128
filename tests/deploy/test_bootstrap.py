"""scripts/bootstrap.sh (issue 42): the demo installs only the demo's packages, and a second run
installs nothing. Run on a copy of the script and pyproject.toml whose .venv/bin/python only
records what it is asked to do, so no package is really installed."""

import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "bootstrap.sh", tmp_path / "scripts")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/pip.log\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def bootstrap(root: Path, *mode: str) -> list[str]:
    """Run it; returns the installs it asked for (and empties the record)."""
    done = subprocess.run(["bash", "scripts/bootstrap.sh", *mode], cwd=root, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    log = root / "pip.log"
    asked = (
        [line for line in log.read_text().splitlines() if "install" in line] if log.exists() else []
    )
    log.unlink(missing_ok=True)
    return [line for line in asked if "--upgrade pip" not in line]


def test_the_demo_installs_its_own_packages_once(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    assert bootstrap(root, "demo") == ["-m pip install --quiet -e .[cpu]"]
    assert bootstrap(root, "demo") == []  # a second run installs nothing
    assert bootstrap(root) == ["-m pip install --quiet -e .[cpu,dev,ray,milvus-lite]"]
    assert bootstrap(root) == [] and bootstrap(root, "demo") == []  # all covers the demo
    with (root / "pyproject.toml").open("a") as f:
        f.write("\n# a changed dependency list\n")
    assert bootstrap(root, "demo") == ["-m pip install --quiet -e .[cpu]"]


def test_an_unknown_purpose_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(["bash", "scripts/bootstrap.sh", "everything"], cwd=checkout(tmp_path),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "usage: bootstrap.sh [demo|all]" in done.stderr

"""Schemathesis, every check, against a running server: the schema says what the server does.

The CLI runs its coverage and fuzzing phases, positive and negative data, with all built-in
checks (server errors, status codes, content types, response schema and headers conformance,
negative-data rejection, ignored auth, unsupported methods...). positive_data_acceptance and
negative_data_rejection are replaced by copies with narrow, documented exemptions: the two
rules JSON Schema cannot state, and multipart mutations that vanish on the wire
(tests/service/schemathesis_checks.py).
"""

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.conftest import (
    ADMIN_KEY,
    Artifacts,
    ServerThread,
    copy_index_root,
    make_settings,
)

EXAMPLES_PER_OPERATION = 100
SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fuzzed_server(
    artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    # The fuzzer's ignored-auth probes are failed admin attempts: no 429 for them here
    # (test_auth.py tests the limit). It adds and deletes items with the admin key, so it
    # gets an index root of its own.
    root = copy_index_root(artifacts, tmp_path_factory.mktemp("fuzzed") / "indexes")
    settings = make_settings(artifacts, index_root=root, admin_auth_max_failures=1_000_000)
    with ServerThread(settings) as running:
        yield running


def run_schemathesis(url: str, seed: int, work_dir: Path) -> subprocess.CompletedProcess:
    """The CLI, run in `work_dir` (it keeps a .schemathesis/ cache in its working dir)."""
    command = [
        str(SCHEMATHESIS), "run", f"{url}/openapi.json", "--checks", "all",
        "--exclude-checks", "positive_data_acceptance,negative_data_rejection", "--max-examples",
        str(EXAMPLES_PER_OPERATION), "--seed", str(seed), "--continue-on-failure",
        "--header", f"X-API-Key: {ADMIN_KEY}", "--request-timeout", "30",
        # each compaction is a process building a version (seconds): tested on its own in
        # test_live_items.py, not a hundred times here
        "--exclude-path", "/admin/compact",
    ]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.service.schemathesis_checks"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        command, capture_output=True, text=True, timeout=900, cwd=work_dir, env=env
    )


def test_every_schemathesis_check_passes(fuzzed_server: ServerThread, tmp_path: Path) -> None:
    done = run_schemathesis(fuzzed_server.url, seed=14, work_dir=tmp_path)
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    # A warning is not a failure: the image endpoint answers 404 to the fuzzer's made-up item
    # ids, as it must (test_item_images.py serves real ones).
    assert "No issues found" in done.stdout or re.search(
        r"(\d+) generated, \1 passed", done.stdout
    ), report
    assert "FAILURES" not in done.stdout, report

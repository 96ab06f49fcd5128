"""Without the cpu/gpu extra, commands that need FAISS or ONNX Runtime say how to install it."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.conftest import Artifacts

HIDE_AND_RUN = """
import sys
sys.modules[{module!r}] = None  # as if the extra were not installed
sys.argv = ["probsearch", *{args!r}]
from probsearch.cli import main
main()
"""


@pytest.mark.parametrize("module", ["faiss", "onnxruntime"])
def test_a_missing_backend_gets_the_install_command(
    module: str, artifacts: Artifacts, tmp_path: Path
) -> None:
    args = ["reindex", "--modality", "image", "--source", str(artifacts.shapes),
            "--model", str(artifacts.model), "--index-root", str(tmp_path)]  # fmt: skip
    code = HIDE_AND_RUN.format(module=module, args=args)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "pip install 'probsearch[cpu]'" in done.stderr
    assert "Traceback" not in done.stderr

"""`reindex` and `index rollback|activate|gc` with the Milvus shortlist backend (Milvus Lite)."""

import sys
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from indexer.cli import app
from indexer.milvus_store import MilvusBackend, collection_name, import_pymilvus
from indexer.registry import ActiveRegistry
from indexer.store import open_version

runner = CliRunner()


def cli(*args: str, env: dict):
    return runner.invoke(app, list(args), env=env, catch_exceptions=False)


def test_reindex_writes_collections_and_activation_moves_the_alias(
    tmp_path, small_shapes, random_model
) -> None:
    uri = str(tmp_path / "milvus.db")
    env = {
        "PROBSEARCH_MODEL": str(random_model),
        "PROBSEARCH_INDEX_ROOT": str(tmp_path / "indexes"),
        "PROBSEARCH_SHORTLIST_BACKEND": "milvus",
        "PROBSEARCH_MILVUS_URI": uri,
    }
    versions = []
    for _ in range(2):
        args = ("--modality", "image", "--source", str(small_shapes), "--metrics", "w2,min_kl")
        result = cli("reindex", *args, "--activate", env=env)
        assert result.exit_code == 0, result.output
        versions.append(ActiveRegistry(tmp_path / "indexes", None).active_version("image"))
    milvus = MilvusBackend(uri)
    try:
        for family in ("w2", "kl", "kl_reverse"):
            want = collection_name("image", versions[1], family)
            assert milvus.active_collection("image", family) == want
        path = tmp_path / "indexes" / "image" / versions[1]
        faiss_version, milvus_version = open_version(path), open_version(path, backend=milvus)
        mu_q, logvar_q = np.asarray(faiss_version.mu[:5]), np.asarray(faiss_version.logvar[:5])
        for metric in ("w2", "min_kl"):
            want_rows = faiss_version.shortlist(metric, mu_q, logvar_q, 10)
            np.testing.assert_array_equal(
                milvus_version.shortlist(metric, mu_q, logvar_q, 10), want_rows
            )

        result = cli("index", "rollback", "--modality", "image", env=env)
        assert result.exit_code == 0, result.output
        assert milvus.active_collection("image", "w2") == collection_name(
            "image", versions[0], "w2"
        )
        result = cli("index", "activate", "--modality", "image", versions[1], env=env)
        assert result.exit_code == 0, result.output
        result = cli("index", "gc", "--modality", "image", "--keep", "1", env=env)
        assert result.exit_code == 0, result.output
        names = milvus.connection.call(lambda c: c.list_collections())
        assert collection_name("image", versions[0], "w2") not in names
        assert collection_name("image", versions[1], "w2") in names
    finally:
        milvus.connection.close()


def test_missing_pymilvus_is_one_line_with_the_install_command(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pymilvus", None)  # `import pymilvus` raises ImportError
    try:
        import_pymilvus()
    except ValueError as e:
        assert "pip install 'probsearch[milvus]'" in str(e)
    else:
        raise AssertionError("import_pymilvus did not fail")


def test_reindex_without_pymilvus_fails_without_a_traceback(
    tmp_path, small_shapes, random_model, monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "pymilvus", None)
    env = {
        "PROBSEARCH_MODEL": str(random_model),
        "PROBSEARCH_SHORTLIST_BACKEND": "milvus",
        "PROBSEARCH_MILVUS_URI": str(Path(tmp_path) / "m.db"),
    }
    result = cli(
        "reindex",
        "--modality",
        "image",
        "--source",
        str(small_shapes),
        "--index-root",
        str(tmp_path),
        env=env,
    )
    assert result.exit_code == 1
    assert "pip install 'probsearch[milvus]'" in result.output and "Traceback" not in result.output

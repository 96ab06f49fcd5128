"""Every index type the builder can write has a Milvus counterpart."""

import pytest

from indexer.build import INDEX_TYPES
from indexer.milvus_writer import milvus_index

MILVUS_TYPES = {  # written out by hand from Milvus's index names
    "flat": "FLAT",
    "ivf": "IVF_FLAT",
    "ivfsq": "IVF_SQ8",
    "hnsw": "HNSW",
    "ivfpq": "IVF_PQ",
}
PARAMS = {"nlist": 16, "hnsw_m": 16, "ef_construction": 40, "dim": 12, "pq_m": 8}


@pytest.mark.parametrize("index_type", [t for t in INDEX_TYPES if t != "auto"])
def test_each_built_index_type_maps_to_its_milvus_index(index_type: str) -> None:
    milvus_type, metric, _ = milvus_index(index_type, PARAMS, "w2")
    assert milvus_type == MILVUS_TYPES[index_type]
    assert metric == "L2"

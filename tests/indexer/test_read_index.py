"""The read side: device placement of a loaded index (GPU only when FAISS sees one)."""

import faiss
import numpy as np
import pytest

from indexer.read_index import to_device


def test_to_device_keeps_the_cpu_index_without_a_gpu() -> None:
    index = faiss.IndexFlatL2(4)
    index.add(np.eye(4, dtype=np.float32))
    assert to_device(index, "cpu") is index
    if faiss.get_num_gpus() == 0:
        assert to_device(index, "auto") is index
        with pytest.raises(ValueError, match="sees no GPU"):
            to_device(index, "cuda")
    else:  # a GPU machine: auto moves it there, and the search is unchanged
        moved = to_device(index, "auto")
        assert moved is not index
        np.testing.assert_array_equal(
            moved.search(np.eye(4, dtype=np.float32), 1)[1].ravel(), range(4)
        )

"""The backbone runner behind a split's features is made once, however many threads ask."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from models.training.feature_splits import _on_first_miss


class SlowToExport:
    """A stand-in Backbone whose onnx_runner takes a while to make and counts how often."""

    def __init__(self) -> None:
        self.made = 0
        self.lock = threading.Lock()

    def onnx_runner(self, threads: int):
        with self.lock:
            self.made += 1
        time.sleep(0.2)  # an export: long enough for every thread to ask meanwhile
        return lambda batch: np.full((len(batch), 2), float(len(batch)), np.float32)


def test_the_runner_is_made_once_for_threads_that_ask_at_once() -> None:
    backbone = SlowToExport()
    encode = _on_first_miss(backbone)  # type: ignore[arg-type]
    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(encode, [["a"] * n for n in (1, 2, 3, 4)]))
    assert backbone.made == 1
    assert [o.shape for o in outputs] == [(1, 2), (2, 2), (3, 2), (4, 2)]
    assert [float(o[0, 0]) for o in outputs] == [1.0, 2.0, 3.0, 4.0]

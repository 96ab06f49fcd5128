"""prefetched: the next item is prepared while the caller holds the current one, in order."""

import threading

import pytest

from models.training.batches import prefetched


def test_items_come_in_order_prepared_once_each() -> None:
    calls = []

    def square(x: int) -> int:
        calls.append(x)
        return x * x

    assert list(prefetched(range(5), square)) == [0, 1, 4, 9, 16]
    assert calls == [0, 1, 2, 3, 4]
    assert list(prefetched([], square)) == []


def test_the_next_item_is_prepared_while_the_caller_holds_this_one() -> None:
    second_ready = threading.Event()

    def prepare(x: int) -> int:
        if x == 1:
            second_ready.set()
        return x

    items = prefetched(range(3), prepare)
    assert next(items) == 0
    assert second_ready.wait(timeout=10), "item 1 was not prepared while item 0 was in use"
    assert list(items) == [1, 2]


def test_an_error_in_prepare_reaches_the_caller_at_its_item() -> None:
    def prepare(x: int) -> int:
        if x == 2:
            raise ValueError("bad batch 2")
        return x

    seen = []
    with pytest.raises(ValueError, match="bad batch 2"):
        for item in prefetched(range(4), prepare):
            seen.append(item)
    assert seen == [0, 1]

"""The service freezes the heap start-up leaves (service.http.main.freeze_startup_heap)."""

import gc

from tests.service.conftest import Artifacts, ServerThread, make_settings


def test_the_heap_left_by_start_up_is_frozen_out_of_the_collectors_reach(
    artifacts: Artifacts,
) -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    with ServerThread(make_settings(artifacts)):
        frozen = gc.get_freeze_count()
    # the model, indexes and libraries: far more than what one request allocates
    assert frozen > 50_000

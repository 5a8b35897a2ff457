"""ichord.gcpolicy: the start-up heap frozen, young collections less often; the test process is left as found."""

from __future__ import annotations

import gc

from ichord import gcpolicy


def test_tune_freezes_the_start_up_heap_and_raises_the_young_threshold() -> None:
    threshold = gc.get_threshold()
    try:
        gc.unfreeze()
        gcpolicy.tune()
        assert gc.get_freeze_count() > 0  # the objects that existed: imported modules at least
        assert gc.get_threshold() == (gcpolicy.GEN0_THRESHOLD, threshold[1], threshold[2])
        assert threshold[0] < gcpolicy.GEN0_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)

import re

import pytest

from webhook.admission.decide import ReservationIds

ID = re.compile(r"r-[0-9a-f]{16}")


def test_ids_are_well_formed_and_unique_across_batches() -> None:
    ids = ReservationIds(batch=3)
    drawn = [ids() for _ in range(1000)]  # 334 batches: every batch boundary crossed
    assert all(ID.fullmatch(i) for i in drawn)
    assert len(set(drawn)) == len(drawn)


def test_two_generators_do_not_repeat_each_other() -> None:
    first, second = ReservationIds(), ReservationIds()
    assert not {first() for _ in range(300)} & {second() for _ in range(300)}


def test_a_batch_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="batch=0: use 1 or more"):
        ReservationIds(batch=0)

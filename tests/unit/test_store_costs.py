"""bench.scale's split of a hand-over's store requests by its building blocks."""

from __future__ import annotations

import pytest

from bench.parts.store_costs import (
    ACTIVITY,
    DESCRIBE,
    SEARCH_ATTRIBUTES,
    UPDATE,
    HandoverStore,
    StoreCosts,
    explained,
)

COSTS = StoreCosts({DESCRIBE: 4.0, UPDATE: 4.0, SEARCH_ATTRIBUTES: 10.0, ACTIVITY: 10.0})


def test_each_block_counts_its_calls_times_what_one_costs_beyond_the_update_making_it() -> None:
    handover = HandoverStore(total=50.0, describes=2.0, search_attribute_upserts=2.0)
    rows = {
        row[0].split(" (")[0].split(":")[0]: float(row[2]) for row in explained(COSTS, handover)
    }
    assert rows["the floor's pair"] == 14.0  # 4 + 10
    assert rows["DescribeWorkflowExecution"] == 8.0
    assert rows["search-attribute upserts"] == 12.0  # 2 x (10 - 4)
    assert rows["the rest"] == pytest.approx(50.0 - 14.0 - 8.0 - 12.0, abs=0.06)
    assert rows["all"] == 50.0

"""Pipeline schedules: each stage's order of work and the bubble it leaves."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pathways_nb.client._pipeline import cut_microbatches
from pathways_nb.client._schedules import (
    Op,
    scheduled_bubble,
    stage_orders,
    submission_order,
    theoretical_bubble,
)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_scheduled_bubble_is_the_formula_for_equal_stages_and_more_for_unequal(
    schedule: str,
) -> None:
    for stages, micro in ((4, 8), (3, 5), (2, 4), (1, 3)):
        orders = stage_orders(stages, micro, schedule)
        for f, b in ((1.0, 1.0), (1.0, 2.0)):  # a backward often costs two forwards
            seconds = {
                (s, k): {"F": f, "B": b, "L": f + b}[k] for s in range(stages) for k in "FBL"
            }
            got = scheduled_bubble(orders, seconds)
            assert got == pytest.approx(theoretical_bubble(stages, micro)), (stages, micro, f, b)
    orders = stage_orders(4, 8, schedule)
    seconds = {(s, k): {"F": 1.0, "B": 1.0, "L": 2.0}[k] for s in range(4) for k in "FBL"}
    seconds[(1, "B")] = 2.0  # one slow stage holds up the others
    assert scheduled_bubble(orders, seconds) > theoretical_bubble(4, 8) + 0.05


def test_extra_warmup_keeps_the_ideal_bubble_and_hides_hops() -> None:
    seconds = {(s, k): {"F": 1.0, "B": 2.0, "L": 3.0}[k] for s in range(4) for k in "FBL"}
    standard = stage_orders(4, 8, "1f1b")
    for extra in (1, 2):
        orders = stage_orders(4, 8, "1f1b", extra)
        assert scheduled_bubble(orders, seconds) == pytest.approx(theoretical_bubble(4, 8))
        # A hop of a third of a forward: the standard 1F1B waits for it every cycle,
        # one forward run ahead waits for it only filling and draining the pipeline.
        assert scheduled_bubble(orders, seconds, hop=0.3) < (
            scheduled_bubble(standard, seconds, hop=0.3) - 0.04
        )
    assert scheduled_bubble(standard, seconds, hop=0.3) > theoretical_bubble(4, 8) + 0.05
    # Stage 0 of 3 runs three forwards before its first backward, not two; stage 1 two.
    orders = stage_orders(3, 4, "1f1b", extra_warmup=1)
    assert [f"{op.kind}{op.microbatch}" for op in orders[0]] == [
        "F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3",
    ]  # fmt: skip
    assert [f"{op.kind}{op.microbatch}" for op in orders[1]] == [
        "F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3",
    ]  # fmt: skip
    # More than there are microbatches: every forward first, as GPipe.
    assert [op.kind for op in stage_orders(3, 4, "1f1b", 9)[0]] == ["F"] * 4 + ["B"] * 4


def test_schedules_order_each_stage_and_keep_dependencies() -> None:
    gp = stage_orders(3, 4, "gpipe")
    assert [op.kind for op in gp[0]] == ["F"] * 4 + ["B"] * 4
    assert [op.kind for op in gp[2]] == ["L"] * 4
    ob = stage_orders(3, 4, "1f1b")
    # Stage 0 warms up with two forwards, then alternates, then drains.
    assert [f"{op.kind}{op.microbatch}" for op in ob[0]] == [
        "F0",
        "F1",
        "F2",
        "B0",
        "F3",
        "B1",
        "B2",
        "B3",
    ]
    for orders in (gp, ob):
        order = submission_order(orders)
        seen: set[Op] = set()
        for op in order:
            if op.kind == "F" and op.stage:
                assert Op("F", op.stage - 1, op.microbatch) in seen
            if op.kind == "B":
                nxt = "L" if op.stage + 1 == 2 else "B"
                assert Op(nxt, op.stage + 1, op.microbatch) in seen
            seen.add(op)
        assert len(order) == 4 * 2 * 2 + 4
    assert theoretical_bubble(4, 8) == pytest.approx(3 / 11)
    with pytest.raises(ValueError, match="schedule must be one of"):
        stage_orders(2, 2, "zigzag")


def test_a_batch_split_over_devices_is_cut_into_microbatches_where_it_lies() -> None:
    x = np.arange(16 * 3).reshape(16, 3)
    parts = cut_microbatches(x, 4, blocks=2)
    # Microbatch i: the i-th two rows of each half of the batch; every row once.
    assert [p[:, 0].tolist() for p in parts] == [
        [3 * r for r in (2 * i, 2 * i + 1, 8 + 2 * i, 9 + 2 * i)] for i in range(4)
    ]
    assert all(p.shape == (4, 3) for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts), axis=0), x)
    for got, want in zip(cut_microbatches(x, 4), np.split(x, 4), strict=True):
        np.testing.assert_array_equal(got, want)

    # Compiled for a batch whose rows two devices split: no data moves between them,
    # where cutting runs of rows must move them.
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    spec = jax.ShapeDtypeStruct((16, 3), np.float32, sharding=rows)

    def hlo(blocks: int) -> str:
        cut = jax.jit(lambda b: cut_microbatches(b, 4, blocks), out_shardings=rows)
        return str(cut.lower(spec).compile().as_text())

    moves = re.compile(r"all-to-all|collective-permute|all-gather|all-reduce")
    assert not moves.search(hlo(2))
    assert moves.search(hlo(1))

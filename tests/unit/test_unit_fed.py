"""A host's record of arrays a Dask task in its process is computing, in every order
the client's expect, the task's value and the client's drop can reach it."""

from __future__ import annotations

from pathways_nb.worker._fed import FedPuts


def test_expected_then_stored_is_kept_and_no_longer_awaited() -> None:
    fed = FedPuts()
    fed.expect(1)
    assert fed.all_awaited([1]) and len(fed) == 1
    assert fed.arrive(1)
    assert not fed.all_awaited([1]) and len(fed) == 0


def test_only_inputs_all_awaited_wait_past_the_put_deadline() -> None:
    fed = FedPuts()
    fed.expect(1)
    assert not fed.all_awaited([1, 2])  # 2 is a put of bytes or a transfer
    assert not FedPuts().all_awaited([1])


def test_dropped_while_computed_is_let_go_when_it_comes() -> None:
    fed = FedPuts()
    fed.expect(1)
    assert fed.outstanding(1) and not fed.outstanding(7)
    fed.drop([1, 7])
    assert not fed.all_awaited([1]) and fed.outstanding(1)
    assert not fed.arrive(1)
    assert not fed.outstanding(1)


def test_a_value_before_its_expect_is_kept_and_the_late_expect_waits_for_nothing() -> None:
    fed = FedPuts()
    assert fed.arrive(3)
    fed.expect(3)
    assert not fed.all_awaited([3]) and len(fed) == 0
    fed.expect(4)
    fed.drop([3, 4])
    assert not fed.arrive(4) and len(fed) == 0

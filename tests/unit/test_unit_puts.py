"""Puts that did not fit, held for the controller's note of them."""

from __future__ import annotations

from pathways_nb.worker._puts import WaitingPuts


def test_a_put_waits_for_its_note_and_is_handed_back_once() -> None:
    w = WaitingPuts()
    assert w.park(1, "put 1")
    assert len(w) == 1
    assert w.noted(2) is None  # another put's note, before that put
    assert w.noted(1) == "put 1"
    assert w.noted(1) is None and len(w) == 0


def test_a_put_whose_note_came_first_is_not_held() -> None:
    w = WaitingPuts()
    assert w.noted(1) is None
    assert not w.park(1, "put 1")  # everything before it is done: try it once more
    assert w.park(1, "again")  # the note was used up


def test_a_put_that_fit_forgets_its_early_note() -> None:
    w = WaitingPuts()
    w.noted(1)
    w.arrived(1)
    assert w.park(1, "put 1")


def test_notes_without_puts_are_remembered_up_to_a_bound() -> None:
    w = WaitingPuts(remember=2)
    for h in (1, 2, 3):
        w.noted(h)
    assert w.park(1, "put 1")  # its note was forgotten: it waits
    assert not w.park(3, "put 3")


def test_puts_whose_note_never_comes_expire() -> None:
    w = WaitingPuts()
    w.park(1, "put 1")
    assert w.expired(60.0) == []
    assert w.expired(-1.0) == ["put 1"]  # held since before a second from now
    assert len(w) == 0

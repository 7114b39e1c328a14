"""SendsInFlight: a launch may not donate an array a send still reads."""

from __future__ import annotations

import threading

from pathways_nb.worker._sending import SendsInFlight


def _sends() -> tuple[SendsInFlight, list[int]]:
    woken: list[int] = []
    cv = threading.Condition()
    return SendsInFlight(cv, lambda: woken.append(1)), woken


def test_a_launch_that_donates_an_array_being_sent_waits_for_the_last_send() -> None:
    sends, woken = _sends()
    sends.started(7)
    sends.started(7)
    assert sends.blocks([3, 7], donate=[1])
    sends.finished(7)
    assert sends.blocks([3, 7], donate=[1]) and woken == []
    sends.finished(7)
    assert woken == [1]
    assert not sends.blocks([3, 7], donate=[1])


def test_launches_that_do_not_donate_the_source_are_not_held() -> None:
    sends, woken = _sends()
    sends.started(7)
    assert not sends.blocks([7], donate=[])
    assert not sends.blocks([3, 7], donate=[0])
    sends.finished(7)
    assert woken == []  # no launch waited: the lot is not stirred


def test_an_end_of_a_send_never_started_is_ignored() -> None:
    sends, woken = _sends()
    sends.finished(9)
    sends.started(9)
    assert sends.blocks([9], donate=[0])
    sends.finished(9)
    assert woken == [1]

"""The controller's count of each host's silence, its own absences left out."""

from __future__ import annotations

from pathways_nb.controller._silence import LATE, Silences


def test_a_host_is_silent_after_its_timeout_and_not_before() -> None:
    s = Silences()
    s.heard("a", 100.0)
    s.heard("b", 105.0)
    assert s.silent(129.0, 30.0) == []
    assert s.silent(131.0, 30.0) == ["a"]
    s.heard("a", 131.0)
    assert s.silent(136.0, 30.0) == ["b"]
    s.forget("b")
    assert s.silent(136.0, 30.0) == []


def test_time_the_controller_was_away_is_not_a_hosts_silence() -> None:
    s = Silences()
    s.heard("a", 100.0)
    s.heard("b", 100.5)
    # The controller's thread did not turn for 40 s (its process or machine stalled):
    # on waking, no host has been silent for longer than it could have heard them.
    s.away(40.0)
    assert s.silent(141.0, 30.0) == []
    # Silence after the controller is back counts again.
    assert s.silent(171.0, 30.0) == ["a", "b"]


def test_a_turn_a_little_late_excuses_nothing() -> None:
    s = Silences()
    s.heard("a", 100.0)
    s.away(LATE * 0.9)  # a turn's own work, a busy moment
    assert s.silent(130.5, 30.0) == ["a"]

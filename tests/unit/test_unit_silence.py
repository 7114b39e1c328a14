"""The controller's count of each host's silence, its own absences left out."""

from __future__ import annotations

from pathways_nb.controller._silence import Silences
from pathways_nb.controller._tenants import Tenants


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


def test_time_the_controller_was_away_does_not_lapse_a_clients_lease() -> None:
    tenants = Tenants()
    t = tenants.add(b"id", "notebook")
    seen = t.last_seen
    tenants.away(40.0)
    assert tenants.expired(30.0, now=seen + 41.0) == []
    assert tenants.expired(30.0, now=seen + 71.0) == [t]

"""The resource manager as a state machine: hosts in, virtual slices out."""

from __future__ import annotations

import pytest

from pathways_nb._core import BusyError, ClosedError, DataLossError
from pathways_nb.controller import HostInfo, ResourceManager, SliceInfo


def host(name: str, n: int, island: str | None = None) -> HostInfo:
    return HostInfo(
        host=name,
        island=island or f"island-{name}",
        devices=list(range(n)),
        data_address=f"inproc://{name}",
        process="p0",
        platform="cpu",
    )


def manager(*hosts: HostInfo) -> ResourceManager:
    rm = ResourceManager()
    for h in hosts:
        rm.add_host(h)
    return rm


def used(rm: ResourceManager) -> dict[str, list[int]]:
    return {h["host"]: h["used"] for h in rm.snapshot()["hosts"]}


def test_allocate_takes_the_first_free_devices_of_one_host() -> None:
    rm = manager(host("a", 4))
    mesh = {"data": 2, "model": 1}
    s = rm.allocate(tenant=1, mesh=mesh, name=None)
    mesh["data"] = 99  # the slice keeps its own copy
    assert s == SliceInfo(
        slice="s1",
        name="s1",
        tenant=1,
        mesh={"data": 2, "model": 1},
        island="island-a",
        host="a",
        devices=[0, 1],
    )
    assert s.size == 2
    assert rm.allocate(1, {"data": 2}, "second").devices == [2, 3]
    assert used(rm) == {"a": [0, 1, 2, 3]}


def test_slices_spread_fewest_active_slices_first_then_most_free_devices() -> None:
    rm = manager(host("a", 8), host("b", 4))
    hosts = [rm.allocate(1, {"data": 1}, None).host for _ in range(5)]
    # a: 8 free beats b: 4 free; then b holds fewer slices; then a (7 free vs 3); ...
    assert hosts == ["a", "b", "a", "b", "a"]


def test_an_island_without_room_is_skipped_even_if_it_is_emptier() -> None:
    rm = manager(host("a", 8), host("b", 2))
    assert rm.allocate(1, {"data": 1}, None).host == "a"
    # b holds no slice but has only 2 devices.
    assert rm.allocate(1, {"data": 4}, None).host == "a"
    assert rm.allocate(1, {"data": 2}, None).host == "b"


def test_equal_candidates_are_broken_by_host_name() -> None:
    rm = manager(host("b", 4), host("a", 4))
    assert rm.allocate(1, {"data": 1}, None).host == "a"


def test_busy_error_names_free_devices_per_island() -> None:
    rm = manager(host("a", 4), host("b", 2))
    rm.allocate(1, {"data": 2}, None)
    rm.allocate(1, {"data": 2}, None)
    rm.allocate(1, {"data": 1}, None)
    with pytest.raises(BusyError) as info:
        rm.allocate(2, {"data": 2, "model": 2}, None)
    assert str(info.value) == (
        "no island has 4 free devices for mesh {'data': 2, 'model': 2}; free devices per "
        "island: island-a: 1/4, island-b: 0/2. Release a slice, ask for a smaller mesh, "
        "or add hosts."
    )


def test_busy_error_without_live_hosts() -> None:
    rm = manager(host("a", 4))
    rm.lose_host("a")
    for r in (rm, ResourceManager()):
        with pytest.raises(BusyError, match=r"free devices per island: none \(no live hosts\)"):
            r.allocate(1, {"data": 1}, None)


def test_duplicate_active_name_for_one_tenant_is_a_value_error() -> None:
    rm = manager(host("a", 8))
    first = rm.allocate(1, {"data": 1}, "train")
    with pytest.raises(ValueError, match="already has an active slice named 'train'"):
        rm.allocate(1, {"data": 1}, "train")
    # Another tenant may use the name; the owner may reuse it once released.
    assert rm.allocate(2, {"data": 1}, "train").name == "train"
    rm.release(first.slice, 1)
    again = rm.allocate(1, {"data": 1}, "train")
    assert again.name == "train" and again.slice != first.slice


def test_release_frees_devices_and_is_idempotent() -> None:
    rm = manager(host("a", 2))
    s1 = rm.allocate(1, {"data": 2}, None)
    assert rm.release(s1.slice, 1).state == "released"
    assert used(rm) == {"a": []}
    s2 = rm.allocate(1, {"data": 2}, None)
    assert s2.devices == [0, 1]
    # Releasing s1 again must not free the devices s2 now holds.
    assert rm.release(s1.slice, 1).state == "released"
    assert used(rm) == {"a": [0, 1]}
    with pytest.raises(BusyError):
        rm.allocate(1, {"data": 1}, None)


def test_release_checks_the_owner() -> None:
    rm = manager(host("a", 2))
    s = rm.allocate(1, {"data": 1}, None)
    with pytest.raises(ClosedError, match="slice 's1' does not exist for this client"):
        rm.release(s.slice, 2)
    with pytest.raises(ClosedError, match="slice 's9' does not exist"):
        rm.release("s9", 1)
    assert rm.get(s.slice) is s  # no tenant: the controller's own view
    assert s.state == "active"


def test_lose_host_loses_its_active_slices_and_frees_devices() -> None:
    rm = manager(host("a", 4), host("b", 4))
    on_a = rm.allocate(1, {"data": 1}, "x")
    on_b = rm.allocate(2, {"data": 1}, None)
    gone = rm.allocate(1, {"data": 1}, None)
    assert (on_a.host, on_b.host, gone.host) == ("a", "b", "a")
    rm.release(gone.slice, 1)

    lost = rm.lose_host("a")

    assert lost == [on_a]
    assert (on_a.state, on_b.state, gone.state) == ("lost", "active", "released")
    assert rm.hosts["a"].alive is False
    assert used(rm) == {"a": [], "b": [0]}
    assert rm.lose_host("a") == []
    assert rm.lose_host("nowhere") == []
    # Dead hosts get no new slices.
    assert rm.allocate(1, {"data": 3}, None).host == "b"


def test_active_says_why_a_slice_cannot_run() -> None:
    rm = manager(host("a", 4))
    live = rm.allocate(1, {"data": 1}, "live")
    freed = rm.allocate(1, {"data": 1}, "freed")
    rm.release(freed.slice, 1)
    assert rm.active(live.slice, 1) is live
    with pytest.raises(ClosedError, match="slice 'freed' was released; allocate a new one"):
        rm.active(freed.slice, 1)
    rm.lose_host("a")
    with pytest.raises(DataLossError) as info:
        rm.active(live.slice, 1)
    assert str(info.value) == "[data_loss] slice 'live' was lost with host a (slice live, host a)"
    # Releasing a lost slice keeps it "lost": the devices went with the host.
    assert rm.release(live.slice, 1).state == "lost"


def test_reregistering_a_live_host_loses_its_slices() -> None:
    rm = manager(host("a", 4))
    s = rm.allocate(1, {"data": 4}, None)
    rm.add_host(host("a", 2))
    assert s.state == "lost"
    assert rm.hosts["a"].alive and rm.hosts["a"].devices == [0, 1]
    assert used(rm) == {"a": []}
    assert rm.allocate(1, {"data": 2}, None).devices == [0, 1]


def test_a_dead_host_comes_back_empty() -> None:
    rm = manager(host("a", 2))
    s = rm.allocate(1, {"data": 2}, None)
    rm.lose_host("a")
    rm.add_host(host("a", 2))
    assert s.state == "lost"
    assert rm.allocate(1, {"data": 2}, None).devices == [0, 1]


def test_snapshot_lists_hosts_with_used_devices_and_unreleased_slices() -> None:
    rm = manager(host("a", 3), host("b", 1))
    keep = rm.allocate(7, {"data": 2}, "keep")
    drop = rm.allocate(7, {"data": 1}, None)
    rm.release(drop.slice, 7)
    lost = rm.allocate(7, {"data": 1}, None)
    rm.lose_host(lost.host)
    snap = rm.snapshot()
    assert snap["hosts"] == [
        {
            "host": "a",
            "island": "island-a",
            "devices": [0, 1, 2],
            "data_address": "inproc://a",
            "process": "p0",
            "platform": "cpu",
            "alive": True,
            "store_limit": 0,
            "used": [0, 1],
        },
        {
            "host": "b",
            "island": "island-b",
            "devices": [0],
            "data_address": "inproc://b",
            "process": "p0",
            "platform": "cpu",
            "alive": False,
            "store_limit": 0,
            "used": [],
        },
    ]
    assert snap["slices"] == [keep.to_dict(), lost.to_dict()]
    assert snap["slices"][0] == {
        "slice": "s1",
        "name": "keep",
        "tenant": 7,
        "mesh": {"data": 2},
        "island": "island-a",
        "host": "a",
        "devices": [0, 1],
        "state": "active",
        "axis_types": [],
    }
    assert snap["slices"][1]["state"] == "lost"


def test_what_is_released_leaves_the_live_table_and_is_remembered_for_a_while() -> None:
    """A long-lived cluster allocates and releases without end: an allocation, and a
    tenant leaving, walk only the slices still live (they walked every slice ever made,
    and an allocation took 4x as long after 20k of them)."""
    rm = manager(host("a", 2))
    rm.REMEMBER_RELEASED = 5
    first = rm.allocate(tenant=1, mesh={"x": 1}, name=None)
    rm.release(first.slice, 1)
    for _ in range(20):
        rm.release(rm.allocate(tenant=1, mesh={"x": 1}, name=None).slice, 1)
    assert rm.slices == {}
    # A recent one is still known as released; the oldest are forgotten.
    last = rm.allocate(tenant=1, mesh={"x": 1}, name=None)
    rm.release(last.slice, 1)
    with pytest.raises(ClosedError, match="was released"):
        rm.active(last.slice, 1)
    assert rm.release(last.slice, 1).state == "released"  # twice is still a no-op
    with pytest.raises(ClosedError, match="does not exist"):
        rm.get(first.slice, 1)


def test_a_departed_tenants_lost_slices_are_forgotten_with_it() -> None:
    rm = manager(host("a", 2), host("b", 2))
    kept = rm.allocate(tenant=2, mesh={"x": 2}, name=None)
    lost = rm.allocate(tenant=1, mesh={"x": 2}, name=None)
    rm.lose_host(lost.host)
    assert [s["slice"] for s in rm.snapshot()["slices"]] == [kept.slice, lost.slice]
    rm.forget_tenant(1)
    assert [s["slice"] for s in rm.snapshot()["slices"]] == [kept.slice]
    with pytest.raises(DataLossError, match="was lost"):
        rm.active(lost.slice, 1)  # still known, and still says why


def test_a_lost_slice_goes_back_to_its_restarted_island_first() -> None:
    rm = manager(host("a", 4), host("b", 4))
    s = rm.allocate(1, {"x": 2}, "mine")
    assert rm.remap_lost() == []  # nothing is lost
    was = s.island
    rm.lose_host(s.host)
    spare = "b" if s.host == "a" else "a"
    assert rm.remap_lost() == [s]  # the spare island has room: it takes the slice
    assert (s.state, s.host, s.devices) == ("active", spare, [0, 1])
    rm.lose_host(spare)
    assert rm.remap_lost() == [] and s.state == "lost"  # no live host at all now
    restarted = host("a" if spare == "b" else "b", 4, island=was)
    rm.add_host(restarted)
    (moved,) = rm.remap_lost()
    assert moved is s and s.island == was and s.state == "active"
    assert used(rm)[restarted.host] == [0, 1]
    assert rm.active(s.slice, 1) is s


def test_lost_slices_move_oldest_first_where_they_fit_and_released_ones_never() -> None:
    rm = manager(host("a", 4), host("b", 2), host("c", 2))
    big = rm.allocate(1, {"x": 4}, None)  # on a
    small = rm.allocate(2, {"x": 2}, None)  # on b or c
    dropped = rm.allocate(3, {"x": 2}, None)  # the other one
    rm.lose_host(small.host)
    rm.lose_host(dropped.host)
    rm.lose_host(big.host)
    rm.release(dropped.slice, 3)
    rm.add_host(host("d", 2))
    assert rm.remap_lost() == [small]  # big does not fit; dropped was released
    assert big.state == "lost" and dropped.state == "lost"
    gpu = host("e", 8)
    gpu.platform = "cuda"
    rm.add_host(gpu)
    assert rm.remap_lost() == [] and big.state == "lost"  # programs were made for cpu
    rm.add_host(host("f", 8))
    assert rm.remap_lost() == [big] and big.host == "f"


def test_a_device_quota_bounds_what_one_tenant_holds_lost_slices_included() -> None:
    from pathways_nb._core import ResourceExhaustedError

    rm = manager(host("a", 4), host("b", 4), host("c", 4))
    rm.allocate(1, {"x": 2}, "first", max_devices=4)
    second = rm.allocate(1, {"x": 2}, "second", max_devices=4)
    assert rm.held(1) == 4
    with pytest.raises(ResourceExhaustedError) as info:
        rm.allocate(1, {"x": 1}, None, max_devices=4)
    assert str(info.value) == (
        "[resource_exhausted] mesh {'x': 1} needs 1 devices, and this client holds 4 "
        "(first (2), second (2)) of the 4 devices one client may hold on this cluster "
        "(PATHWAYS_TENANT_MAX_DEVICES, set where the controller runs). Release a slice "
        "(vs.release()), ask for a smaller mesh, or ask the cluster's operator to raise "
        "the quota."
    )
    # Another tenant has a quota of its own; the refused request took nothing.
    assert rm.allocate(2, {"x": 2}, None, max_devices=4).size == 2
    assert rm.held(2) == 2 and rm.held(1) == 4
    assert rm.held_by_tenant() == {1: 4, 2: 2}
    # A lost slice still counts: it takes devices again when it is remapped.
    rm.lose_host(second.host)
    with pytest.raises(ResourceExhaustedError, match=r"second \(2, lost\)"):
        rm.allocate(1, {"x": 1}, None, max_devices=4)
    rm.release(second.slice, 1)
    assert rm.held(1) == 2
    assert rm.allocate(1, {"x": 2}, None, max_devices=4).size == 2
    # 0 is no quota.
    assert rm.allocate(1, {"x": 1}, None, max_devices=0).size == 1


def test_the_snapshot_lists_a_dead_host_only_while_its_island_has_no_live_one() -> None:
    """A worker that restarts registers as a new host of the same island: the status
    listed every process that ever served it."""
    rm = manager(host("a1", 2, island="a"), host("b", 2))
    for old, new in (("a1", "a2"), ("a2", "a3")):
        rm.lose_host(old)
        rm.add_host(host(new, 2, island="a"))
    assert [(h["host"], h["alive"]) for h in rm.snapshot()["hosts"]] == [
        ("b", True),
        ("a3", True),
    ]
    rm.lose_host("a3")  # no live host serves island a: its last one shows why
    assert [(h["host"], h["alive"]) for h in rm.snapshot()["hosts"]] == [
        ("b", True),
        ("a3", False),
    ]
    assert len(rm.hosts) == 4  # still known, for what names them

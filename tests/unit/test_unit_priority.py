"""Hosts on CPU devices lower the priority of XLA's threads (a nice value and the
SCHED_IDLE policy), may spread them over the cores, and leave every Python thread as it
was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")

# Run in a process of its own: a raised nice value cannot be lowered again without
# privilege, and the test process's own XLA threads must keep theirs.
_SCRIPT = textwrap.dedent(
    """
    import json, os, threading
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    from pathways_nb.worker._priority import lower_native_threads

    jax.local_devices()  # XLA starts its client's thread pools here
    stop = threading.Event()
    py = threading.Thread(target=stop.wait)
    py.start()

    def nices():
        return {
            int(t): os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")
        }

    def cores():
        return {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}

    def policies():
        return {int(t): os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}

    before, cores_before, policies_before = nices(), cores(), policies()
    changed = lower_native_threads(7, spread=True)
    again = lower_native_threads(7, spread=True)
    off = lower_native_threads(0, idle=False)
    after, cores_after, policies_after = nices(), cores(), policies()
    stop.set()
    py.join()
    print(json.dumps({
        "before": before, "after": after, "changed": changed, "again": again, "off": off,
        "cores_before": cores_before, "cores_after": cores_after,
        "policies_before": policies_before, "policies_after": policies_after,
        "other": os.SCHED_OTHER, "idle": os.SCHED_IDLE,
        "allowed": sorted(os.sched_getaffinity(0)), "pid": os.getpid(),
        "python": [threading.main_thread().native_id, py.native_id],
    }))
    """
)


def test_xla_threads_get_the_nice_value_and_sched_idle_and_python_threads_keep_theirs() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    python = {str(t) for t in r["python"]}
    native = set(r["after"]) - python
    assert set(r["before"].values()) == {0}
    # XLA's CPU client keeps pools of native threads: at least one per device here.
    assert len(native) >= 4
    assert {r["after"][t] for t in native} == {7}
    assert {r["after"][t] for t in python} == {0}
    assert set(r["policies_before"].values()) == {r["other"]}
    assert {r["policies_after"][t] for t in native} == {r["idle"]}
    assert {r["policies_after"][t] for t in python} == {r["other"]}
    assert r["changed"] == len(native)
    assert r["again"] == 0 and r["off"] == 0
    # Python threads keep every core; XLA's go round-robin, one core each, in the order
    # they started (from a core picked by the process id), so a pool's threads land on
    # different cores.
    allowed = r["allowed"]
    assert all(r["cores_after"][t] == r["cores_before"][t] == allowed for t in python)
    pinned = [r["cores_after"][t] for t in sorted(native, key=int)]
    if len(allowed) > 1:
        n = len(allowed)
        assert pinned == [[allowed[(r["pid"] + i) % n]] for i in range(len(native))]
    else:
        assert all(c == allowed for c in pinned)


def _run(call: str) -> dict[str, object]:
    script = textwrap.dedent(
        f"""
        import json, os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax
        from pathways_nb.worker._priority import lower_native_threads

        jax.local_devices()
        changed = {call}
        allowed = sorted(os.sched_getaffinity(0))
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        cores = [sorted(os.sched_getaffinity(t)) for t in tids]
        print(json.dumps({{
            "changed": changed,
            "same_cores": all(c == allowed for c in cores),
            "idle": sum(os.sched_getscheduler(t) == os.SCHED_IDLE for t in tids),
            "nices": sorted({{os.getpriority(os.PRIO_PROCESS, t) for t in tids}}),
        }}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_by_default_threads_are_not_pinned() -> None:
    r = _run("lower_native_threads(5)")
    assert r["same_cores"] is True
    assert isinstance(r["idle"], int) and r["idle"] >= 4
    assert r["nices"] == [0, 5]


def test_sched_idle_can_be_turned_off_and_leaves_the_nice_value() -> None:
    r = _run("lower_native_threads(5, idle=False)")
    assert r["idle"] == 0
    assert r["nices"] == [0, 5]


def test_sched_idle_alone_keeps_the_nice_value() -> None:
    r = _run("lower_native_threads(0)")
    assert isinstance(r["idle"], int) and r["idle"] >= 4
    assert r["nices"] == [0]
    assert r["changed"] == r["idle"]

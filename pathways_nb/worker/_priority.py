"""Simulated devices yield the cores to the control plane.

XLA's CPU client runs each device's share of a program on native threads of its own,
and those threads spin looking for more work before they sleep (Eigen's thread pool):
on a machine whose cores also run the client, the controller and the hosts' Python
threads, the spinning delays every message on the dispatch path. A host whose devices
are CPU devices therefore gives XLA's threads a higher nice value: whenever a Python
thread and an XLA thread both want a core the Python thread runs first, and the devices
still get every cycle nobody else wants. Raising one's own nice value needs no
privilege. Hosts with accelerators leave XLA's threads alone: there they feed the
device.
"""

from __future__ import annotations

import os
import threading

_TASKS = "/proc/self/task"


def lower_native_threads(nice: int) -> int:
    """Give every thread of this process that Python did not start at least ``nice``;
    return how many threads changed. A no-op (0) where threads cannot be listed."""
    if nice <= 0 or not os.path.isdir(_TASKS):
        return 0
    tids = [int(name) for name in os.listdir(_TASKS)]
    # Listed after the tasks: a Python thread starting meanwhile has registered by now.
    python = {t.native_id for t in threading.enumerate()}
    changed = 0
    for tid in tids:
        if tid in python:
            continue
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except OSError:
            continue  # the thread ended meanwhile
    return changed

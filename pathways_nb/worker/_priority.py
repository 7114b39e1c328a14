"""Simulated devices yield the cores to the control plane, spread over the cores.

XLA's CPU client runs each device's share of a program on native threads of its own,
and those threads spin looking for more work before they sleep (Eigen's thread pool):
on a machine whose cores also run the client, the controller and the hosts' Python
threads, the spinning delays every message on the dispatch path. A host whose devices
are CPU devices therefore gives XLA's threads a higher nice value: whenever a Python
thread and an XLA thread both want a core the Python thread runs first, and the devices
still get every cycle nobody else wants. Raising one's own nice value needs no
privilege. Hosts with accelerators leave XLA's threads alone: there they feed the
device.

A high nice value has a cost of its own: Linux balances cores by load weight, and
niced threads weigh almost nothing (nice 19 is 1/68 of nice 0), so the scheduler packs
all of them on one core beside a single Python thread. Every device then waits for that
one core at each collective's rendezvous: measured here, 16 chained all-reduce
programs on 4 CPU devices took 2.3-2.7 ms so packed against 1.6-1.9 ms at nice 0. The
niced threads are therefore also pinned round-robin to the cores this process may
use, in the order XLA started them (a pool starts its threads one after another), so
each core holds its share of every pool; each process starts the round at a core of its
own (by process id), so hosts sharing a machine do not all begin on the first core.
"""

from __future__ import annotations

import os
import threading

_TASKS = "/proc/self/task"


def lower_native_threads(nice: int, spread: bool = True) -> int:
    """Give every thread of this process that Python did not start at least ``nice``
    and, with ``spread``, pin them round-robin to this process's cores; return how many
    threads changed. A no-op (0) where threads cannot be listed or ``nice`` is 0."""
    if nice <= 0 or not os.path.isdir(_TASKS):
        return 0
    tids = sorted(int(name) for name in os.listdir(_TASKS))
    # Listed after the tasks: a Python thread starting meanwhile has registered by now.
    python = {t.native_id for t in threading.enumerate()}
    cpus = sorted(os.sched_getaffinity(0)) if spread else []
    start = os.getpid()
    changed = 0
    for i, tid in enumerate(t for t in tids if t not in python):
        try:
            touched = False
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                touched = True
            if len(cpus) > 1:
                core = {cpus[(start + i) % len(cpus)]}
                if os.sched_getaffinity(tid) != core:
                    os.sched_setaffinity(tid, core)
                    touched = True
            changed += touched
        except OSError:
            continue  # the thread ended meanwhile
    return changed

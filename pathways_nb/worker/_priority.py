"""Simulated devices yield the cores to the control plane.

XLA's CPU client runs each device's share of a program on native threads of its own,
and those threads spin looking for more work before they sleep (Eigen's thread pool):
on a machine whose cores also run the client, the controller and the hosts' Python
threads, the spinning delays every message on the dispatch path. A host whose devices
are CPU devices therefore runs XLA's threads under Linux's ``SCHED_IDLE`` policy (and
at a high nice value, which is what remains where that policy cannot be set): a Python
thread that wants a core takes it from them at once, and the devices still get every
cycle nobody else wants. Lowering one's own threads needs no privilege. Hosts with
accelerators leave XLA's threads alone: there they feed the device.

A nice value alone is not enough, because of where the kernel puts a thread it wakes.
A message on a socket wakes its reader with a hint that the writer is about to sleep,
so the reader is queued on the writer's core unless another core is idle; a core
whose only runnable threads are niced XLA threads is not idle, but one whose only
runnable threads are ``SCHED_IDLE`` ones is. Seen with ``perf sched`` in a chain of
launches at nice 19: a device thread spinning for work kept the second core for
1.5-1.9 ms at the start of every cycle, while the controller, woken by the client's
first launch, waited 0.6-0.7 ms queued behind the client, which went on submitting on
the first core. Under ``SCHED_IDLE`` the controller and then the host's socket thread
take the second core as soon as they are woken.

The threads can also be pinned round-robin to the process's cores (``spread``), in the
order XLA started them, each process starting the round at a core of its own (by
process id). At nice 19 without ``SCHED_IDLE`` that was needed, since niced threads
weigh almost nothing in the kernel's balancing of cores and were packed on one; under
``SCHED_IDLE`` pinning only keeps a ready device thread off a core that is free, and it
is off by default.
"""

from __future__ import annotations

import os
import threading

_TASKS = "/proc/self/task"
# Linux only: elsewhere there is no /proc/self/task either, and nothing is lowered.
_IDLE: int = getattr(os, "SCHED_IDLE", -1)


def lower_native_threads(nice: int, spread: bool = False, idle: bool = True) -> int:
    """Give every thread of this process that Python did not start at least ``nice``,
    with ``idle`` the ``SCHED_IDLE`` policy, and with ``spread`` pin them round-robin
    to this process's cores; return how many threads changed. A no-op (0) where threads
    cannot be listed, or where ``nice`` is 0 and ``idle`` false."""
    idle = idle and _IDLE >= 0
    if (nice <= 0 and not idle) or not os.path.isdir(_TASKS):
        return 0
    tids = sorted(int(name) for name in os.listdir(_TASKS))
    # Listed after the tasks: a Python thread starting meanwhile has registered by now.
    python = {t.native_id for t in threading.enumerate()}
    cpus = sorted(os.sched_getaffinity(0)) if spread else []
    start = os.getpid()
    changed = 0
    for i, tid in enumerate(t for t in tids if t not in python):
        touched = False
        try:
            if nice > 0 and os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                touched = True
            if idle and os.sched_getscheduler(tid) != _IDLE:
                os.sched_setscheduler(tid, _IDLE, os.sched_param(0))
                touched = True
            if len(cpus) > 1:
                core = {cpus[(start + i) % len(cpus)]}
                if os.sched_getaffinity(tid) != core:
                    os.sched_setaffinity(tid, core)
                    touched = True
        except OSError:
            pass  # the thread ended meanwhile, or a sandbox forbids the call
        changed += touched
    return changed

"""Which of this machine's accelerators each island of a local cluster owns.

Every worker process of a ``pw.LocalCluster`` would otherwise see every GPU of the
machine, and each island's host would claim all of them: two processes driving the same
devices, each taking most of their memory. Island ``i`` gets the ``i``-th run of
``devices_per_island`` GPUs through ``CUDA_VISIBLE_DEVICES``, which the CUDA runtime
(and so JAX) in its process honours. Decided in the process that starts the cluster,
before any worker starts, from what it can see without loading CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

_NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def nvidia_gpus(env: Mapping[str, str], driver_dir: str = _NVIDIA_GPUS) -> list[str]:
    """The NVIDIA GPUs a process started with ``env`` may use, as ``CUDA_VISIBLE_DEVICES``
    names them: its own entries when it is set (indices or UUIDs, up to the first
    invalid one such as ``-1``, as CUDA reads it), else ``0..N-1`` for the N GPUs the
    driver lists; none without the NVIDIA driver."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        out = []
        for entry in (v.strip() for v in visible.split(",")):
            if not entry or entry.startswith("-"):
                break
            out.append(entry)
        return out
    try:
        count = len(os.listdir(driver_dir))
    except OSError:
        return []
    return [str(i) for i in range(count)]


def island_envs(
    platform: str | None,
    islands: int,
    devices_per_island: int,
    env: Mapping[str, str],
    driver_dir: str = _NVIDIA_GPUS,
) -> list[dict[str, str]]:
    """The environment each island's worker adds to the cluster's, in island order.

    With GPUs in play (``platform`` None, ``"cuda"`` or ``"gpu"``, and NVIDIA GPUs
    visible), island ``i`` owns GPUs ``i*d .. (i+1)*d - 1`` of them; a request for more
    than there are is refused before anything starts. Otherwise nothing is added.
    """
    if platform not in (None, "cuda", "gpu"):
        return [{} for _ in range(islands)]
    gpus = nvidia_gpus(env, driver_dir)
    if not gpus:
        if platform is None:
            return [{} for _ in range(islands)]
        raise ValueError(
            f"platform={platform!r} asks for NVIDIA GPUs, but this process sees none "
            f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}, no {driver_dir}): "
            "use platform='cpu' to simulate devices"
        )
    need = islands * devices_per_island
    if need > len(gpus):
        raise ValueError(
            f"{islands} islands of {devices_per_island} devices need {need} GPUs, and this "
            f"machine shows {len(gpus)} ({','.join(gpus)}): each island owns GPUs of its "
            "own, so ask for fewer islands or devices per island, or platform='cpu' to "
            "simulate them"
        )
    return [
        {
            "CUDA_VISIBLE_DEVICES": ",".join(
                gpus[i * devices_per_island : (i + 1) * devices_per_island]
            )
        }
        for i in range(islands)
    ]

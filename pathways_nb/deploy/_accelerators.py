"""Which of this machine's accelerators each island of a local cluster owns.

Every worker process of a ``pw.LocalCluster`` would otherwise see every GPU of the
machine, and each island's host would claim all of them: two processes driving the same
devices, each taking most of their memory. Island ``i`` gets the ``i``-th run of
``devices_per_island`` GPUs through the variable the GPUs' runtime (and so JAX) in its
process honours: ``CUDA_VISIBLE_DEVICES`` for NVIDIA GPUs; for AMD GPUs
``HIP_VISIBLE_DEVICES`` when it is set (it numbers the GPUs ``ROCR_VISIBLE_DEVICES``
leaves), else ``ROCR_VISIBLE_DEVICES``. Decided in the process that starts the cluster,
before any worker starts, from what it can see without loading CUDA or ROCm.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from typing import NamedTuple

from pathways_nb.deploy._tpus import _PCI_DEVICES, tpu_chips, tpu_island_envs

_NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
# The kernel's compute topology for AMD GPUs: one node per CPU socket and per GPU.
_KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


class Gpus(NamedTuple):
    """The GPUs a process may use, as ``variable`` names them."""

    vendor: str
    variable: str
    names: list[str]


def _entries(visible: str) -> list[str]:
    """A visibility list's entries (indices or UUIDs), up to the first invalid one such
    as ``-1``, as CUDA and ROCm read it."""
    out = []
    for entry in (v.strip() for v in visible.split(",")):
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return out


def nvidia_gpus(env: Mapping[str, str], driver_dir: str = _NVIDIA_GPUS) -> list[str]:
    """The NVIDIA GPUs a process started with ``env`` may use, as ``CUDA_VISIBLE_DEVICES``
    names them: its own entries when it is set, else ``0..N-1`` for the N GPUs the
    driver lists; none without the NVIDIA driver."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return _entries(visible)
    try:
        count = len(os.listdir(driver_dir))
    except OSError:
        return []
    return [str(i) for i in range(count)]


def _kfd_gpu_count(kfd_dir: str) -> int:
    """AMD GPUs the kernel driver lists: topology nodes with a nonzero ``gpu_id``."""
    try:
        nodes = os.listdir(kfd_dir)
    except OSError:
        return 0
    count = 0
    for node in nodes:
        try:
            with open(os.path.join(kfd_dir, node, "gpu_id")) as f:
                count += int(f.read().strip() or 0) != 0
        except (OSError, ValueError):
            continue
    return count


def amd_gpus(env: Mapping[str, str], kfd_dir: str = _KFD_NODES) -> Gpus | None:
    """The AMD GPUs a process started with ``env`` may use, and the variable that picks
    among them; None without the AMD driver."""
    count = _kfd_gpu_count(kfd_dir)
    if not count:
        return None
    for variable in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if (visible := env.get(variable)) is not None:
            return Gpus("AMD", variable, _entries(visible))
    return Gpus("AMD", "ROCR_VISIBLE_DEVICES", [str(i) for i in range(count)])


def visible_gpus(
    platform: str | None,
    env: Mapping[str, str],
    driver_dir: str = _NVIDIA_GPUS,
    kfd_dir: str = _KFD_NODES,
) -> Gpus | None:
    """The GPUs ``platform`` would use (NVIDIA for ``"cuda"``, AMD for ``"rocm"``, either
    for None or ``"gpu"``, NVIDIA first), None if there are none."""
    if platform in (None, "cuda", "gpu") and (names := nvidia_gpus(env, driver_dir)):
        return Gpus("NVIDIA", "CUDA_VISIBLE_DEVICES", names)
    if platform in (None, "rocm", "gpu"):
        amd = amd_gpus(env, kfd_dir)
        if amd is not None and amd.names:
            return amd
    return None


def island_envs(
    platform: str | None,
    islands: int,
    devices_per_island: int,
    env: Mapping[str, str],
    driver_dir: str = _NVIDIA_GPUS,
    kfd_dir: str = _KFD_NODES,
    pci_dir: str = _PCI_DEVICES,
) -> list[dict[str, str]]:
    """The environment each island's worker adds to the cluster's, in island order.

    With GPUs in play (``platform`` None, ``"cuda"``, ``"rocm"`` or ``"gpu"``, and such
    GPUs visible), island ``i`` owns GPUs ``i*d .. (i+1)*d - 1`` of them; with TPU chips
    (``platform`` None or ``"tpu"``), chips likewise (see ``_tpus``). A request for more
    than there are is refused before anything starts. Otherwise nothing is added.
    """
    if platform in (None, "tpu"):
        tpus = tpu_chips(env, pci_dir)
        if tpus is not None and tpus.names:
            return tpu_island_envs(tpus, islands, devices_per_island)
        if platform == "tpu":
            raise ValueError(
                "platform='tpu' asks for TPU chips, but this process sees none"
                + (
                    f" (TPU_VISIBLE_CHIPS={env['TPU_VISIBLE_CHIPS']!r})"
                    if "TPU_VISIBLE_CHIPS" in env
                    else f" (no Google TPU under {pci_dir})"
                )
                + ": use platform='cpu' to simulate devices"
            )
    if platform not in (None, "cuda", "rocm", "gpu"):
        return [{} for _ in range(islands)]
    gpus = visible_gpus(platform, env, driver_dir, kfd_dir)
    if gpus is None:
        if platform is None:
            return [{} for _ in range(islands)]
        wanted = {"cuda": "NVIDIA GPUs", "rocm": "AMD GPUs"}.get(platform, "GPUs")
        shown = ", ".join(
            f"{v}={env.get(v)!r}"
            for v in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
            if v in env
        )
        raise ValueError(
            f"platform={platform!r} asks for {wanted}, but this process sees none"
            + (f" ({shown})" if shown else f" (no {driver_dir}, no GPU under {kfd_dir})")
            + ": use platform='cpu' to simulate devices"
        )
    need = islands * devices_per_island
    if need > len(gpus.names):
        raise ValueError(
            f"{islands} islands of {devices_per_island} devices need {need} GPUs, and this "
            f"machine shows {len(gpus.names)} {gpus.vendor} GPUs ({','.join(gpus.names)}): "
            "each island owns GPUs of its own, so ask for fewer islands or devices per "
            "island, or platform='cpu' to simulate them"
        )
    d = devices_per_island
    return [{gpus.variable: ",".join(gpus.names[i * d : (i + 1) * d])} for i in range(islands)]


# The variables island_envs sets for GPUs: an island env holding one gives its host GPUs.
_GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def spare_the_hosts_gpus(
    envs: list[dict[str, str]],
    environ: MutableMapping[str, str],
    gpu_in_use: bool,
    tpu_in_use: bool = False,
) -> str | None:
    """Keep the calling process (the notebook's, the client's) from holding the GPUs its
    cluster's hosts were given: JAX takes 75% of every GPU it sees when it first uses
    one. Where JAX has not started on a GPU here, it will start without taking memory
    ahead (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, unless set); where it has
    (``gpu_in_use``), the text of a warning saying what to do, else None. TPU chips
    are one process's at a time: where JAX here holds them (``tpu_in_use``) and the
    hosts are given chips, the warning says so."""
    if tpu_in_use and any("TPU_VISIBLE_CHIPS" in env for env in envs):
        return (
            "JAX in this process already holds this machine's TPU chips, which this "
            "cluster's hosts will drive: a chip is one process's at a time, so the hosts "
            "cannot start on them. The client needs no TPU; restart the kernel with "
            "JAX_PLATFORMS=cpu set before JAX is imported"
        )
    if not any(v in env for env in envs for v in _GPU_VARIABLES):
        return None
    if gpu_in_use:
        return (
            "JAX in this process already uses the GPUs this cluster's hosts will drive, and "
            "holds most of their memory: the hosts may run out of it. The client needs no "
            "GPU; start the kernel with JAX_PLATFORMS=cpu (or "
            "XLA_PYTHON_CLIENT_PREALLOCATE=false) before JAX is imported"
        )
    environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return None

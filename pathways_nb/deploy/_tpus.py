"""Which of a TPU VM's chips each island of a local cluster owns.

One process drives a TPU chip at a time: a second host loading the TPU runtime on the
same VM fails with the chips in use. Each island's host therefore gets its own block of
chips through the variables the TPU runtime reads for processes that do not talk to
each other: ``TPU_VISIBLE_CHIPS`` (which chips), ``TPU_CHIPS_PER_PROCESS_BOUNDS`` (their
block of the host's chip grid), ``TPU_PROCESS_BOUNDS=1,1,1`` (a slice of one process),
a port of its own for the runtime's own coordination, and ``ALLOW_MULTIPLE_LIBTPU_LOAD``
(without which the runtime's lock file keeps out every process but the first).

The chips are found as the PCI functions of Google's TPUs, without loading the runtime.
Only generations whose chips are one JAX device each are shared out (v4, v5e, v5p,
v6e): there ``devices_per_island`` counts chips.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from typing import NamedTuple

_PCI_DEVICES = "/sys/bus/pci/devices"
_GOOGLE = "0x1ae0"
# PCI device ids of the TPU generations whose chips JAX shows as one device each.
_ONE_DEVICE_CHIPS = {"0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e", "0x006f": "v6e"}
# TPUs whose chips are not shared out here (v2 and v3 show two devices a chip). Google's
# other PCI functions (the gVNIC network card, NVMe disks) are no TPUs and are ignored.
_OTHER_TPUS = {"0x0027", "0x0076"}
# Chips per process → their block of a host's chip grid (x, y, z), as the runtime takes it.
_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}


class Tpus(NamedTuple):
    """The TPU chips a process may use, as ``TPU_VISIBLE_CHIPS`` names them."""

    generation: str  # "v4", "v5e", ...; "" where the PCI ids are not known here
    names: list[str]
    pci_ids: list[str]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip().lower()
    except OSError:
        return ""


def tpu_chips(env: Mapping[str, str], pci_dir: str = _PCI_DEVICES) -> Tpus | None:
    """The TPU chips of this machine a process started with ``env`` may use (its
    ``TPU_VISIBLE_CHIPS`` when set), None where the machine has none."""
    try:
        functions = sorted(os.listdir(pci_dir))
    except OSError:
        return None
    ids = [
        _read(os.path.join(pci_dir, f, "device"))
        for f in functions
        if _read(os.path.join(pci_dir, f, "vendor")) == _GOOGLE
    ]
    ids = [i for i in ids if i in _ONE_DEVICE_CHIPS or i in _OTHER_TPUS]
    if not ids:
        return None
    generations = {_ONE_DEVICE_CHIPS.get(i, "") for i in ids}
    generation = generations.pop() if len(generations) == 1 else ""
    visible = env.get("TPU_VISIBLE_CHIPS", env.get("TPU_VISIBLE_DEVICES"))
    if visible is None:
        names = [str(n) for n in range(len(ids))]
    else:
        names = [v.strip() for v in visible.split(",") if v.strip()]
    return Tpus(generation, names, sorted(set(ids)))


def free_ports(count: int) -> list[int]:
    """``count`` TCP ports free on loopback now, for each host's TPU runtime."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tpu_island_envs(
    tpus: Tpus,
    islands: int,
    devices_per_island: int,
    ports: Callable[[int], list[int]] = free_ports,
) -> list[dict[str, str]]:
    """Island ``i``'s TPU variables: chips ``i*d .. (i+1)*d - 1`` of those visible.

    One island of every chip needs none. A request the chips cannot meet is refused
    here, before any process starts, saying what the machine has."""
    chips, d = tpus.names, devices_per_island
    if islands == 1 and d == len(chips):
        return [{}]
    if not tpus.generation:
        raise ValueError(
            f"this machine's TPU chips (PCI device ids {', '.join(tpus.pci_ids)}) are not "
            "of a generation whose chips are one JAX device each (v4, v5e, v5p, v6e), so "
            "they cannot be shared out among islands here: run one island of all "
            f"{len(chips)} chips (islands=1, devices_per_island={len(chips)}), or start "
            "each host yourself (`dask worker --preload pathways_nb.deploy.worker`) with "
            "the TPU_VISIBLE_CHIPS its chips need"
        )
    need = islands * d
    if need > len(chips):
        raise ValueError(
            f"{islands} islands of {d} devices need {need} TPU chips, and this machine "
            f"shows {len(chips)} TPU {tpus.generation} chips ({','.join(chips)}): each "
            "island owns chips of its own, so ask for fewer islands or devices per island, "
            "or platform='cpu' to simulate them"
        )
    if d not in _CHIP_BOUNDS:
        raise ValueError(
            f"a TPU island takes 1, 2, 4 or 8 chips, a block of the machine's chip grid; "
            f"got devices_per_island={d}"
        )
    out = []
    for i, port in enumerate(ports(islands)):
        out.append(
            {
                "TPU_VISIBLE_CHIPS": ",".join(chips[i * d : (i + 1) * d]),
                "TPU_CHIPS_PER_PROCESS_BOUNDS": _CHIP_BOUNDS[d],
                "TPU_PROCESS_BOUNDS": "1,1,1",
                "TPU_PROCESS_PORT": str(port),
                "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
                "CLOUD_TPU_TASK_ID": "0",
                "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
            }
        )
    return out

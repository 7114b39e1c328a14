"""Buffers that large received messages land in, kept for the next message of the size.

A large message's frames are received into a fresh buffer that becomes the arrays' memory
(see :func:`aligned_frames`). Fresh memory is dear: the kernel faults in and zeroes
every page at first touch, and in a virtual machine that reports freed memory to its host
(this development machine's Firecracker guest does, in 8 MiB blocks) the host faults it
in again as well. A 256 MiB transfer took 35-55 ms into memory a process had just used
and 100-600 ms into memory that had been handed back. Training moves arrays of the same
sizes step after step, so a buffer whose arrays are all gone is kept for the next message
of its size, up to ``max_bytes`` of them; beyond that it is freed as before.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import numpy as np


class ReceivePool:
    """Free receive buffers by size, up to ``max_bytes`` of them (0: keep none)."""

    def __init__(self, max_bytes: int = 0) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[np.ndarray]] = {}
        self._kept = 0
        self.reused = 0  # buffers handed out again: what the pool saved

    def take(self, nbytes: int) -> np.ndarray:
        """A ``uint8`` array of ``nbytes``, from a kept buffer when there is one. Its
        memory goes back to the pool once the array, and everything made from it
        (memoryviews, NumPy arrays over them, device buffers aliasing them), is gone."""
        if self.max_bytes <= 0 or nbytes > self.max_bytes:
            return np.empty(nbytes, np.uint8)
        backing = None
        with self._lock:
            stack = self._free.get(nbytes)
            if stack:
                backing = stack.pop()
                self._kept -= nbytes
                self.reused += 1
        if backing is None:
            backing = np.empty(nbytes, np.uint8)
        view = backing[:]
        weakref.finalize(view, self._give_back, backing)
        return view

    def _give_back(self, backing: np.ndarray) -> None:
        n = backing.nbytes
        with self._lock:
            if self._kept + n <= self.max_bytes:
                self._free.setdefault(n, []).append(backing)
                self._kept += n


POOL = ReceivePool()

# Frame alignment of received messages that carry arrays (see aligned_frames).
ALIGN = 64


def aligned_frames(lens: Sequence[int]) -> list[memoryview]:
    """Empty frames of ``lens`` bytes in one fresh buffer, each starting on a multiple
    of ``ALIGN`` bytes.

    XLA's CPU client places a host array on a device without copying it when the array
    starts on such a boundary (and copies it otherwise): a received array kept in its
    own aligned frame becomes a device buffer at no cost. The buffer is taken again (see
    :class:`ReceivePool`) only once every array over it is gone, so those arrays never change
    under a device. A NumPy buffer, not a bytearray: it is not zeroed first, and large
    ones are backed by huge pages (measured 2.5x the bandwidth of a bytearray).
    """
    offsets, end = [], 0
    for length in lens:
        offsets.append(end)
        end += -(-length // ALIGN) * ALIGN
    raw = POOL.take(end + ALIGN)
    base = -raw.ctypes.data % ALIGN
    whole = memoryview(raw.data)
    return [whole[base + at : base + at + n] for at, n in zip(offsets, lens, strict=True)]

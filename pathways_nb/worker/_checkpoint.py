"""A host's side of ``pw.save`` and ``pw.restore``: an array written to, or read from, a
``.npy`` file on the host's own filesystem by the host that holds it, so a checkpoint's
bytes never pass through the client (whose memory need not hold the model).

A file is NumPy's own format, readable without pathways_nb (``np.load``); JAX's types
that NumPy does not know (bfloat16, float8, ...) are stored as raw bytes of their size
(NumPy's ``V2`` for bfloat16) and read back as the type the restore names. A PRNG key
array is stored as its key data.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pathways_nb._core import RemoteError, decode_dtype
from pathways_nb.worker._answers import ToClient, host_payload
from pathways_nb.worker._errors import to_remote
from pathways_nb.worker._store import Entry, ObjectStore

# Outcomes of background writes a host keeps until their clients ask for them.
KEPT_WRITES = 4096

# Store a put's value (its client, header, value): True once stored (see the host's
# _store_or_park); and make the put's handle hold an error, telling its client.
StorePut = Callable[[bytes, dict[str, Any], np.ndarray], bool]
PutFailed = Callable[[bytes, dict[str, Any], Exception, str], None]


class Checkpoints:
    """A host's answers to ``save`` and ``load``, each done on ``pool`` so that no loop
    of the host waits on the disk."""

    def __init__(
        self,
        host: str,
        store: ObjectStore,
        pool: concurrent.futures.Executor,
        to_client: ToClient,
        store_put: StorePut,
        put_failed: PutFailed,
        root: str = "",
    ) -> None:
        self.host = host
        self.root = root
        self._store = store
        self._pool = pool
        self._to_client = to_client
        self._store_put = store_put
        self._put_failed = put_failed
        # Background writes by (handle, path), until their client asks how they ended.
        self._writes: collections.OrderedDict[tuple[int, str], concurrent.futures.Future[None]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def save(self, identity: bytes, h: dict[str, Any]) -> None:
        """Copy the array into host memory once it is computed and write it to
        ``h["path"]``; answer the client once written or, with ``background``, once
        copied (the write's outcome then waits for a ``saved`` request). A failed
        program's array is answered with its own error."""
        rid, path, handle = h["rid"], h["path"], h["handle"]
        background = h.get("background") is True

        def answer(err: RemoteError | None) -> None:
            reply = {"t": "reply", "rid": rid}
            if err is not None:
                reply = {"t": "failed", "rid": rid, "error": err.to_dict()}
            self._to_client(identity, reply, ())

        def copy_and_write(entry: Entry) -> None:
            if entry.error is not None:
                answer(entry.error)
                return
            sname = entry.origin[1]
            try:
                target = self.confined(path)
                _, arr = host_payload(entry.value)  # the copy: later launches may donate
            except Exception as exc:
                answer(to_remote(exc, "invalid", program="save", slice=sname, host=self.host))
                return
            outcome: concurrent.futures.Future[None] = concurrent.futures.Future()
            if background:
                with self._lock:
                    self._writes[(handle, path)] = outcome
                    while len(self._writes) > KEPT_WRITES:
                        self._writes.popitem(last=False)
                answer(None)  # copied: the client may go on
            err = None
            try:
                write_array(target, arr)
            except Exception as exc:
                err = to_remote(exc, "invalid", program="save", slice=sname, host=self.host)
            if not background:
                answer(err)
            elif err is not None:
                outcome.set_exception(err)
            else:
                outcome.set_result(None)

        def ready(entry: Entry) -> None:
            self._pool.submit(copy_and_write, entry)

        self._store.when_ready(handle, ready)

    def saved(self, identity: bytes, h: dict[str, Any]) -> None:
        """Answer once the background write of ``h["handle"]`` to ``h["path"]`` is
        done, with its error if it failed. Each outcome is answered once."""
        rid = h["rid"]
        with self._lock:
            outcome = self._writes.pop((h["handle"], h["path"]), None)
        if outcome is None:
            err = to_remote(
                LookupError(
                    f"no background save of array {h['handle']:#x} to {h['path']} is known "
                    f"here (each is answered once, and the last {KEPT_WRITES} kept)"
                ),
                "invalid",
                program="save",
                slice="",
                host=self.host,
            )
            self._to_client(identity, {"t": "failed", "rid": rid, "error": err.to_dict()}, ())
            return

        def answer(f: concurrent.futures.Future[None]) -> None:
            exc = f.exception()
            if isinstance(exc, RemoteError):
                reply = {"t": "failed", "rid": rid, "error": exc.to_dict()}
            else:
                reply = {"t": "reply", "rid": rid}
            self._to_client(identity, reply, ())

        outcome.add_done_callback(answer)

    def load(self, identity: bytes, h: dict[str, Any]) -> None:
        """Read the array at ``h["path"]`` and store it as a put's value; answer the
        client once it is stored, or with why it is not."""

        def read_and_store() -> None:
            try:
                dtype = decode_dtype(h["dtype"])
                arr = read(self.confined(h["path"]), tuple(int(n) for n in h["shape"]), dtype)
                if self._store_put(identity, h, arr):
                    self._to_client(identity, {"t": "reply", "rid": h["rid"]}, ())
            except Exception as exc:
                self._put_failed(identity, h, exc, "restore")

        self._pool.submit(read_and_store)

    def confined(self, path: str) -> str:
        """``path``, if this host may write and read it: anywhere without a checkpoint
        root, under it (symbolic links resolved) with one; PermissionError otherwise."""
        if not os.path.isabs(path):
            raise ValueError(f"a checkpoint's path is absolute; got {path!r}")
        if self.root:
            root = os.path.realpath(self.root)
            if os.path.commonpath([os.path.realpath(path), root]) != root:
                raise PermissionError(
                    f"{path} is outside this cluster's checkpoint folder {self.root} "
                    "(PATHWAYS_CHECKPOINT_ROOT, set where the hosts run): save and "
                    "restore under it"
                )
        return path


def write_array(path: str, arr: np.ndarray) -> None:
    """Write ``arr`` (a copy of an array of this host's devices) to ``path``, whole or
    not at all: a reader never finds half a file, and an earlier checkpoint there stays
    until the new one is complete."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            np.save(f, arr, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def read(path: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """The array in the ``.npy`` file at ``path``, which must hold ``shape`` and
    ``dtype`` (or raw bytes of ``dtype``'s size, as :func:`write` stores JAX's own
    types); ValueError saying what the file holds otherwise."""
    # Mapped first: a file of another shape is refused before its bytes are read. The
    # value is then copied into memory of the host's own, never left aliasing the file
    # (a file rewritten in place under a mapped array would crash the host).
    mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    found = mapped.dtype
    if found != dtype and found.kind == "V" and found.itemsize == dtype.itemsize:
        mapped = mapped.view(dtype)
    if mapped.shape != shape or mapped.dtype != dtype:
        raise ValueError(
            f"{path} holds {found}{list(mapped.shape)}, where the array to restore is "
            f"{dtype}{list(shape)}: restore into arrays shaped as the ones saved there"
        )
    return np.array(mapped, order="C")

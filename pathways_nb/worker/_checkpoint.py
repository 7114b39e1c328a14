"""A host's side of ``pw.save`` and ``pw.restore``: an array written to, or read from, a
``.npy`` file on the host's own filesystem by the host that holds it, so a checkpoint's
bytes never pass through the client (whose memory need not hold the model).

A file is NumPy's own format, readable without pathways_nb (``np.load``); JAX's types
that NumPy does not know (bfloat16, float8, ...) are stored as raw bytes of their size
(NumPy's ``V2`` for bfloat16) and read back as the type the restore names. A PRNG key
array is stored as its key data.

A save is staged: each file is written under a pending name (``w.npy.<stage>.pending``)
and renamed into place only when the client, which knows that every array of the tree was
written, says so (``commit_save``); a save that fails anywhere has its pending files
removed instead, so a checkpoint already in the folder is never left half replaced.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pathways_nb._core import RemoteError, decode_dtype
from pathways_nb.worker._answers import ToClient, host_payload
from pathways_nb.worker._errors import to_remote
from pathways_nb.worker._store import Entry, ObjectStore

# Outcomes of background writes a host keeps until their clients ask for them.
KEPT_WRITES = 4096
# Saves a host keeps staged until their clients commit or discard them (a client that
# died before either leaves its pending files behind, never read by a restore).
KEPT_STAGES = 1024
# A stage is the client's random name for one save (``secrets.token_hex(8)``).
_STAGE = re.compile(r"[0-9a-f]{16}")


@dataclass
class _Stage:
    """One save's files on this host: who wrote them, and whether it was discarded
    (a write that ends after that removes its own file)."""

    tenant: int
    written: list[str] = field(default_factory=list)  # the files' own paths
    discarded: bool = False


def pending_path(path: str, stage: str) -> str:
    """Where a staged save writes the file that becomes ``path`` once committed."""
    return f"{path}.{stage}.pending"


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
        self._stages: collections.OrderedDict[str, _Stage] = collections.OrderedDict()

    def save(self, identity: bytes, h: dict[str, Any], tenant: int) -> None:
        """Copy the array into host memory once it is computed and write it to
        ``h["path"]``; answer the client once written or, with ``background``, once
        copied (the write's outcome then waits for a ``saved`` request). A failed
        program's array is answered with its own error."""
        rid, path, handle, stage = h["rid"], h["path"], h["handle"], h["stage"]
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
                self._stage(stage, tenant)
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
                write_array(pending_path(target, stage), arr)
                self._written(stage, target)
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

    def _stage(self, stage: Any, tenant: int) -> str:
        """``stage``, checked and noted as ``tenant``'s; ValueError if it is not one."""
        if type(stage) is not str or not _STAGE.fullmatch(stage):
            raise ValueError(f"a save's stage is 16 hexadecimal digits; got {stage!r}")
        with self._lock:
            known = self._stages.get(stage)
            if known is None:
                self._keep_stage(stage, _Stage(tenant))
            elif known.tenant != tenant:
                raise PermissionError(f"the save {stage} is another client's")
            elif known.discarded:
                raise RuntimeError(f"the save {stage} was discarded before this file")
        return stage

    def _keep_stage(self, stage: str, record: _Stage) -> None:
        self._stages[stage] = record
        while len(self._stages) > KEPT_STAGES:
            self._stages.popitem(last=False)

    def _written(self, stage: str, path: str) -> None:
        """Note the file for ``path`` written, or remove it if its save was discarded
        meanwhile."""
        with self._lock:
            known = self._stages.get(stage)
            if known is not None and not known.discarded:
                known.written.append(path)
                return
        with contextlib.suppress(OSError):
            os.remove(pending_path(path, stage))

    def commit(self, identity: bytes, h: dict[str, Any], tenant: int) -> None:
        """Rename the files of the save ``h["stage"]`` into place (``keep``), or remove
        them; answer once done. A commit names how many files the client had written
        here, so a host that lost some (restarted since) refuses rather than commit
        part of a checkpoint."""
        rid, stage, keep, count = h["rid"], h["stage"], h["keep"] is True, h["count"]

        def end() -> None:
            try:
                with self._lock:
                    known = self._stages.get(stage)
                    if known is None and not keep and _STAGE.fullmatch(stage):
                        # Discarded before any of its writes began here: none will.
                        known = _Stage(tenant)
                        self._keep_stage(stage, known)
                    if known is None or known.tenant != tenant or known.discarded:
                        raise LookupError(
                            f"no save {stage!r} of this client is staged on this host (it "
                            "was committed or discarded already, or the host restarted "
                            "since): save the checkpoint again"
                        )
                    if keep and len(known.written) != count:
                        raise LookupError(
                            f"the save {stage} wrote {len(known.written)} of its {count} "
                            "files on this host: save the checkpoint again"
                        )
                    # Kept, marked, so that a write of it still to come removes itself.
                    known.discarded = True
                    written, known.written = known.written, []
                try:
                    if keep:
                        _commit(written, stage)
                finally:
                    for path in written:  # all renamed, or the save discarded
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(pending_path(path, stage))
                reply: dict[str, Any] = {"t": "reply", "rid": rid}
            except Exception as exc:
                err = to_remote(exc, "invalid", program="save", slice="", host=self.host)
                reply = {"t": "failed", "rid": rid, "error": err.to_dict()}
            self._to_client(identity, reply, ())

        self._pool.submit(end)

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


def _commit(written: list[str], stage: str) -> None:
    """Rename a save's pending files into place; checked first, so that what can be
    foreseen does not leave the checkpoint committed in part."""
    pending = [pending_path(p, stage) for p in written]
    for staged, target in zip(pending, written, strict=True):
        if os.path.isdir(target):
            raise IsADirectoryError(
                f"cannot save {target}: a folder is in its place; move it and save again"
            )
        if not os.path.isfile(staged):
            raise FileNotFoundError(
                f"cannot save {target}: the file written for it ({staged}) is gone; save again"
            )
    for staged, target in zip(pending, written, strict=True):
        os.replace(staged, target)


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


_NPY_MAGIC = b"\x93NUMPY"


def read(path: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """The array in the ``.npy`` file at ``path``, which must hold ``shape`` and
    ``dtype`` (or raw bytes of ``dtype``'s size, as :func:`write` stores JAX's own
    types); ValueError saying what the file holds otherwise."""
    # Mapped first: a file of another shape is refused before its bytes are read. The
    # value is then copied into memory of the host's own, never left aliasing the file
    # (a file rewritten in place under a mapped array would crash the host).
    with open(path, "rb") as f:
        head = f.read(len(_NPY_MAGIC))
    if head != _NPY_MAGIC:
        # NumPy takes any other file for a pickle, and suggests loading it unsafely.
        raise ValueError(
            f"{path} is not a NumPy .npy file (it begins {head!r}): restore from a folder "
            "pw.save wrote, whose files np.save's format holds"
        )
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

"""``pw.save`` and ``pw.restore``: checkpoints written and read by the hosts themselves.

Each array of a pytree goes to a ``.npy`` file of its own in one folder, written by the
host that holds it and read back by the host of the slice it is restored onto: the
bytes never pass through the client, so a notebook checkpoints a model larger than its
own memory, as Orbax does from each worker of a multi-host JAX program. The folder is a
path on the hosts' filesystem (this machine's for a ``pw.LocalCluster``; a filesystem
every host mounts on a cluster of several machines). The files are NumPy's own:
``np.load`` reads them without pathways_nb.

A file is named by its leaf's path in the tree (``params/w0`` -> ``params.w0.npy``), so
the tree given to ``restore`` names the files to read and gives each array's shape,
dtype, slice and layout: the arrays of the state being trained, or
``jax.ShapeDtypeStruct`` s (from ``jax.eval_shape``) restored onto ``slice=``.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import jax
import numpy as np
from jax.sharding import PartitionSpec

from pathways_nb._core import encode_dtype, encode_mesh, encode_spec
from pathways_nb.client._arrays import _LOCAL_LID
from pathways_nb.client._jit import _is_remote, struct_spec
from pathways_nb.client._remote import RemoteArray
from pathways_nb.client._waiting import block

if TYPE_CHECKING:
    from pathways_nb.client._session import Client
    from pathways_nb.client._slice import VirtualSlice

# Seconds a failed save waits for its hosts to remove its pending files before raising.
_DISCARD_WAIT = 30.0


@overload
def save(path: str | os.PathLike[str], tree: Any, *, wait: Literal[True] = ...) -> list[str]: ...
@overload
def save(path: str | os.PathLike[str], tree: Any, *, wait: Literal[False]) -> Saving: ...
def save(path: str | os.PathLike[str], tree: Any, *, wait: bool = True) -> list[str] | Saving:
    """Write every RemoteArray of ``tree`` into the folder ``path`` on the hosts'
    filesystem, each by the host that holds it; return the files' names. Returns once
    all are written (each waits for the program that makes it), or raises the first
    failure: a failed program's error, or the host's when it cannot write::

        pw.save("/ckpt/step_100", {"params": params, "opt": opt_state})
        state = pw.restore("/ckpt/step_100", {"params": params, "opt": opt_state})

    With ``wait=False`` it returns once every array is computed and copied into its
    host's memory, as Orbax's asynchronous checkpointing does: the files are written
    in the background while training goes on (the next step may donate the arrays),
    and the :class:`Saving` returned says how the writes ended (``.result()``).

    A checkpoint is replaced whole: each host writes its files under pending names
    first, and they are renamed into place only once every array of ``tree`` is written,
    so a save that fails (a failed program, a full disk, a lost host) leaves the
    checkpoint already in the folder as it was, and its own pending files removed. Other
    files in the folder are left alone. ``path`` must be absolute: the hosts resolve it,
    from working directories of their own.
    """
    folder = _folder(path)
    named = _named_leaves(tree, "pw.save")
    for name, x in named:
        if not isinstance(x, RemoteArray):
            raise TypeError(
                f"pw.save writes RemoteArrays; the leaf {name!r} is a {type(x).__name__}. "
                "Put it on a slice first (vs.put), or keep it out of the tree"
            )
        x._check_usable()
    staged = _Staged(secrets.token_hex(8))
    futures: list[concurrent.futures.Future[Any]] = []
    asks: list[tuple[Client, str, dict[str, Any]]] = []
    for name, x in named:
        client = x._client
        client._check_open()
        header: dict[str, Any] = {
            "t": "save",
            "handle": x.handle,
            "path": f"{folder}/{name}.npy",
            "stage": staged.stage,
        }
        if not wait:
            header["background"] = True
            asks.append((client, x.slice.data_address, {**header, "t": "saved"}))
        futures.append(client._io.host_request(x.slice.data_address, dict(header)))
        staged.add(client, x.slice.data_address)
    clients = [x._client for _, x in named]
    try:
        _wait(futures, clients)
    except Exception:
        # Every write has ended: the failed save's pending files are gone when it raises.
        concurrent.futures.wait(staged.end(keep=False), timeout=_DISCARD_WAIT)
        raise
    except BaseException:  # interrupted: the writes still going remove their own files
        staged.end(keep=False)
        raise
    names = [f"{name}.npy" for name, _ in named]
    if not wait:
        return Saving(names, asks, staged)
    _wait(staged.end(keep=True), clients)
    return names


class _Staged:
    """The hosts that write one save's files under pending names (see
    ``worker/_checkpoint``), and how many each: a commit renames them into place, a
    discard removes them."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self._hosts: dict[tuple[int, str], tuple[Client, str, int]] = {}

    def add(self, client: Client, address: str) -> None:
        _, _, count = self._hosts.get((id(client), address), (client, address, 0))
        self._hosts[(id(client), address)] = (client, address, count + 1)

    def end(self, keep: bool) -> list[concurrent.futures.Future[Any]]:
        """Ask every host to commit (``keep``) or discard its files; the answers."""
        futures: list[concurrent.futures.Future[Any]] = []
        for client, address, count in self._hosts.values():
            header = {"t": "commit_save", "stage": self.stage, "keep": keep, "count": count}
            futures.append(client._io.host_request(address, header))
        return futures


class Saving:
    """A checkpoint :func:`save` is writing in the background: its arrays are copied
    on their hosts already; :meth:`result` waits for the files."""

    def __init__(
        self, names: list[str], asks: list[tuple[Client, str, dict[str, Any]]], staged: _Staged
    ) -> None:
        self.names = names
        self._clients = [c for c, _, _ in asks]
        self._outcome: BaseException | None = None
        self._over = False
        # Committed in the background as soon as every write has ended, whether or not
        # anyone asks for the result: the client's IO thread runs the callbacks.
        self._ended: concurrent.futures.Future[None] = concurrent.futures.Future()
        writes: list[concurrent.futures.Future[Any]] = [
            c._io.host_request(address, dict(h)) for c, address, h in asks
        ]
        _when_all(writes, lambda: self._commit(writes, staged))

    def _commit(self, writes: list[concurrent.futures.Future[Any]], staged: _Staged) -> None:
        failed = _first_failure(writes)
        ends = staged.end(keep=failed is None)
        if failed is not None:
            self._ended.set_exception(failed)
            return

        def over() -> None:
            bad = _first_failure(ends)
            if bad is None:
                self._ended.set_result(None)
            else:
                self._ended.set_exception(bad)

        _when_all(ends, over)

    def __repr__(self) -> str:
        state = "written" if self._over and self._outcome is None else "writing"
        if self._outcome is not None:
            state = "failed"
        return f"<pw.Saving of {len(self.names)} files, {state}>"

    def result(self, timeout: float | None = None) -> list[str]:
        """The files' names once all are written; raises the first write's failure, or
        TimeoutError after ``timeout`` seconds (ask again later: nothing is lost)."""
        if not self._over:
            deadline = None if timeout is None else time.monotonic() + timeout
            block([self._ended], self._clients, deadline=deadline)
            if not self._ended.done():
                raise TimeoutError(
                    f"the checkpoint's {len(self.names)} files were not written within {timeout} s"
                )
            self._over = True
            self._outcome = self._ended.exception()
        if self._outcome is not None:
            raise self._outcome
        return list(self.names)


def restore(path: str | os.PathLike[str], like: Any, *, slice: VirtualSlice | None = None) -> Any:
    """The arrays :func:`save` wrote into ``path``, as a tree shaped like ``like``.

    Each leaf of ``like`` names its file and says what to make of it: a RemoteArray
    (the state being trained, even one lost with its host) is restored with its shape,
    dtype and layout onto its own slice, or onto ``slice=`` when given; a
    ``jax.ShapeDtypeStruct`` onto ``slice=``, laid out by its ``sharding``'s
    PartitionSpec (replicated without one). Each file is read by the host of the slice
    it is restored onto; returns once every array is in place, or raises the first
    failure (a missing file, or one that holds another shape or dtype).
    """
    folder = _folder(path)
    named = _named_leaves(like, "pw.restore")
    plans = [(name, *_target(name, leaf, slice)) for name, leaf in named]
    for _, vs, shape, _, spec in plans:  # all checked before any host is asked
        vs._client._check_open()
        vs._ready_for_work()  # a lost slice: once it is remapped
        vs.check_spec(spec, shape)
    futures: list[concurrent.futures.Future[Any]] = []
    made: list[RemoteArray] = []
    clients: list[Client] = []
    for name, vs, shape, dtype, spec in plans:
        client = vs._client
        wire_shape, wire_dtype = shape, dtype
        header: dict[str, Any] = {}
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype))
            wire_shape, wire_dtype = data.shape, data.dtype
            header["key_impl"] = _key_impl(shape, dtype)
        handle = client._ids.next()
        header.update(
            {
                "t": "load",
                "handle": handle,
                "path": f"{folder}/{name}.npy",
                "shape": list(wire_shape),
                "dtype": encode_dtype(np.dtype(wire_dtype)),
                "spec": encode_spec(spec),
                "devices": vs.devices,
                "mesh": encode_mesh(vs.mesh_shape),
            }
        )
        nbytes = int(np.prod(wire_shape)) * np.dtype(wire_dtype).itemsize
        client._io.deletes_now()
        client._io.send_batched(
            {"t": "put_note", "handle": handle, "slice": vs.id, "nbytes": nbytes}
        )
        futures.append(client._io.host_request(vs.data_address, header))
        made.append(client._put_array(vs, handle, shape, dtype, spec, _LOCAL_LID))
        clients.append(client)
    try:
        _wait(futures, clients)
    except BaseException:
        for x in made:
            x.delete()
        raise
    for x in made:
        x._ready = True
    return jax.tree.unflatten(jax.tree.structure(like, is_leaf=_is_leaf), made)


def _target(
    name: str, leaf: Any, slice: VirtualSlice | None
) -> tuple[VirtualSlice, tuple[int, ...], Any, PartitionSpec]:
    """Where and how the leaf ``name`` is restored: slice, shape, dtype, layout."""
    if isinstance(leaf, RemoteArray):
        return slice or leaf.slice, leaf.shape, leaf.dtype, leaf.spec
    if isinstance(leaf, jax.ShapeDtypeStruct):
        if slice is None:
            raise ValueError(
                f"the leaf {name!r} is a ShapeDtypeStruct, which names no slice: give "
                "pw.restore(..., slice=vs)"
            )
        return slice, tuple(leaf.shape), leaf.dtype, struct_spec(leaf) or PartitionSpec()
    raise TypeError(
        f"pw.restore takes a tree of RemoteArrays or jax.ShapeDtypeStructs saying what "
        f"to restore; the leaf {name!r} is a {type(leaf).__name__}"
    )


def _is_leaf(x: Any) -> bool:
    return _is_remote(x) or isinstance(x, jax.ShapeDtypeStruct)


def _named_leaves(tree: Any, what: str) -> list[tuple[str, Any]]:
    """Each leaf with the name of its file: its path in the tree, its keys joined by
    dots, each cut to the characters a file name takes everywhere."""
    with_paths, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_leaf)
    if not with_paths:
        raise ValueError(f"{what} was given a tree without arrays: {tree!r}")
    out: list[tuple[str, Any]] = []
    seen: dict[str, str] = {}
    for keys, leaf in with_paths:
        parts = [_key_text(k) for k in keys]
        name = ".".join(re.sub(r"[^A-Za-z0-9_-]", "_", p) for p in parts) or "array"
        shown = jax.tree_util.keystr(keys) or "(the tree itself)"
        if name in seen:
            raise ValueError(
                f"{what}: the leaves {seen[name]} and {shown} would share the file "
                f"{name}.npy; rename one of their keys"
            )
        seen[name] = shown
        out.append((name, leaf))
    return out


def _key_text(key: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _key_impl(shape: tuple[int, ...], dtype: Any) -> str:
    """The PRNG implementation's name for keys of ``dtype``, read from a trace."""
    found: list[str] = []
    jax.eval_shape(
        lambda k: found.append(str(jax.random.key_impl(k))), jax.ShapeDtypeStruct(shape, dtype)
    )
    return found[0]


def _folder(path: Any) -> str:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path is a folder on the hosts' filesystem; got {type(path).__name__}")
    folder = os.fspath(path)
    if not os.path.isabs(folder):
        raise ValueError(
            f"path is absolute, as the hosts resolve it from working directories of their "
            f"own; got {folder!r} (os.path.abspath({folder!r}) is this machine's)"
        )
    return folder.rstrip("/") or "/"


def _when_all(futures: list[concurrent.futures.Future[Any]], then: Callable[[], None]) -> None:
    """Call ``then()`` once, on the thread that finishes the last of ``futures``."""
    left = [len(futures)]
    lock = threading.Lock()

    def one(_: concurrent.futures.Future[Any]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            then()

    if not futures:
        then()
    for f in futures:
        f.add_done_callback(one)


def _wait(futures: list[concurrent.futures.Future[Any]], clients: Sequence[Client]) -> None:
    """Wait for every host's answer; raise the first failure."""
    block(futures, clients)
    exc = _first_failure(futures)
    if exc is not None:
        raise exc


def _first_failure(futures: list[concurrent.futures.Future[Any]]) -> BaseException | None:
    """The error of the first of ``futures`` (all done) that failed, if any."""
    return next((e for f in futures if (e := f.exception()) is not None), None)

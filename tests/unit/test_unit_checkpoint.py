"""A host's staged saves: files written under pending names, renamed into place or removed
only when their client says so, and never by another client."""

from __future__ import annotations

import concurrent.futures
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from pathways_nb.worker._checkpoint import Checkpoints, pending_path
from pathways_nb.worker._store import ObjectStore

STAGE = "0123456789abcdef"
OWNER, OTHER = 1, 2


class _Host:
    """A host's checkpoints with its object store, and the answers it sends."""

    def __init__(self, pool: concurrent.futures.Executor) -> None:
        self.store = ObjectStore()
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self.checkpoints = Checkpoints(
            "host0",
            self.store,
            pool,
            lambda _identity, reply, _bufs: self.answers.put(reply),
            lambda *_: True,
            lambda *_: None,
        )
        self._rid = 0

    def _next(self) -> int:
        self._rid += 1
        return self._rid

    def save(self, handle: int, path: Path, stage: str = STAGE, tenant: int = OWNER) -> dict:
        self.store.set(handle, jnp.full(3, float(handle)), 12, origin=("f", "s1"), ready=True)
        h = {"rid": self._next(), "handle": handle, "path": str(path), "stage": stage}
        self.checkpoints.save(b"c", h, tenant)
        return self.answers.get(timeout=30)

    def commit(self, keep: bool, count: int, tenant: int = OWNER, stage: str = STAGE) -> dict:
        h = {"rid": self._next(), "stage": stage, "keep": keep, "count": count}
        self.checkpoints.commit(b"c", h, tenant)
        return self.answers.get(timeout=30)


@pytest.fixture
def host() -> Iterator[_Host]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        yield _Host(pool)


def _message(answer: dict[str, Any]) -> str:
    assert answer["t"] == "failed", answer
    return str(answer["error"]["message"])


def test_files_appear_only_when_committed(host: _Host, tmp_path: Path) -> None:
    old = tmp_path / "a.npy"
    np.save(old, np.zeros(3, np.float32))
    assert host.save(1, old)["t"] == "reply"
    assert host.save(2, tmp_path / "b.npy")["t"] == "reply"
    # Written, not yet the checkpoint's: the earlier file is still the one there.
    np.testing.assert_array_equal(np.load(old), np.zeros(3))
    assert not (tmp_path / "b.npy").exists()
    assert np.load(pending_path(str(old), STAGE)).tolist() == [1.0, 1.0, 1.0]
    assert host.commit(keep=True, count=2)["t"] == "reply"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), np.full(3, 2.0))
    assert "committed or discarded already" in _message(host.commit(keep=True, count=2))


def test_a_discarded_save_leaves_nothing_and_the_old_files_alone(
    host: _Host, tmp_path: Path
) -> None:
    old = tmp_path / "a.npy"
    np.save(old, np.zeros(3, np.float32))
    host.save(1, old)
    assert host.commit(keep=False, count=1)["t"] == "reply"
    assert [p.name for p in tmp_path.iterdir()] == ["a.npy"]
    np.testing.assert_array_equal(np.load(old), np.zeros(3))
    # A write of the save that comes after its discard is refused, and leaves no file.
    assert "was discarded" in _message(host.save(2, tmp_path / "b.npy"))
    assert [p.name for p in tmp_path.iterdir()] == ["a.npy"]


def test_a_discard_before_any_write_stops_the_writes_to_come(host: _Host, tmp_path: Path) -> None:
    assert host.commit(keep=False, count=1)["t"] == "reply"
    assert "was discarded" in _message(host.save(1, tmp_path / "a.npy"))
    assert list(tmp_path.iterdir()) == []


def test_a_commit_short_of_files_is_refused(host: _Host, tmp_path: Path) -> None:
    host.save(1, tmp_path / "a.npy")
    assert "wrote 1 of its 2 files" in _message(host.commit(keep=True, count=2))
    assert not (tmp_path / "a.npy").exists()  # nothing committed in part
    assert host.commit(keep=False, count=2)["t"] == "reply"
    assert list(tmp_path.iterdir()) == []


def test_another_client_can_neither_commit_nor_join_a_save(host: _Host, tmp_path: Path) -> None:
    host.save(1, tmp_path / "a.npy")
    assert "no save" in _message(host.commit(keep=True, count=1, tenant=OTHER))
    assert "no save" in _message(host.commit(keep=False, count=1, tenant=OTHER))
    assert "another client's" in _message(host.save(2, tmp_path / "b.npy", tenant=OTHER))
    assert host.commit(keep=True, count=1)["t"] == "reply"  # the owner's save is whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy"]


@pytest.mark.parametrize("stage", ["", "../../etc", "0123456789ABCDEF", "0" * 64])
def test_a_stage_that_is_not_one_is_refused(host: _Host, tmp_path: Path, stage: str) -> None:
    assert "16 hexadecimal digits" in _message(host.save(1, tmp_path / "a.npy", stage=stage))
    assert list(tmp_path.iterdir()) == []
    assert "no save" in _message(host.commit(keep=True, count=1, stage=stage))


def test_a_commit_that_cannot_replace_a_file_commits_none(host: _Host, tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(3, np.float32))
    (tmp_path / "b.npy").mkdir()
    host.save(1, tmp_path / "a.npy")
    host.save(2, tmp_path / "b.npy")
    assert "a folder is in its place" in _message(host.commit(keep=True, count=2))
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.zeros(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npy"]  # no pending

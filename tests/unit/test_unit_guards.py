"""The host's guards against launches that would end its process: memory and donation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import psutil
import pytest

from pathways_nb._core import (
    CHECK_FROM,
    RemoteError,
    ResourceExhaustedError,
    check_fits,
    machine_memory,
    on_this_machine,
)
from pathways_nb.worker._guards import MemoryGuard, check_donation, program_bytes


def test_launches_running_hold_their_bytes_until_released() -> None:
    guard = MemoryGuard("host-a", enabled=True)
    big = int(psutil.virtual_memory().available * 0.6)
    guard.reserve(big, "first", "s1")
    assert guard.held == big
    # The machine's free memory does not show the first launch's outputs yet: the guard
    # counts them, so a second launch as large is refused while the first runs.
    with pytest.raises(ResourceExhaustedError, match="launches still running will take") as info:
        guard.reserve(big, "second", "s1")
    assert "'second' on slice 's1'" in str(info.value) and "host-a" in str(info.value)
    assert guard.refused == 1 and guard.held == big
    guard.release(big)
    guard.reserve(big, "second", "s1")
    guard.release(big)
    assert guard.held == 0


def test_a_disabled_guard_holds_and_refuses_nothing() -> None:
    guard = MemoryGuard("host-a", enabled=False)
    guard.reserve(10 * psutil.virtual_memory().total, "huge", "s1")
    guard.release(10 * psutil.virtual_memory().total)
    assert guard.held == 0 and guard.refused == 0


def test_program_bytes_counts_every_device_copy_and_not_donated_outputs() -> None:
    def f(x: jax.Array) -> jax.Array:
        return jnp.zeros((256, 1024)) + x.sum()

    compiled = jax.jit(f).lower(jnp.ones(4)).compile()
    assert program_bytes(compiled, 1) >= 256 * 1024 * 4
    assert program_bytes(compiled, 4) == 4 * program_bytes(compiled, 1)
    donating = jax.jit(lambda x: x * 2, donate_argnums=0).lower(jnp.ones((256, 1024))).compile()
    assert program_bytes(donating, 1) < 256 * 1024 * 4  # the output reuses the input
    assert program_bytes(object(), 4) == 0  # no memory analysis: nothing is checked


def test_a_donated_input_passed_again_fails_and_repeated_inputs_alone_do_not() -> None:
    check_donation([1, 1, 2], ())  # the same array twice, nothing donated: fine
    check_donation([1, 2, 2], (0,))  # the donated one appears once: fine
    with pytest.raises(RemoteError, match="donated and passed 2 times") as info:
        check_donation([1, 2, 1], (2,))
    assert info.value.kind == "invalid"


def test_moves_this_machine_cannot_take_are_refused_and_small_ones_never_read_it() -> None:
    total = machine_memory().total
    with pytest.raises(ResourceExhaustedError, match=r"moving it needs .* GiB more") as info:
        check_fits(2 * total, "moving it", "Do less.", program="p", slice="s1", host="h")
    assert (info.value.program, info.value.slice, info.value.host) == ("p", "s1", "h")
    assert "available of" in str(info.value) and str(info.value).count("Do less.") == 1
    check_fits(CHECK_FROM - 1, "a small move", "")  # below the size that is checked
    assert on_this_machine("ipc://@pathways-1-2") and on_this_machine("tcp://127.0.0.1:9")
    assert not on_this_machine("tcp://10.0.0.7:8786")
    # A move to a host: checked where that host is on this machine, not elsewhere.
    with pytest.raises(ResourceExhaustedError, match="moving it"):
        check_fits(2 * total, "moving it", "", to="ipc://@pathways-1-2")
    check_fits(2 * total, "moving it", "", to="tcp://10.0.0.7:8786")

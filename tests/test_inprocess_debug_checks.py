"""``jax_debug_nans`` and ``jax_debug_infs`` set in the client check every launch's
outputs on its host, as ``jax.jit`` checks its own; without them nothing is checked."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw


@pytest.fixture
def vs(client: pw.Client) -> Iterator[pw.VirtualSlice]:
    s = client.allocate({"data": 2})
    yield s
    s.release()


def test_a_nan_output_fails_the_launch_and_its_consumers(vs: pw.VirtualSlice) -> None:
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))
    log = pw.jit(lambda v: jnp.log(v - 2.0), name="shifted_log")
    double = pw.jit(lambda v: v * 2, name="double")
    with jax.debug_nans(True):
        y = log(x)
        z = double(y)
        w = double(x)
    with pytest.raises(pw.NonFiniteError) as info:
        y.fetch()
    err = info.value
    # As jax.jit's check raises: except FloatingPointError catches it.
    assert isinstance(err, FloatingPointError) and isinstance(err, pw.RemoteError)
    assert err.kind == "non_finite" and err.program == "shifted_log" and err.host == vs.host
    text = str(err)
    assert "output 0 (float32[4]) holds NaN" in text and "jax_debug_nans" in text
    assert "its inputs held none, so the program made them" in text
    # Nothing downstream saw the values: the consumer fails with the same cause.
    with pytest.raises(pw.NonFiniteError, match="shifted_log"):
        z.fetch()
    # Launches that do not read it run on.
    np.testing.assert_array_equal(w.fetch(), np.arange(4, dtype=np.float32) * 2)


def test_without_the_flags_nothing_is_checked(vs: pw.VirtualSlice) -> None:
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))
    got = pw.jit(lambda v: jnp.log(v - 2.0))(x).fetch()
    want = np.asarray(jax.jit(lambda v: jnp.log(v - 2.0))(np.arange(4, dtype=np.float32)))
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got).sum() == 2


def test_infinities_are_checked_under_jax_debug_infs(vs: pw.VirtualSlice) -> None:
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))
    with jax.debug_infs(True):
        y = x / 0.0  # an operator: a small program on the slice, checked as well
        nan_only = pw.jit(lambda v: jnp.log(v - 2.0))(x)
    with pytest.raises(pw.NonFiniteError, match=r"holds inf \(jax_debug_infs set"):
        y.fetch()
    # jax_debug_infs alone does not look for NaN: log(-1) is NaN, log(0) is -inf.
    with pytest.raises(pw.NonFiniteError, match="holds inf"):
        nan_only.fetch()
    with jax.debug_infs(True):
        only_nan = pw.jit(lambda v: jnp.sqrt(v - 2.0) * 0)(x)
    assert np.isnan(only_nan.fetch()).sum() == 2


def test_values_that_came_in_with_the_inputs_are_said_so(vs: pw.VirtualSlice) -> None:
    host = np.array([1.0, np.nan, 3.0, 4.0], np.float32)
    x = vs.put(host, P("data"))
    ints = vs.put(np.arange(4, dtype=np.int32), P("data"))
    with jax.debug_nans(True):
        y = pw.jit(lambda v, i: (v + 1, i * 2))(x, ints)
    with pytest.raises(pw.NonFiniteError) as info:
        y[0].fetch()
    assert "output 0 (float32[4]) holds NaN" in str(info.value)
    assert "its inputs already did: input 0 (float32[4]) holds NaN" in str(info.value)
    # A put is not checked (jax.device_put is not either): only what programs make.
    np.testing.assert_array_equal(x.fetch(), host)


def test_integer_key_and_donated_values_are_left_alone(vs: pw.VirtualSlice) -> None:
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))
    key = vs.put(jax.random.key(0), P())

    def step(v: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        k, sub = jax.random.split(k)
        return v + jax.random.normal(sub, v.shape), k, (v * 0).astype(jnp.int32)

    with jax.debug_nans(True):
        v, k, i = pw.jit(step, donate_argnums=0)(x, key)
        out = pw.jit(lambda a: a * 2)(v)
    want_v, _, _ = jax.jit(step)(np.arange(4, dtype=np.float32), jax.random.key(0))
    np.testing.assert_allclose(out.fetch(), np.asarray(want_v) * 2, rtol=1e-6)
    assert jax.random.key_data(k.fetch()).shape == (2,)
    np.testing.assert_array_equal(i.fetch(), np.zeros(4, np.int32))


def test_a_flag_set_in_the_hosts_process_does_not_fail_other_programs(
    vs: pw.VirtualSlice,
) -> None:
    # The in-process hosts share this process's configuration. JAX's own check would
    # raise its internal exception on every host thread; the hosts run with it off and
    # check only the launches the client marks, with the same error a remote host gives.
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))
    jax.config.update("jax_debug_nans", True)
    try:
        y = pw.jit(lambda v: jnp.log(v - 2.0))(x)
        z = pw.jit(lambda v: v + 1)(x)
    finally:
        jax.config.update("jax_debug_nans", False)
    with pytest.raises(pw.NonFiniteError, match="holds NaN"):
        y.fetch()
    np.testing.assert_array_equal(z.fetch(), np.arange(4, dtype=np.float32) + 1)


def test_a_launch_with_a_bad_check_is_refused_and_the_controller_serves_on(
    client: pw.Client, vs: pw.VirtualSlice, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))
    send = client._io.send_batched

    def with_bad_check(msg: dict[str, object]) -> None:
        send({**msg, "check": "loud"} if msg.get("t") == "launch" else msg)

    monkeypatch.setattr(client._io, "send_batched", with_bad_check)
    y = pw.jit(lambda v: v + 1)(x)
    with pytest.raises(pw.PathwaysError, match=r"check is 1 \(NaN\), 2 \(inf\) or 3 .*got 'loud'"):
        y.fetch()
    monkeypatch.undo()
    np.testing.assert_array_equal(pw.jit(lambda v: v + 1)(x).fetch(), np.arange(4) + 1.0)


def test_checkify_errors_come_back_with_fetch_and_throw_as_in_jax(vs: pw.VirtualSlice) -> None:
    from jax.experimental import checkify

    def positive_log(a: jax.Array) -> jax.Array:
        checkify.check(jnp.all(a > 0), "not positive: {}", a.min())
        return jnp.log(a)

    f = checkify.checkify(positive_log)
    x = vs.put(np.arange(4, dtype=np.float32), P("data"))
    err, out = pw.jit(f)(x)
    want_err, want = jax.jit(f)(np.arange(4, dtype=np.float32))
    assert pw.fetch(err).get() == want_err.get() == "not positive: 0.0 (`check` failed)"
    with pytest.raises(Exception, match=r"not positive: 0\.0"):
        pw.fetch(err).throw()
    np.testing.assert_array_equal(out.fetch(), np.asarray(want))
    ok, _ = pw.jit(f)(x + 1)
    assert pw.fetch(ok).get() is None

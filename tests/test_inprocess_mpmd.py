"""MPMD in-process: programs on different slices joined by host-to-host transfers."""

from __future__ import annotations

import html
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_nb as pw


def _transfer_events(client: pw.Client) -> list[dict]:
    # A transfer's end reaches the event log with the destination's acknowledgement,
    # which may follow the answer to a fetch of what consumed it.
    client.wait_all()
    ev = client.events()
    return ev[(ev.program == "transfer") & (ev.kind == "end")].to_dict("records")


def test_encode_on_one_island_decode_on_another(client: pw.Client) -> None:
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})
    assert a.island != b.island
    w1 = np.linspace(-1, 1, 8 * 16, dtype=np.float32).reshape(8, 16)
    w2 = np.linspace(1, -1, 16 * 4, dtype=np.float32).reshape(16, 4)

    def encode(x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w1)

    def decode(h: jax.Array) -> jax.Array:
        return h @ w2

    enc = pw.jit(encode, slice=a, out_shardings=P("x"))
    dec = pw.jit(decode, slice=b, in_shardings=P("x"))
    x = np.arange(6 * 8, dtype=np.float32).reshape(6, 8) / 10
    h = enc(a.put(x, P("x")))
    z = dec(h)
    assert h.slice is a and z.slice is b
    np.testing.assert_allclose(np.asarray(z), decode(encode(x)), rtol=1e-5, atol=1e-6)
    [ev] = _transfer_events(client)
    assert ev["host"] == b.host and "→" in ev["detail"]
    assert f"{6 * 16 * 4} B" in ev["detail"]


def test_put_of_a_remote_array_moves_it_host_to_host_as_device_put_does(
    client: pw.Client,
) -> None:
    """vs.put(x) of an array on another slice went through the client (a fetch, then a
    put); it is a transfer between the hosts, and a new array the caller owns."""
    a = client.allocate({"x": 2})
    b = client.allocate({"y": 2})
    v = np.arange(8, dtype=np.float32).reshape(4, 2)
    x = a.put(v, P("x"))
    columns = b.put(x, P(None, "y"))
    again = b.put(x, P(None, "y"))
    assert columns is not again and columns.slice is b and columns.spec == P(None, "y")
    np.testing.assert_array_equal(np.asarray(columns), v)
    evs = _transfer_events(client)
    assert len(evs) == 2 and all(ev["host"] == b.host for ev in evs), evs
    assert all(f"{v.nbytes} B" in ev["detail"] for ev in evs), evs
    columns.delete()
    np.testing.assert_array_equal(np.asarray(again), v)  # its own array
    # On x's own slice: a new array in the asked layout, as jax.device_put reshards.
    whole = a.put(x, P())
    assert whole is not x and whole.spec == P() and x.spec == P("x")
    np.testing.assert_array_equal(np.asarray(whole), v)
    with pytest.raises(ValueError, match="does not split evenly"):
        b.put(x[:3], P("y"))


@pytest.mark.parametrize(
    ("src_mesh", "src_spec", "dst_mesh", "dst_spec"),
    [
        ({"x": 4}, P("x"), {"y": 2}, P(None, "y")),  # row shards to column shards
        ({"x": 2, "y": 2}, P("x", "y"), {"z": 4}, P()),  # 2-D tiles to replicated
        ({"x": 4}, P(), {"a": 2, "b": 2}, P(("a", "b"))),  # replicated to 4 row shards
        ({"x": 2}, P("x"), {"x": 4}, P("x")),  # same axis name, more shards
    ],
)
def test_transfers_reshard_by_index_overlap(
    client: pw.Client, src_mesh: dict, src_spec: P, dst_mesh: dict, dst_spec: P
) -> None:
    a = client.allocate(src_mesh)
    b = client.allocate(dst_mesh)
    x = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    xa = a.put(x, src_spec)
    ident = pw.jit(lambda v: v * 1, slice=b, in_shardings=dst_spec, out_shardings=dst_spec)
    y = ident(xa)
    assert y.slice is b and y.spec == dst_spec
    np.testing.assert_array_equal(np.asarray(y), x)
    a.release()
    b.release()


def test_scalars_and_narrow_dtypes_move_between_slices(client: pw.Client) -> None:
    """A 0-d array (a loss, a step count) and 1- or 2-byte dtypes arrive as they left."""
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})
    ident = pw.jit(lambda v: v, slice=b)
    for value in (
        np.float32(3.5),
        np.int32(-7),
        np.array([True, False, True, True]),
        np.arange(4, dtype=np.int8),
        jnp.arange(4, dtype=jnp.bfloat16),
    ):
        moved = ident(a.put(value, P()))
        got = np.asarray(moved)
        assert moved.shape == got.shape == np.shape(value), value
        assert got.dtype == np.asarray(value).dtype
        np.testing.assert_array_equal(got, np.asarray(value))
    a.release()
    b.release()


def test_a_moved_array_is_sent_once_per_slice_and_sharding(client: pw.Client) -> None:
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})
    xa = a.put(np.ones((4, 2), np.float32), P("x"))
    f = pw.jit(lambda v: v + 1, slice=b)
    before = len(_transfer_events(client))
    np.testing.assert_array_equal(np.asarray(f(xa)), 2)
    np.testing.assert_array_equal(np.asarray(f(xa)), 2)
    assert len(_transfer_events(client)) == before + 1
    g = pw.jit(lambda v: v + 2, slice=b, in_shardings=P())
    np.testing.assert_array_equal(np.asarray(g(xa)), 3)
    assert len(_transfer_events(client)) == before + 2


def test_donating_an_array_just_moved_to_another_slice_keeps_both_results(
    client: pw.Client,
) -> None:
    """A launch donates the array a send to another island reads: whichever order the
    host meets them in, the send ships the values from before the donation, and neither
    result is touched by the other."""
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})
    host = np.arange(4 * 1024 * 1024, dtype=np.float32).reshape(2048, 2048)
    for _ in range(3):
        xa = a.put(host, P("x"))
        moved = pw.jit(lambda v: v * 2, slice=b)(xa)  # a sends xa to b
        bumped = pw.jit(lambda v: v + 1, slice=a, donate_argnums=0)(xa)
        np.testing.assert_array_equal(np.asarray(bumped), host + 1)
        np.testing.assert_array_equal(np.asarray(moved), host * 2)


def test_typed_prng_keys_move_between_slices(client: pw.Client) -> None:
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})
    keys = jax.random.split(jax.random.key(3), 4)
    ka = a.put(keys, P("x"))
    draw = pw.jit(lambda k: jax.vmap(lambda kk: jax.random.normal(kk, ()))(k), slice=b)
    want = jax.vmap(lambda kk: jax.random.normal(kk, ()))(keys)
    np.testing.assert_allclose(np.asarray(draw(ka)), np.asarray(want), rtol=1e-6)


def test_a_failure_crosses_slices_with_its_cause(client: pw.Client) -> None:
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})
    client.inject_fault(a, match="stage_two")

    def stage_two(v: jax.Array) -> jax.Array:
        return v * 2

    s2 = pw.jit(stage_two, slice=a)
    loss = pw.jit(lambda v: jnp.sum(v), slice=b)
    out = loss(s2(a.put(np.ones(4, np.float32), P("x"))))
    with pytest.raises(pw.RemoteError, match="injected fault") as info:
        np.asarray(out)
    assert info.value.program == "stage_two"


def test_a_chain_across_islands_is_submitted_before_it_runs(client: pw.Client) -> None:
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})

    def first(v: jax.Array) -> jax.Array:
        return v + 1.0

    fa0 = pw.jit(first, slice=a)
    fa = pw.jit(lambda v: v + 1.0, slice=a)
    fb = pw.jit(lambda v: v * 1.0 + 1.0, slice=b)
    x = a.put(np.zeros(2, np.float32), P("x"))
    np.asarray(fb(fa(fa0(x))))  # compile all three
    client.inject_fault(a, match="first", kind="delay:0.5")
    since = time.time()
    y = fb(fa0(x))
    for _ in range(15):
        y = fb(fa(y))
    submitted = time.time()
    np.testing.assert_array_equal(np.asarray(y), 32.0)
    ev = client.events(since=since)
    end_of_first = ev[(ev.program == "first") & (ev.kind == "end")].time.max().timestamp()
    # Every launch and transfer of the chain was with the controller before its first
    # program had finished: dispatch never waited for a result.
    launches = ev[ev.kind == "launch"]
    assert len(launches) == 32 + 31  # programs, transfers
    assert submitted < end_of_first
    assert launches.time.max().timestamp() < end_of_first


@pytest.mark.timeout(120)
def test_two_pipelines_crossing_islands_in_opposite_order_finish(
    cluster: pw.InProcessCluster,
) -> None:
    # Two tenants, so each island's gang scheduler may interleave them differently.
    c1, c2 = cluster.client(name="forward"), cluster.client(name="backward")
    try:
        pipes = []
        for c, order in ((c1, (0, 1)), (c2, (1, 0))):
            s = [c.allocate({"x": 2}), c.allocate({"x": 2})]
            first, second = s[order[0]], s[order[1]]
            assert first.island != second.island
            f = pw.jit(lambda v: v * 2.0, slice=first)
            g = pw.jit(lambda v: v + 1.0, slice=second)
            pipes.append([f, g, first.put(np.ones(2, np.float32), P("x"))])
        for _ in range(40):  # both submit step by step, interleaved
            for p in pipes:
                p[2] = p[0](p[1](p[2]))
        results = [p[2] for p in pipes]
        want = 1.0
        for _ in range(40):
            want = (want + 1.0) * 2.0
        for y in results:
            np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)
    finally:
        c1.close()
        c2.close()


def test_graph_of_something_not_callable_says_what_it_takes(client: pw.Client) -> None:
    with pytest.raises(TypeError, match=r"client.graph takes the step to trace.*got int"):
        client.graph(123)  # type: ignore[arg-type]


def test_the_dataflow_graph_is_built_from_shapes_and_nothing_runs(client: pw.Client) -> None:
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})
    enc = pw.jit(lambda v: jnp.tanh(v @ jnp.ones((8, 16))), slice=a, out_shardings=P("x"))
    dec = pw.jit(lambda h: h.sum(axis=1), slice=b, in_shardings=P("x"))

    def step(v: pw.RemoteArray) -> pw.RemoteArray:
        return dec(enc(v))

    x = a.put(np.ones((6, 8), np.float32), P("x"))
    before = len(client.events())
    g = client.graph(step, x)
    assert len(client.events()) == before  # nothing was launched or moved
    nodes, edges = g.nodes, g.edges
    assert list(nodes.kind) == ["input", "program", "program"]
    assert list(nodes.slice) == [a.name, a.name, b.name]
    [t] = edges[edges.kind == "transfer"].to_dict("records")
    assert (t["from_slice"], t["to_slice"]) == (a.name, b.name)
    assert t["shape"] == (6, 16) and t["dtype"] == "float32" and t["bytes"] == 6 * 16 * 4
    assert t["spec"] == "P('x',)"
    dot = g.to_dot()
    assert dot.startswith("digraph step") and "style=dashed" in dot and dot.count("->") == 2
    assert "2 programs on 2 slices" in repr(g)
    # In a notebook cell: the summary, the programs by slice and the edges as tables.
    page = g._repr_html_()
    assert repr(g)[1:-1] in html.unescape(page)
    cells = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", page)]
    assert len(cells) == 3 * 4 + 2 * 7  # three programs, two edges
    assert cells[1:4] == ["input", a.name, a.island]  # the first row: the step's input
    transfer = cells[12 + 7 : 12 + 14]
    assert transfer[2:] == [
        "transfer",
        "float32[6, 16]",
        "P('x',)",
        f"{a.name} → {b.name}",
        "384 B",
    ]
    assert "<th>ms</th>" not in page  # nothing ran
    out = pw.graph(step, x)  # the module-level form, on the current client
    assert out.programs == 2
    # Numpy inputs become puts; placeholders have shapes but no values.
    g2 = client.graph(lambda v: enc(v), np.ones((6, 8), np.float32))
    assert list(g2.nodes.name) == ["put", "<lambda>"]
    with pytest.raises(ValueError, match="traced with shapes only"):
        g.annotate()


def _drawn_labels(dot: str) -> list[str]:
    r"""Each ``label`` of DOT source as Graphviz draws it, refusing anything it would not
    draw literally: an HTML-like ``<...>`` label, an unbalanced quote, or an escape
    other than ``\\``, ``\"`` and ``\n`` (Graphviz expands ``\N``, ``\G``, ``\l``...)."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|[^\s"=\[\];,{}<>]+|\S', dot, re.S)
    assert '"' not in tokens, f"an unbalanced quote in\n{dot}"

    def unescape(m: re.Match[str]) -> str:
        assert m.group(1) in '\\"n', f"Graphviz would expand \\{m.group(1)} in\n{dot}"
        return "\n" if m.group(1) == "n" else m.group(1)

    labels = []
    for i, tok in enumerate(tokens[:-2]):
        if tok == "label" and tokens[i + 1] == "=":
            value = tokens[i + 2]
            assert value != "<", f"an HTML-like label in\n{dot}"
            if value.startswith('"'):
                # Graphviz decodes entities in labels: a literal & is written &amp;.
                value = html.unescape(re.sub(r"\\(.)", unescape, value[1:-1], flags=re.S))
            else:
                assert re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*|-?[0-9.]+", value), value
            labels.append(value)
    return labels


@pytest.mark.parametrize(
    ("slice_name", "program"),
    [
        ("s", None),  # the default name: <lambda>
        ("\\N\\G", "\\N\\G"),
        ("end\\", "end\\"),
        ("a&amp;b", "a&lt;b&gt;"),
        ("b", "<b>bold</b>"),
        ("t", '<<table><tr><td href="javascript:alert(1)">x</td></tr></table>>'),
        ('q"\\', 'x\\"]; n9 [label="pwned'),
        ("two\nlines", "\\l\\E\\T\\H\\L"),
    ],
)
def test_the_dot_source_draws_every_name_as_written(
    client: pw.Client, slice_name: str, program: str | None
) -> None:
    a = client.allocate({"x": 2}, name=slice_name)
    try:
        f = pw.jit(lambda v: jnp.tanh(v), slice=a, name=program)
        x = a.put(np.ones((4, 4), np.float32), P("x"))
        g = client.graph(lambda v: f(v), x)
        dot = g.to_dot()
        cluster, put, node, edge = _drawn_labels(dot)
        assert cluster == f"slice {slice_name} ({a.island})"
        assert (put, node) == ("input", program or "<lambda>")
        assert edge == "float32[4, 4] P('x',)"
        assert len(re.findall(r"^\s*n\d+ \[", dot, re.M)) == 2 and dot.count("->") == 1
    finally:
        a.release()


def test_the_graph_of_a_named_pw_jit_is_titled_by_its_name(client: pw.Client) -> None:
    a = client.allocate({"x": 2})
    inc = pw.jit(lambda v: v + 1.0, slice=a, name="inc")
    g = client.graph(inc, a.put(np.ones(4, np.float32), P("x")))
    assert g.name == "inc" and "DataflowGraph 'inc'" in repr(g)
    assert g.to_dot().startswith("digraph inc")


def test_a_recorded_step_is_annotated_with_times_from_the_event_log(client: pw.Client) -> None:
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})
    enc = pw.jit(lambda v: v * 2.0, slice=a)
    dec = pw.jit(lambda h: h + 1.0, slice=b)
    x = a.put(np.ones(4, np.float32), P("x"))
    with client.record() as g:
        z = dec(enc(x))
    np.testing.assert_array_equal(np.asarray(z), 3.0)
    g.annotate()
    nodes, edges = g.nodes, g.edges
    progs = nodes[nodes.kind == "program"]
    assert list(progs.name) == ["<lambda>", "<lambda>"] and (progs.lid > 0).all()
    assert (progs.end >= progs.start).all()
    [t] = edges[edges.kind == "transfer"].to_dict("records")
    assert t["lid"] > 0 and t["end"] >= t["start"]
    # The transfer starts after the producer started and ends before the consumer ends.
    assert t["start"] >= progs.start.iloc[0] and t["end"] <= progs.end.iloc[1]
    # Its notebook view gives each program's milliseconds.
    page = g._repr_html_()
    took = sorted((progs.end - progs.start).dt.total_seconds() * 1e3)
    shown = sorted(float(v) for v in re.findall(r"<td>(\d+\.\d\d)</td>", page))
    assert "<th>ms</th>" in page and np.allclose(shown, took, atol=0.006)
    placeholders: list[pw.RemoteArray] = []
    client.graph(lambda v: placeholders.append(enc(v)), x)
    with pytest.raises(TypeError, match="no value"):
        np.asarray(placeholders[0])
    with pytest.raises(TypeError, match="traces shapes only"):
        dec(placeholders[0])  # a placeholder cannot feed a real launch


def test_moves_the_step_makes_itself_are_transfers_of_its_graph(client: pw.Client) -> None:
    a = client.allocate({"x": 2})
    b = client.allocate({"x": 2})
    enc = pw.jit(lambda v: jnp.tanh(v) * 2.0, slice=a)
    dec = pw.jit(lambda h: h.sum(0), slice=b, in_shardings=P("x"))
    x = a.put(np.ones((8, 4), np.float32), P("x"))
    client.wait_all()
    seen: list[pw.RemoteArray] = []

    def put_step(v: pw.RemoteArray) -> pw.RemoteArray:
        h = b.put(enc(v), P(None, "x"))
        seen.append(h)
        seen.append(b.put(np.zeros(3, np.float32)))  # a local value the step puts
        return dec(h)

    def to_device_step(v: pw.RemoteArray) -> pw.RemoteArray:
        return dec(enc(v).to_device(b))

    before = len(client.events())
    for step, names in (
        (put_step, ["input", "<lambda>", "put", "<lambda>"]),
        (to_device_step, ["input", "<lambda>", "<lambda>"]),
    ):
        g = client.graph(step, x)
        [t] = g.edges[g.edges.kind == "transfer"].to_dict("records")
        assert (t["from_slice"], t["to_slice"], t["bytes"]) == (a.name, b.name, 128)
        assert list(g.nodes.name) == names
    # Tracing sent nothing: no move, no put, and what they gave back has no value.
    assert len(client.events()) == before
    assert all(isinstance(h, pw.GraphArray) for h in seen)
    with pytest.raises(TypeError, match="no value"):
        np.asarray(seen[0])
    with client.record() as rec:
        z = to_device_step(x)
    [t] = rec.edges[rec.edges.kind == "transfer"].to_dict("records")
    assert t["lid"] > 0 and (t["from_slice"], t["to_slice"]) == (a.name, b.name)
    np.testing.assert_allclose(np.asarray(z), np.full(4, 8 * 2 * np.tanh(1.0)), rtol=1e-6)


def test_a_python_number_in_a_traced_graph_has_the_dtype_a_real_call_gives_it(
    client: pw.Client,
) -> None:
    a = client.allocate({"x": 2})
    scale = pw.jit(lambda v, s: v * s, slice=a)
    x = a.put(np.ones(4, np.float32), P("x"))
    traced = client.graph(scale, x, 0.5)
    with client.record() as recorded:
        scale(x, 0.5)
    for g in (traced, recorded):
        rows = g.edges[["dtype", "shape", "bytes"]].to_dict("records")
        assert rows == [
            {"dtype": "float32", "shape": (4,), "bytes": 16},
            {"dtype": "float32", "shape": (), "bytes": 4},
        ]

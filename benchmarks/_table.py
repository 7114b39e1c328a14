"""The README's results table, from the JSON a run wrote."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

Row = tuple[str, str, str, str, str]


def _fmt(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


# The dispatch baselines in the order they are listed; Ray and ipyparallel appear only
# when the run had them (installed, and able to start).
_DISPATCH_BASELINES = {
    "jax": "JAX",
    "dask_actors": "Dask actors",
    "ray_actors": "Ray actors",
    "ipyparallel": "ipyparallel",
}


def _dispatch(r: dict[str, Any]) -> list[Row]:
    t = r["programs_per_s"]
    rows = []
    for mode in ("opbyop", "chained", "fused"):
        jax_ = t["jax"][mode]["median"]
        ours = t["pathways_nb"][mode]["median"]
        baselines = ", ".join(
            f"{label} {_fmt(t[system][mode]['median'])}"
            for system, label in _DISPATCH_BASELINES.items()
            if system in t
        )
        rows.append(
            (
                f"dispatch {mode} (programs/s)",
                baselines,
                _fmt(ours),
                f"{ours / jax_:.2f}x",
                "",
            )
        )
    return rows


def _size(r: dict[str, Any]) -> list[Row]:
    n = r["smallest_matching_size"]
    where = f"n={n} ({r['smallest_matching_program_ms']:.1f} ms programs)" if n else "none"
    best = max(v["ratio"] for v in r["sizes"].values())
    return [("smallest program matching plain JAX", "", where, f"best {best:.2f}x", "≥ 0.95x")]


def _training(r: dict[str, Any]) -> list[Row]:
    p, o = r["plain_jax_tokens_per_s"]["median"], r["pathways_tokens_per_s"]["median"]
    return [
        (
            "transformer LM training (tokens/s)",
            f"JAX {_fmt(p)}",
            _fmt(o),
            f"{r['ratio']:.2f}x",  # the median of paired ratios, as the JSON reports
            "≥ 0.97x",
        )
    ]


def _core(r: dict[str, Any]) -> list[Row]:
    c, rt = r["chained"], r["roundtrip"]
    return [
        (
            "chained all-reduce + add (calls/s)",
            f"JAX {_fmt(c['plain_jax_calls_per_s']['median'])}",
            _fmt(c["pathways_calls_per_s"]["median"]),
            f"{c['ratio']:.2f}x",
            "≥ 0.7x",
        ),
        *(
            [
                (
                    "the same calls through a lean reference path (client, controller and "
                    "host over ZeroMQ, nothing else; calls/s)",
                    f"JAX {_fmt(c['plain_jax_calls_per_s']['median'])}",
                    _fmt(c["lean_path_calls_per_s"]["median"]),
                    f"{c['lean_path_ratio']:.2f}x",
                    "",
                )
            ]
            if "lean_path_calls_per_s" in c
            else []
        ),
        *([_cycle_row(c["cycle_ms"])] if "cycle_ms" in c else []),
        (
            "round trip of a tiny program (ms)",
            f"JAX {1e3 * rt['plain_jax_s']['median']:.2f}",
            f"{1e3 * rt['pathways_s']['median']:.2f}",
            f"{rt['ratio']:.1f}x",
            "< 1 ms",
        ),
    ]


def _cycle_row(m: dict[str, float]) -> Row:
    legs = (
        f"submitted {m['submitted']:.2f}, the controller has the first launch "
        f"{m['controller_has_first']:.2f}, the host starts it {m['host_starts_first']:.2f}, "
        f"has seen the last finish {m['host_ends_last']:.2f}, the client has the result "
        f"{m['client_has_result']:.2f}"
    )
    return (
        "the same calls: a cycle of 16 (ms from its first call)",
        f"JAX {m['plain_jax']:.2f}",
        legs,
        f"{m['client_has_result'] / m['plain_jax']:.2f}x",
        "",
    )


def _pipeline_rows(p: dict[str, Any]) -> list[Row]:
    width = p["params"]["width"]
    return [
        (
            f"4-stage pipeline vs SPMD, width {width} (steps/s), gradients reduced once per step",
            f"SPMD {_fmt(p['spmd_steps_per_s'])}",
            _fmt(p["pipeline_steps_per_s"]),
            f"{p['ratio']:.2f}x",
            "≥ 0.9x",
        ),
        (
            f"the same, width {width}, gradients reduced every microbatch",
            f"SPMD {_fmt(p['spmd_steps_per_s'])}",
            _fmt(p["reduce_grads_every_microbatch"]["steps_per_s"]),
            f"{p['reduce_grads_every_microbatch']['ratio']:.2f}x",
            "",
        ),
        (
            f"pipeline bubble, width {width} (busy intervals)",
            f"theory {p['bubble_theoretical']:.2f}",
            f"{p['bubble_measured']:.2f}",
            f"{p['bubble_ratio']:.2f}x",
            "≤ 1.2x",
        ),
        (
            f"the same bubble, width {width}, against the schedule run with the stages' "
            "measured program times and instant hops",
            f"scheduled {p['bubble_scheduled']:.2f}",
            f"{p['bubble_measured']:.2f}",
            f"{p['bubble_measured'] / p['bubble_scheduled']:.2f}x",
            "",
        ),
        *_standard_row(p, width),
    ]


def _standard_row(p: dict[str, Any], width: int) -> list[Row]:
    """The bubble of 1F1B without the extra warm-up forward, when the run measured it."""
    std = p.get("standard_1f1b")
    if std is None:
        return []
    return [
        (
            f"pipeline bubble, width {width}, standard 1F1B (no extra warm-up forward)",
            f"theory {std['bubble_theoretical']:.2f}",
            f"{std['bubble_measured']:.2f}",
            f"{std['bubble_ratio']:.2f}x",
            "",
        )
    ]


def _mpmd(r: dict[str, Any]) -> list[Row]:
    p, t, d = r["pipeline"], r["transfer"], r["dispatch"]
    smallest = min(d["sizes"], key=int)
    s = d["sizes"][smallest]
    return [
        *_pipeline_rows(p),
        *_pipeline_rows(r["pipeline_wide"]),
        (
            f"transfer {t['bytes'] >> 20} MiB host to host (GiB/s)",
            f"raw ZeroMQ {t['raw_zmq_gib_per_s']:.2f}",
            f"{t['pathways_gib_per_s']:.2f}",
            f"{t['ratio']:.2f}x",
            "≥ 0.7x",
        ),
        (
            f"16-program chain across islands, {smallest}x{smallest} (ms)",
            f"sequential {1e3 * s['sequential_s']['median']:.0f}",
            f"parallel {1e3 * s['parallel_s']['median']:.0f}",
            f"{s['speedup']:.2f}x faster",
            "ahead",
        ),
    ]


def _widgets(r: dict[str, Any]) -> list[Row]:
    p, w = r["plain_steps_per_s"]["median"], r["with_widgets_steps_per_s"]["median"]
    rows = [
        (
            "training with live widgets open (steps/s)",
            f"without {_fmt(p)}",
            _fmt(w),
            f"{r['ratio']:.2f}x",
            "≥ 0.98x",
        )
    ]
    if "panel_ratio" in r:
        rows.append(
            (
                "training with the JupyterLab panel open (steps/s)",
                f"without {_fmt(p)}",
                _fmt(r["with_panel_steps_per_s"]["median"]),
                f"{r['panel_ratio']:.2f}x",
                "≥ 0.98x",
            )
        )
    return rows


def _memory(r: dict[str, Any]) -> list[Row]:
    g = r.get("growth_mb", {})
    text = ", ".join(f"{k} +{v:.1f} MB" for k, v in g.items()) if g else "see JSON"
    rows: list[Row] = [("resident memory growth over the run", "", text, "", "< 50 MB")]
    d = r.get("distinct_programs")
    if d:
        n = r["params"]["distinct"]
        grown = ", ".join(f"{k} +{v:.1f} MB" for k, v in d["growth_mb"].items())
        rows.append((f"memory over {n} programs traced anew, second half", "", grown, "", ""))
    return rows


def _scale(r: dict[str, Any]) -> list[Row]:
    first, last = r["points"][0], r["points"][-1]
    wall = [p["us_per_program"]["median"] for p in (first, last)]
    cpu = [p["controller_cpu_us_per_program"]["median"] for p in (first, last)]
    return [
        (
            f"controller cost per program, {first['devices']:,} → {last['devices']:,} "
            f"devices, {last['live_arrays']:,} live arrays (µs)",
            f"{first['devices']:,} devices {_fmt(wall[0])} (CPU {_fmt(cpu[0])})",
            f"{last['devices']:,} devices {_fmt(wall[1])} (CPU {_fmt(cpu[1])})",
            f"{r['ratio_1024_vs_8']:.2f}x",
            f"≤ {r['target_ratio']:g}x",
        ),
        *(
            [
                (
                    "gang scheduler per launch, 1 → 1,024 tenants' queues on one island (µs)",
                    f"1 tenant {_fmt(q[0]['us_per_launch']['median'])}",
                    f"1,024 tenants {_fmt(q[-1]['us_per_launch']['median'])}",
                    f"{r['scheduler_ratio_1024_vs_1_tenants']:.2f}x",
                    f"≤ {r['target_ratio']:g}x",
                )
            ]
            if (q := r.get("tenants_on_one_island"))
            else []
        ),
    ]


def _fetch(r: dict[str, Any]) -> list[Row]:
    n, mib = r["params"]["leaves"], r["params"]["big_bytes"] >> 20
    what = {
        "fetch_pytree": f"fetch a pytree of {n} small arrays (ms; JAX: jax.device_get)",
        "wait_pytree": f"block_until_ready of the same {n} (ms)",
        "put_big": f"put {mib} MiB sharded over 4 devices (ms; JAX: jax.device_put)",
        "fetch_big": f"fetch the {mib} MiB (ms; JAX: np.asarray)",
        "save_big": f"pw.save the {mib} MiB, written by its host (ms; JAX: np.save)",
        "save_background_big": "pw.save(wait=False): until the notebook goes on (ms; JAX: np.save)",
        "restore_big": "pw.restore it, read by its host (ms; JAX: device_put of np.load)",
    }
    return _turn_rows(r, what, ("JAX", "plain_jax_s"), "pathways_s")


def _turn_rows(
    r: dict[str, Any], what: dict[str, str], baseline: tuple[str, str], ours: str
) -> list[Row]:
    """A row per timed pair in ``what`` (key → label) that ``r`` holds, in ms:
    ``baseline`` is its name in the table and its key in the pair, ``ours`` our key."""
    name, theirs = baseline
    return [
        (
            label,
            f"{name} {1e3 * r[k][theirs]['median']:.2f}",
            f"{1e3 * r[k][ours]['median']:.2f}",
            f"{r[k]['ratio']:.2f}x",
            "",
        )
        for k, label in what.items()
        if k in r
    ]


def _data(r: dict[str, Any]) -> list[Row]:
    mib, rate = r["params"]["batch_bytes"] / 2**20, r["batches_per_s"]
    return [
        (
            f"pw.data.batches of {mib:g} MiB over 4 devices, against the same batches "
            "gathered in the notebook and put (batches/s)",
            f"through the client {rate['through_client']:.1f}",
            f"{rate['pw_data_batches']:.1f}",
            f"{r['vs_through_client']['ratio']:.2f}x",
            "",
        ),
        (
            "the same, against plain JAX fed by Dask's threads in one process (batches/s)",
            f"JAX {rate['plain_jax']:.1f}",
            f"{rate['pw_data_batches']:.1f}",
            f"{r['vs_plain_jax']['ratio']:.2f}x",
            "",
        ),
    ]


def _tls(r: dict[str, Any]) -> list[Row]:
    mib = r["params"]["big_bytes"] >> 20
    what = {
        "round_trip": "round trip of a tiny program on a cluster with TLS (ms; without TLS)",
        "put_big": f"put {mib} MiB with TLS (ms; without TLS)",
        "fetch_big": f"fetch the {mib} MiB with TLS (ms; without TLS)",
        "transfer_big": f"move the {mib} MiB host to host with TLS (ms; without TLS)",
    }
    return _turn_rows(r, what, ("plain", "plain_s"), "tls_s")


def _profile(r: dict[str, Any]) -> list[Row]:
    rate = r["calls_per_s"]
    return [
        (
            "chained calls with XLA's profiler on the host (calls/s; without it), "
            f"{r['xla_events_per_call']:.0f} XLA events a call, a stop "
            f"{1e3 * r['stop_s']['median']:.0f} ms",
            f"unprofiled {rate['plain']['median']:.0f}",
            f"{rate['profiled']['median']:.0f}",
            f"{r['ratio']:.2f}x",
            "",
        )
    ]


def _colocated(r: dict[str, Any]) -> list[Row]:
    mib = r["params"]["big_bytes"] >> 20
    rows = _turn_rows(
        r,
        {
            "round_trip": "round trip of a pw.colocated function, NumPy on the host "
            "(ms; a pw.jit program)"
        },
        ("pw.jit", "jit_s"),
        "colocated_s",
    )
    big = r["tails_big"]
    rows.append(
        (
            f"1st and 99th percentiles of a {mib} MiB array, pw.colocated on its host "
            "(ms; fetched and computed in the notebook; plain JAX in one process)",
            f"fetched {1e3 * big['fetched_s']['median']:.1f}, "
            f"JAX {1e3 * big['plain_jax_s']['median']:.1f}",
            f"{1e3 * big['colocated_s']['median']:.1f}",
            f"{big['ratio']:.2f}x",
            "",
        )
    )
    return rows


def _proxy(r: dict[str, Any]) -> list[Row]:
    rt = r["roundtrip_ms"]
    tok = r["samples"]["tokens_per_s"]
    chained = r["samples"]["chained_calls_per_s"]
    return [
        (
            "round trip of a tiny program, plain JAX through the IFRT proxy (ms; pw.jit)",
            f"pw.jit {rt['pw']:.2f}, JAX {rt['plain_jax']:.3f}",
            f"{rt['proxy']:.2f}",
            f"{r['roundtrip_proxy_over_pw']:.1f}x",
            "<= 2x",
        ),
        (
            "transformer LM training through the IFRT proxy (tokens/s)",
            f"JAX {tok['plain_jax']['median']:,.0f}",
            f"{tok['proxy']['median']:,.0f}",
            f"{r['training_proxy_over_plain_jax']:.2f}x",
            ">= 0.95x",
        ),
        (
            "chained all-reduce + add through the IFRT proxy (calls/s; pw.jit)",
            f"pw.jit {chained['pw']['median']:,.0f}",
            f"{chained['proxy']['median']:,.0f}",
            f"{r['chained_proxy_over_pw']:.2f}x",
            "",
        ),
    ]


TABLES: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "dispatch": _dispatch,
    "size": _size,
    "training": _training,
    "core": _core,
    "mpmd": _mpmd,
    "widgets": _widgets,
    "memory": _memory,
    "scale": _scale,
    "fetch": _fetch,
    "data": _data,
    "tls": _tls,
    "profile": _profile,
    "colocated": _colocated,
    "proxy": _proxy,
}


def markdown(out: str) -> str:
    """A Markdown table of every experiment whose JSON is in ``out``."""
    lines = [
        "| measurement | baseline | pathways_nb | ratio | target |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, rows_of in TABLES.items():
        path = os.path.join(out, f"{name}.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            result = json.load(f)
        try:
            rows = rows_of(result)
        except (KeyError, TypeError, ZeroDivisionError):
            continue  # an older or partial result: left out rather than misread
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"

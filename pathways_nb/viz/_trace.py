"""The event log as Chrome trace-event JSON, which Perfetto and chrome://tracing open.

One process per host, one thread per slice on it. Programs and transfers are complete
events (``ph: X``); the time a launch waited in queues before it started is an async
span (``b``/``e``) in a ``queued`` category; each transfer is also a flow (``s``/``f``)
from its source host to its destination.

Given a :class:`pathways_nb.Profile`, the hosts' own XLA traces join them on the same
time axis: each host's XLA threads (device threads, intra-op pool, the dispatching
thread) as processes of their own, beside the runtime's view of the same host.
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Any

import pandas as pd

from pathways_nb.viz._timeline import intervals


def trace_events(events: pd.DataFrame, profile: Any = None) -> dict[str, Any]:
    """A ``{"traceEvents": [...]}`` document for the events (``client.events()``), with
    the hosts' XLA traces of ``profile`` (a stopped :class:`pathways_nb.Profile`)."""
    rows = intervals(events)
    out: list[dict[str, Any]] = []
    if profile is not None:
        out += _host_traces(profile, first_pid=1000)
    if len(rows) == 0:
        return {"traceEvents": out, "displayTimeUnit": "ms"}
    hosts = sorted(set(rows.host) | {s for s in rows.source if s})
    pid = {h: i + 1 for i, h in enumerate(hosts)}
    tids: dict[tuple[str, str], int] = {}
    for h in hosts:
        out.append(_meta("process_name", pid[h], 0, f"host {h}"))
        out.append(_meta("thread_name", pid[h], 0, "transfers out"))
    for r in rows.drop_duplicates(["host", "slice"]).itertuples(index=False):
        tid = len([k for k in tids if k[0] == r.host]) + 1
        tids[(r.host, r.slice)] = tid
        out.append(_meta("thread_name", pid[r.host], tid, f"slice {r.slice} ({r.island})"))
    t_last = float(rows[["start", "end"]].max().max())
    for r in rows.itertuples(index=False):
        p, t = pid[r.host], tids[(r.host, r.slice)]
        end = r.end if r.end == r.end else t_last
        args = {"lid": int(r.lid), "tenant": int(r.tenant), "island": r.island}
        if r.kind == "transfer":
            args |= {"source": r.source, "bytes": int(r.bytes)}
        out.append(
            {
                "name": r.name,
                "cat": f"{r.kind},tenant{r.tenant}" + (",failed" if r.failed else ""),
                "ph": "X",
                "ts": _us(r.start),
                "dur": max(0.0, _us(end) - _us(r.start)),
                "pid": p,
                "tid": t,
                "args": args,
            }
        )
        if r.start > r.launch:
            for ph, ts in (("b", r.launch), ("e", r.start)):
                out.append(
                    {
                        "name": f"queued {r.name}",
                        "cat": "queued",
                        "ph": ph,
                        "id": int(r.lid),
                        "ts": _us(ts),
                        "pid": p,
                        "tid": t,
                    }
                )
        if r.kind == "transfer" and r.source in pid:
            # The sending side, on its host's "transfers out" thread, and a flow arrow
            # from it to the receiving side.
            out.append(
                {
                    "name": f"send {r.name}",
                    "cat": "transfer",
                    "ph": "X",
                    "ts": _us(r.start),
                    "dur": max(0.0, _us(end) - _us(r.start)),
                    "pid": pid[r.source],
                    "tid": 0,
                    "args": {"lid": int(r.lid), "to": r.host, "bytes": int(r.bytes)},
                }
            )
            out.append(_flow("s", r, pid[r.source], 0, r.start))
            out.append(_flow("f", r, p, t, end))
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_trace(events: pd.DataFrame, path: str | os.PathLike[str], profile: Any = None) -> str:
    """Write the trace to ``path`` (open it at ui.perfetto.dev or chrome://tracing),
    gzipped when the name ends in ``.gz``; with a stopped :class:`pathways_nb.Profile`,
    the hosts' XLA events too::

        with client.profile("/tmp/prof") as prof:
            state = step(state, batch)
        pw.viz.write_trace(client.events(since=prof.started), "step.json.gz", profile=prof)
    """
    doc = trace_events(events, profile)
    text = json.dumps(doc).encode()
    with open(path, "wb") as f:
        f.write(gzip.compress(text, 6) if os.fspath(path).endswith(".gz") else text)
    return os.fspath(path)


def _host_traces(profile: Any, first_pid: int) -> list[dict[str, Any]]:
    """Each host's XLA trace, moved onto the epoch's time axis (its own counts from the
    start of its session) and given process ids and names of its own."""
    hosts = getattr(profile, "hosts", None)
    if hosts is None:
        raise TypeError(f"profile is a pathways_nb Profile; got {type(profile).__name__}")
    if not hosts:
        raise ValueError(
            f"{profile!r} holds no host traces yet: stop it first (or leave its with block)"
        )
    out: list[dict[str, Any]] = []
    pids: dict[tuple[str, Any], int] = {}
    for trace in hosts:
        shift = _us(trace.started)
        for ev in trace.events:
            if "ph" not in ev:
                continue  # the empty object XLA ends its list with
            key = (trace.host, ev.get("pid"))
            pid = pids.setdefault(key, first_pid + len(pids))
            moved = dict(ev, pid=pid)
            if ev["ph"] == "M" and ev.get("name") == "process_name":
                name = (ev.get("args") or {}).get("name", "")
                moved["args"] = {"name": f"host {trace.host} XLA {name}".rstrip()}
            elif "ts" in ev:
                moved["ts"] = round(float(ev["ts"]) + shift, 3)
            out.append(moved)
    return out


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def _meta(name: str, pid: int, tid: int, label: str) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}}


def _flow(ph: str, r: Any, pid: int, tid: int, at: float) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "name": "transfer",
        "cat": "transfer",
        "ph": ph,
        "id": int(r.lid),
        "ts": _us(at),
        "pid": pid,
        "tid": tid,
    }
    if ph == "f":
        ev["bp"] = "e"
    return ev

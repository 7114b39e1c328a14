"""MPMD: pipelines across islands against SPMD on one island, transfers against raw
ZeroMQ, parallel against sequential dispatch.

    python -m benchmarks.mpmd [--quick] [--json benchmarks/results/mpmd.json]

Four measurements, each side by side in one run:

- pipeline: a 4-stage MLP whose stages do equal work, one stage per single-island
  slice (4 islands x 2 devices, 1F1B with one extra warm-up forward per stage, 8
  microbatches), against the same model trained as one data-parallel SPMD
  program on one island of 8 devices (the paper's Table 2 / Fig. 10): steps per second
  and the ratio, the contenders taking turns in rounds so that drift in the machine's
  speed falls on all. The pipeline's devices keep their own gradient sums and reduce
  them once per step, as the SPMD program does (``reduce_grads="step"``); the same
  pipeline reducing every microbatch is measured beside it. Beside them, the bubble
  measured from each stage's busy intervals in the event log against the schedule's
  theoretical (S-1)/(M+S-1), and the bubble of the standard 1F1B (no extra warm-up).
  All of it at width 1024 and again at width 2048. All
  processes share this machine's cores, so the stages' programs slow each other down
  where they overlap.
- transfer: one 256 MiB array moved host to host between islands, against a raw
  ZeroMQ PUSH/PULL copy of the same bytes over TCP loopback between two processes.
- dispatch: a chain of 16 dependent programs alternating between two islands,
  submitted without waiting (parallel) against waiting for each result before
  submitting the next (sequential), for several program sizes, as in the paper's Fig. 7.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import zmq
from jax.sharding import PartitionSpec as P

import pathways_nb as pw
from benchmarks._common import cpu_split, host_pids, machine, summary, with_hosts_allocator, write

STAGES = 4
MICROBATCHES = 8
# Each stage runs one forward more than 1F1B's minimum before its first backward, so a
# backward waiting for its gradient from the next stage has a forward to run meanwhile
# (see pw.pipeline). The standard schedule's bubble is measured beside it.
EXTRA_WARMUP = 1


def layer(p: dict[str, Any], x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ p["w"] + p["b"])


def head(p: dict[str, Any], x: jax.Array) -> jax.Array:
    return x @ p["w"] + p["b"]


def mse(out: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((out - y) ** 2)


def in_width(width: int) -> int:
    """The input's features. The first stage computes no input gradient, so its backward
    is one matmul where the others' is two; inputs 1.5x as wide give it the same work as
    every other stage (2 matmuls of 1.5 w x w against 3 of w x w per microbatch), which
    is what the formula (S-1)/(M+S-1) assumes."""
    return width * 3 // 2


def init(width: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    fan_in = [in_width(width)] + [width] * (STAGES - 1)
    return [
        {
            "w": (rng.standard_normal((n, width)) / np.sqrt(n)).astype(np.float32),
            "b": np.zeros(width, np.float32),
        }
        for n in fan_in
    ]


def data(batch: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return (
        rng.standard_normal((batch, in_width(width))).astype(np.float32),
        rng.standard_normal((batch, width)).astype(np.float32),
    )


def spmd_step(opt: Any) -> Any:
    stages = [layer] * (STAGES - 1) + [head]

    def step(ps: list[Any], st: Any, x: jax.Array, y: jax.Array) -> Any:
        def loss(qs: list[Any]) -> jax.Array:
            h = x
            for f, q in zip(stages, qs, strict=True):
                h = f(q, h)
            return mse(h, y)

        v, g = jax.value_and_grad(loss)(ps)
        upd, st = opt.update(g, st, ps)
        return optax.apply_updates(ps, upd), st, v

    return step


def _cluster_pids(client: pw.Client, cluster: pw.LocalCluster) -> dict[str, int]:
    pids = {"client": os.getpid(), "controller": cluster.scheduler_pid}
    pids.update({f"host {island}": pid for island, pid in host_pids(client).items()})
    return pids


def _cpu_per_step(
    procs: dict[str, int], before: dict[str, tuple[float, float]], steps: int
) -> dict[str, float]:
    """Where a step's CPU went, in ms: the client's and controller's threads, the hosts'
    runtime threads, and the hosts' XLA threads (the devices' compute and XLA's waiting)."""
    out = {"client": 0.0, "controller": 0.0, "hosts_runtime": 0.0, "hosts_xla": 0.0}
    for name, pid in procs.items():
        base, raised = (a - b for a, b in zip(cpu_split(pid), before[name], strict=True))
        if name.startswith("host"):
            out["hosts_runtime"] += base
            out["hosts_xla"] += raised
        else:
            out[name] += base + raised
    return {k: v / steps * 1e3 for k, v in out.items()}


class _Side:
    """One contender: a step function, its state, and where its time and CPU went."""

    def __init__(self, procs: dict[str, int], run: Any, pipeline: Any = None) -> None:
        self.procs, self.run, self.pipeline = procs, run, pipeline
        self.bubbles: list[dict[str, Any]] = []
        self.seconds = 0.0
        self.cpu = dict.fromkeys(("client", "controller", "hosts_runtime", "hosts_xla"), 0.0)
        self.rounds: list[float] = []

    def timed(self, steps: int) -> None:
        before = {k: cpu_split(p) for k, p in self.procs.items()}
        t0 = time.perf_counter()
        self.run(steps)
        took = time.perf_counter() - t0
        self.seconds += took
        self.rounds.append(took)
        for k, v in _cpu_per_step(self.procs, before, 1).items():  # the whole round
            self.cpu[k] += v


def _pipeline_loop(client: Any, pstep: Any, state: list[Any], x: Any, y: Any) -> Any:
    def run(n: int) -> None:
        for _ in range(n):
            state[0], state[1], loss = pstep(state[0], state[1], x, y)
            float(loss)
        client.wait_all()  # the last backward and updates too

    return run


def pipeline_vs_spmd(steps: int, rounds: int, batch: int, width: int) -> dict[str, Any]:
    """The pipeline (per-device gradient sums, reduced once per step; and, beside it,
    reduced every microbatch) against SPMD. Both clusters stay up and the contenders take
    turns, ``steps`` steps each per round after one untimed round, so a drift in this
    machine's speed falls on all alike. Each batch is put on its devices once, as a
    loop over resident data would.

    Every contender runs the same loop: a step, then the loss fetched. A pipeline's loss
    is ready before its last backward and updates; those finish while the next step is
    submitted, and the round ends only once everything has finished. The bubble comes
    from one more step per round run on its own (waiting for all its work), so its
    events belong to it alone.
    """
    x, y = data(batch, width)
    opt = optax.sgd(1e-3)
    with (
        pw.LocalCluster(islands=STAGES, devices_per_island=2, dashboard=False) as pcluster,
        pw.Client(pcluster) as pclient,
        pw.LocalCluster(islands=1, devices_per_island=2 * STAGES, dashboard=False) as scluster,
        pw.Client(scluster) as sclient,
    ):
        slices = [pclient.allocate({"data": 2}) for _ in range(STAGES)]
        px, py = slices[0].put(x, P("data")), slices[-1].put(y, P("data"))
        pprocs = _cluster_pids(pclient, pcluster)
        sides: list[_Side] = []
        for reduce_grads, extra in (
            ("step", EXTRA_WARMUP),
            ("microbatch", EXTRA_WARMUP),
            ("step", 0),
        ):
            pstep = pw.pipeline(
                [layer] * (STAGES - 1) + [head],
                slices,
                mse,
                opt,
                microbatches=MICROBATCHES,
                schedule="1f1b",
                batch_spec=P("data"),
                reduce_grads=reduce_grads,
                extra_warmup=extra,
            )
            state = list(pstep.init(init(width)))
            run = _pipeline_loop(pclient, pstep, state, px, py)
            run(2)  # compile every program
            sides.append(_Side(pprocs, run, pstep))
        # The standard 1F1B runs only for its bubble.
        timed_sides, standard = sides[:2], sides[2]

        vs = sclient.allocate({"data": 2 * STAGES})
        sparams = [{k: vs.put(v, P()) for k, v in p.items()} for p in init(width)]
        sstate = [sparams, pw.jit(opt.init, slice=vs)(sparams)]
        train = pw.jit(spmd_step(opt), slice=vs, donate_argnums=(0, 1))
        sx, sy = vs.put(x, P("data")), vs.put(y, P("data"))

        def spmd_run(n: int) -> None:
            for _ in range(n):
                sstate[0], sstate[1], loss = train(sstate[0], sstate[1], sx, sy)
                float(loss)

        spmd_run(2)
        spmd = _Side(_cluster_pids(sclient, scluster), spmd_run)
        for side in [*timed_sides, spmd]:  # one round untimed: caches, allocator, page faults
            side.run(steps)
        for _ in range(rounds):
            for side in timed_sides:
                side.timed(steps)
            for side in sides:
                since = time.time()
                side.run(1)
                side.bubbles.append(side.pipeline.bubble(pclient.events(since=since)))
            spmd.timed(steps)

    total = rounds * steps

    def bubble_of(side: _Side) -> dict[str, Any]:
        bubbles = side.bubbles
        out = {
            "bubble_measured": statistics.median(b["mean"] for b in bubbles),
            "bubble_per_stage": {
                str(s): statistics.median(b["per_stage"][s] for b in bubbles) for s in range(STAGES)
            },
            "bubble_theoretical": bubbles[0]["theoretical"],
            # What the schedule allows for these stages' program times with hops that
            # take no time, and each stage's busy time: where the bubble comes from.
            "bubble_scheduled": statistics.median(
                b["scheduled"] for b in bubbles if b["scheduled"] is not None
            ),
            "busy_ms_per_stage": {
                str(s): 1e3 * statistics.median(b["busy_s"][s] for b in bubbles)
                for s in range(STAGES)
            },
        }
        out["bubble_ratio"] = out["bubble_measured"] / out["bubble_theoretical"]
        return out

    def summary_of(side: _Side) -> dict[str, Any]:
        return {
            "steps_per_s": total / side.seconds,
            "ratio": spmd.seconds / side.seconds,
            "ratio_per_round": [b / a for a, b in zip(side.rounds, spmd.rounds, strict=True)],
            "cpu_ms_per_step": {k: v / total for k, v in side.cpu.items()},
            **bubble_of(side),
        }

    main, exact = (summary_of(s) for s in timed_sides)
    return {
        "pipeline_steps_per_s": main["steps_per_s"],
        "spmd_steps_per_s": total / spmd.seconds,
        "ratio": main["ratio"],
        "ratio_per_round": main["ratio_per_round"],
        "pipeline_cpu_ms_per_step": main["cpu_ms_per_step"],
        "spmd_cpu_ms_per_step": {k: v / total for k, v in spmd.cpu.items()},
        "bubble_measured": main["bubble_measured"],
        "bubble_per_stage": main["bubble_per_stage"],
        "bubble_theoretical": main["bubble_theoretical"],
        "bubble_ratio": main["bubble_ratio"],
        "bubble_scheduled": main["bubble_scheduled"],
        "busy_ms_per_stage": main["busy_ms_per_stage"],
        "reduce_grads_every_microbatch": exact,
        "standard_1f1b": bubble_of(standard),
        "params": {
            "stages": STAGES,
            "microbatches": MICROBATCHES,
            "batch": batch,
            "width": width,
            "steps_per_round": steps,
            "rounds": rounds,
            "schedule": "1f1b",
            "extra_warmup": EXTRA_WARMUP,
            "reduce_grads": "step",
            "in_width": in_width(width),
        },
    }


class RawLink:
    """A raw ZeroMQ copy to another process over TCP loopback, the baseline for
    transfers: each :meth:`copy` sends ``nbytes`` and waits to hear they all arrived.
    The sink expects ``rounds`` copies."""

    def __init__(self, nbytes: int, rounds: int) -> None:
        self._ctx = zmq.Context()
        self._done = self._ctx.socket(zmq.PULL)
        back = self._done.bind_to_random_port("tcp://127.0.0.1")
        spawn = mp.get_context("spawn")
        ready = spawn.Event()
        port_q = spawn.Queue()
        self._proc = spawn.Process(target=_raw_sink, args=(back, nbytes, rounds, ready, port_q))
        self._proc.start()
        port = port_q.get(timeout=60)
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.connect(f"tcp://127.0.0.1:{port}")
        ready.wait(60)
        self._payload = np.ones(nbytes // 4, np.float32)

    def copy(self) -> float:
        t0 = time.perf_counter()
        self._push.send(memoryview(self._payload.data).cast("B"), copy=False)
        self._done.recv()
        return time.perf_counter() - t0

    def close(self) -> None:
        self._proc.join(60)
        self._push.close(0)
        self._done.close(0)
        self._ctx.term()


def _raw_sink(back: int, nbytes: int, repeats: int, ready: Any, port_q: Any) -> None:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    ack = ctx.socket(zmq.PUSH)
    ack.connect(f"tcp://127.0.0.1:{back}")
    port_q.put(port)
    ready.set()
    for _ in range(repeats):
        frame = pull.recv(copy=False)
        # The receiving side of ours copies into device memory; so does this one.
        np.frombuffer(frame.buffer, np.uint8).copy()
        ack.send(b"")
    pull.close(0)
    ack.close(0)
    ctx.term()


# Untimed rounds before a transfer is measured: the first copies of a size fault in
# fresh pages on both sides, ours and the raw copy's alike.
_TRANSFER_WARMUP = 2


def transfer(nbytes: int, repeats: int) -> dict[str, Any]:
    """A host-to-host transfer of ``nbytes`` against the raw ZeroMQ copy, taking turns
    round by round (this machine's speed drifts more between blocks of runs than between
    two runs in a row)."""
    rounds = repeats + _TRANSFER_WARMUP
    raw_link = RawLink(nbytes, rounds)
    try:
        with (
            pw.LocalCluster(islands=2, devices_per_island=2, dashboard=False) as cluster,
            pw.Client(cluster) as client,
        ):
            a = client.allocate({"x": 2})
            b = client.allocate({"x": 2})
            x = a.put(np.ones((nbytes // 4 // 1024, 1024), np.float32), P("x"))
            x.block_until_ready()
            # The consumer reads one element, so the time is the transfer's.
            move = pw.jit(lambda v: v[0, 0], slice=b, in_shardings=P("x"))
            scale = pw.jit(lambda v: v * 1.0, slice=a)
            times, logged, raws = [], [], []
            for i in range(rounds):
                src = scale(x)
                src.block_until_ready()
                since = time.time()
                t0 = time.perf_counter()
                float(move(src))
                took = time.perf_counter() - t0
                raw = raw_link.copy()
                if i >= _TRANSFER_WARMUP:
                    times.append(took)
                    raws.append(raw)
                    # The transfer's end reaches the event log once the controller has
                    # its acknowledgement, which may follow the consumer's answer.
                    client.wait_all()
                    ev = client.events(since=since)
                    t = ev[ev.program == "transfer"].set_index("kind").time
                    logged.append((t["end"] - t["start"]).total_seconds())
                del src
    finally:
        raw_link.close()
    ours = statistics.median(times)
    raw_s = statistics.median(raws)
    return {
        "bytes": nbytes,
        "pathways_s": ours,
        "pathways_gib_per_s": nbytes / ours / 2**30,
        # From the source's first byte to the array assembled on the destination.
        "event_log_transfer_s": statistics.median(logged),
        "raw_zmq_s": raw_s,
        "raw_zmq_gib_per_s": nbytes / raw_s / 2**30,
        "ratio": raw_s / ours,
        "round_ratios": [r / t for r, t in zip(raws, times, strict=True)],
        "target_ratio": 0.7,
    }


def dispatch(chain: int, repeats: int, sizes: list[int]) -> dict[str, Any]:
    """Parallel against sequential dispatch of a chain alternating between two islands,
    for several program sizes (the gap is widest where programs are short)."""
    out: dict[str, Any] = {"chain": chain, "sizes": {}}
    with (
        pw.LocalCluster(islands=2, devices_per_island=2, dashboard=False) as cluster,
        pw.Client(cluster) as client,
    ):
        a = client.allocate({"x": 2})
        b = client.allocate({"x": 2})

        def body(v: jax.Array) -> jax.Array:
            m = jnp.tanh(v @ v.T)
            return v + 1e-3 * (m @ v)

        fa = pw.jit(body, slice=a)
        fb = pw.jit(body, slice=b)
        for work in sizes:
            x0 = a.put(np.ones((work, work), np.float32) / work, P())

            def run(parallel: bool, x0: Any = x0) -> float:
                x = x0
                t0 = time.perf_counter()
                for i in range(chain):
                    x = (fa if i % 2 == 0 else fb)(x)
                    if not parallel:
                        x.block_until_ready()
                x.block_until_ready()
                return time.perf_counter() - t0

            run(True)
            # Interleaved, and compared repeat by repeat: the machine's speed drifts
            # more between blocks of runs than between two runs in a row.
            par, seq = [], []
            for _ in range(repeats):
                par.append(run(True))
                seq.append(run(False))
            one = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fa(x0).block_until_ready()
                one.append(time.perf_counter() - t0)
            out["sizes"][str(work)] = {
                "parallel_s": summary(par),
                "sequential_s": summary(seq),
                "one_program_round_trip_s": statistics.median(one),
                "speedup": statistics.median(q / p for p, q in zip(par, seq, strict=True)),
            }
    smallest = out["sizes"][str(min(sizes))]
    out["speedup_smallest"] = smallest["speedup"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    ap.add_argument("--json", default="benchmarks/results/mpmd.json")
    args = ap.parse_args(argv)
    q = args.quick
    result: dict[str, Any] = {
        "benchmark": "mpmd",
        "machine": machine(),
        "pipeline": pipeline_vs_spmd(
            steps=2 if q else 5,
            rounds=1 if q else 4,
            batch=64 if q else 1024,
            width=32 if q else 1024,
        ),
        # Programs four times longer: the same fixed cost per hop between stages weighs
        # less against them.
        "pipeline_wide": pipeline_vs_spmd(
            steps=1 if q else 3,
            rounds=1 if q else 3,
            batch=64 if q else 1024,
            width=64 if q else 2048,
        ),
        "transfer": transfer(nbytes=(8 if q else 256) * 2**20, repeats=2 if q else 8),
        "dispatch": dispatch(chain=16, repeats=2 if q else 9, sizes=[16, 64, 256]),
    }
    result["targets_met"] = {
        "pipeline_ge_0.9x_spmd": result["pipeline"]["ratio"] >= 0.9,
        "bubble_within_1.2x": result["pipeline"]["bubble_ratio"] <= 1.2,
        "pipeline_wide_ge_0.9x_spmd": result["pipeline_wide"]["ratio"] >= 0.9,
        "bubble_wide_within_1.2x": result["pipeline_wide"]["bubble_ratio"] <= 1.2,
        "transfer_ge_0.7x_raw": result["transfer"]["ratio"] >= 0.7,
        "parallel_dispatch_ahead": result["dispatch"]["speedup_smallest"] > 1.2,
    }
    write(result, args.json)
    return 0


if __name__ == "__main__":
    with_hosts_allocator()
    raise SystemExit(main())

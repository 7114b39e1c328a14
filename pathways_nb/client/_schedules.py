"""Pipeline schedules as data: the order each stage runs its forwards and backwards
(GPipe, 1F1B with optional extra warm-up forwards), the order a client submits them in,
and the idle fractions they give, from the formula and from program times."""

from __future__ import annotations

import dataclasses

SCHEDULES = ("gpipe", "1f1b")


@dataclasses.dataclass(frozen=True)
class Op:
    """One step of a schedule: ``kind`` F (forward), B (backward) or L (the last stage's
    fused forward, loss and backward) of ``microbatch`` on ``stage``."""

    kind: str
    stage: int
    microbatch: int


def stage_orders(
    stages: int, microbatches: int, schedule: str, extra_warmup: int = 0
) -> list[list[Op]]:
    """What each stage runs, in order, under ``schedule``.

    Under 1F1B, stage ``s`` runs ``S-1-s`` forwards before its first backward, plus
    ``extra_warmup`` (see :func:`pipeline`), at most all of them.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}")
    if stages < 1 or microbatches < 1:
        raise ValueError(
            f"a pipeline needs at least one stage and one microbatch; got {stages} stages "
            f"and {microbatches} microbatches"
        )
    if isinstance(extra_warmup, bool) or not isinstance(extra_warmup, int) or extra_warmup < 0:
        raise ValueError(f"extra_warmup is a count of forwards, an int >= 0; got {extra_warmup!r}")
    if extra_warmup and schedule != "1f1b":
        raise ValueError(
            f"extra_warmup applies to the 1f1b schedule; {schedule!r} runs every forward "
            "before any backward already: leave extra_warmup at 0"
        )
    last, m_all = stages - 1, range(microbatches)
    orders = []
    for s in range(last):
        if schedule == "gpipe":
            order = [Op("F", s, m) for m in m_all] + [Op("B", s, m) for m in m_all]
        else:
            warm = min(last - s + extra_warmup, microbatches)
            order = [Op("F", s, m) for m in range(warm)]
            for m in range(microbatches - warm):
                order += [Op("F", s, warm + m), Op("B", s, m)]
            order += [Op("B", s, m) for m in range(microbatches - warm, microbatches)]
        orders.append(order)
    orders.append([Op("L", last, m) for m in m_all])
    return orders


def _depends_on(op: Op, last: int) -> Op | None:
    """The one step whose output ``op`` takes (None for the first stage's forwards):
    a forward the previous stage's forward, the last stage that stage's forward, a
    backward the next stage's backward (or the last stage's fused step)."""
    if op.kind == "F":
        return Op("F", op.stage - 1, op.microbatch) if op.stage else None
    if op.kind == "L":
        return Op("F", last - 1, op.microbatch) if last else None
    return Op("L" if op.stage + 1 == last else "B", op.stage + 1, op.microbatch)


def submission_order(orders: list[list[Op]]) -> list[Op]:
    """One global order that keeps every stage's order and every data dependency."""
    last = len(orders) - 1
    done: set[Op] = set()

    def ready(op: Op) -> bool:
        dep = _depends_on(op, last)
        return dep is None or dep in done

    out: list[Op] = []
    pos = [0] * len(orders)
    total = sum(len(o) for o in orders)
    while len(out) < total:
        progressed = False
        for s, order in enumerate(orders):
            while pos[s] < len(order) and ready(order[pos[s]]):
                out.append(order[pos[s]])
                done.add(order[pos[s]])
                pos[s] += 1
                progressed = True
        if not progressed:
            raise ValueError("the stage orders cannot be merged: a stage waits on itself")
    return out


def theoretical_bubble(stages: int, microbatches: int) -> float:
    """The idle fraction of an ideal GPipe or 1F1B schedule: (S-1) / (M+S-1)."""
    return (stages - 1) / (microbatches + stages - 1)


def scheduled_bubble(
    orders: list[list[Op]], seconds: dict[tuple[int, str], float], hop: float = 0.0
) -> float:
    """The mean idle fraction of the stages when ``orders`` runs with each program taking
    ``seconds[(stage, kind)]`` and each activation or gradient taking ``hop`` seconds
    from one stage to the next.

    The formula of :func:`theoretical_bubble` holds for stages of equal cost and hops
    that take no time; with ``hop=0`` this is what the schedule allows for stages as
    they are, so the difference between it and a measured bubble is what the hops and
    dispatch between stages cost.
    """
    last = len(orders) - 1
    end: dict[Op, float] = {}
    free = [0.0] * len(orders)
    for op in submission_order(orders):
        dep = _depends_on(op, last)
        start = max(free[op.stage], end[dep] + hop if dep is not None else 0.0)
        end[op] = free[op.stage] = start + seconds[(op.stage, op.kind)]
    span = max(free)
    if span <= 0:
        return 0.0
    busy = [sum(seconds[(op.stage, op.kind)] for op in order) for order in orders]
    return sum(1.0 - b / span for b in busy) / len(orders)


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """The time covered by ``intervals`` (start, end), overlaps counted once."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total

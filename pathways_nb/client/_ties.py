"""Parameters tied across pipeline stages, such as an input embedding that is also the
output projection.

Each stage keeps a copy of its own; the copies start from one value (the group's first
member's), and every step adds up their gradients before the updates, so every copy takes
the same update and they stay equal: the same training as one parameter used in two places
of one program. A path is the keys that lead to the leaf in the stage's parameter tree
(dict keys, sequence indices, attribute names), e.g. ``(0, "embed")`` and ``(3, "embed")``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

Path = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Tie:
    """One group of tied leaves: (stage, path) pairs, the first the one whose value the
    others start from."""

    members: tuple[tuple[int, Path], ...]

    def __str__(self) -> str:
        return " = ".join(f"params[{s}]{_path_text(p)}" for s, p in self.members)


def parse_ties(tied: Any, stages: int) -> list[Tie]:
    """``tied`` as groups of (stage, path) pairs; a clear error for anything else."""
    if tied is None:
        return []
    example = "tied=[((0, 'embed'), (3, 'embed'))]"
    if not isinstance(tied, list | tuple):
        raise TypeError(f"tied is a list of groups of (stage, *keys), e.g. {example}; got {tied!r}")
    out = []
    seen: dict[tuple[int, Path], int] = {}
    for g, group in enumerate(tied):
        if not isinstance(group, list | tuple) or len(group) < 2:
            raise ValueError(
                f"tied[{g}] must name two or more leaves, each as (stage, *keys), e.g. "
                f"{example}; got {group!r}"
            )
        members = []
        for member in group:
            if (
                not isinstance(member, tuple)
                or len(member) < 2
                or isinstance(member[0], bool)
                or not isinstance(member[0], int)
            ):
                raise TypeError(
                    f"tied[{g}]: each leaf is (stage, *keys), a stage index and the keys to "
                    f"the leaf in that stage's parameters; got {member!r}"
                )
            stage, path = member[0], tuple(member[1:])
            if not 0 <= stage < stages:
                raise ValueError(f"tied[{g}]: stage {stage} is not one of the {stages} stages")
            if (stage, path) in seen:
                raise ValueError(
                    f"tied[{g}]: params[{stage}]{_path_text(path)} is tied already, in "
                    f"tied[{seen[(stage, path)]}]; one group per leaf"
                )
            seen[(stage, path)] = g
            members.append((stage, path))
        if len({s for s, _ in members}) != len(members):
            raise ValueError(
                f"tied[{g}] ties two leaves of one stage; a stage uses one leaf twice "
                "within its own function instead"
            )
        out.append(Tie(tuple(members)))
    return out


def leaf_at(tree: Any, path: Path) -> Any:
    """The leaf at ``path`` in ``tree``."""
    node = tree
    for key in path:
        node = node[key] if isinstance(node, dict | list | tuple) else getattr(node, key)
    return node


def with_leaf(tree: Any, path: Path, value: Any) -> Any:
    """``tree`` with the leaf at ``path`` replaced by ``value``; the containers on the
    way are copied, the rest is shared."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, key: with_leaf(tree[key], rest, value)}
    if isinstance(tree, list):
        return [with_leaf(v, rest, value) if i == key else v for i, v in enumerate(tree)]
    if isinstance(tree, tuple) and hasattr(tree, "_replace"):  # a named tuple
        named: Any = tree
        name = named._fields[key] if isinstance(key, int) else key
        return named._replace(**{name: with_leaf(getattr(named, name), rest, value)})
    if isinstance(tree, tuple):
        return tuple(with_leaf(v, rest, value) if i == key else v for i, v in enumerate(tree))
    return dataclasses.replace(tree, **{key: with_leaf(getattr(tree, key), rest, value)})


def check_ties(ties: Sequence[Tie], params: Sequence[Any]) -> None:
    """Refuse a path that leads nowhere, and tied leaves of different shapes or dtypes."""
    for tie in ties:
        found = []
        for s, path in tie.members:
            try:
                value = leaf_at(params[s], path)
            except (KeyError, IndexError, AttributeError, TypeError):
                raise ValueError(
                    f"tied: params[{s}] has no leaf at {_path_text(path)} ({tie})"
                ) from None
            shape = getattr(value, "shape", None)
            dtype = getattr(value, "dtype", None)
            if shape is None or dtype is None:
                raise ValueError(
                    f"tied: params[{s}]{_path_text(path)} is a {type(value).__name__}, not an "
                    f"array ({tie})"
                )
            found.append((tuple(shape), str(dtype)))
        if len(set(found)) > 1:
            raise ValueError(
                f"tied leaves must have one shape and dtype; {tie} are "
                f"{[f'{d}{list(sh)}' for sh, d in found]}"
            )


def started_alike(ties: Sequence[Tie], params: Sequence[Any]) -> list[Any]:
    """``params`` with every tied leaf set to its group's first member's value."""
    out = list(params)
    for tie in ties:
        (s0, p0), *rest = tie.members
        value = leaf_at(out[s0], p0)
        for s, path in rest:
            out[s] = with_leaf(out[s], path, value)
    return out


def followers(ties: Sequence[Tie], stage: int) -> list[Path]:
    """The paths of ``stage``'s tied leaves that are not their group's first: a global
    gradient norm counts each group once, at its first member."""
    return [p for tie in ties for s, p in tie.members[1:] if s == stage]


def tied_sum(own: Any, *every: Any) -> Any:
    """A tied leaf's gradient on one stage: the sum of every copy's (this one's among
    them, the others moved here), added in the group's order on every stage, so that
    every copy gets the same bits."""
    del own  # among ``every``, in its place
    return _in_order(every)


def device_total(per_device: Any) -> Any:
    """A tied leaf's per-device gradient sums (``reduce_grads="step"``: one row per
    device) added up."""
    return per_device.sum(0)


def tied_sum_per_device(own: Any, *totals: Any) -> Any:
    """A tied leaf's per-device gradient sums replaced by every copy's total
    (``device_total``) in the first device's row and zeros in the others: the update,
    which adds the rows up, gets the sum of all, the same bits on every stage."""
    return jnp.zeros_like(own).at[0].set(_in_order(totals))


def _in_order(values: Sequence[Any]) -> Any:
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


def _path_text(path: Path) -> str:
    return "".join(f"[{k!r}]" for k in path)

"""What each side reports at connect, and the check that refuses a mismatch."""

from __future__ import annotations

import dataclasses
from importlib import metadata
from typing import Any

PROTOCOL_VERSION = 3


@dataclasses.dataclass(frozen=True)
class Versions:
    """Versions that must agree between client, controller and hosts."""

    protocol: int
    package: str
    jax: str
    jaxlib: str
    export_max: int
    export_min: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: Any) -> Versions:
        if not isinstance(d, dict):
            raise ValueError(f"expected a versions mapping, got {type(d).__name__}")
        fields = {f.name for f in dataclasses.fields(Versions)}
        missing = fields - set(d)
        if missing:
            raise ValueError(f"versions mapping lacks {sorted(missing)}")
        return Versions(**{k: d[k] for k in fields})

    def mismatch(self, other: Versions, me: str, them: str) -> str | None:
        """Why ``self`` (role ``me``) cannot talk to ``other`` (role ``them``), or None.

        Programs cross from client to host as ``jax.export`` artifacts, so the package,
        the protocol, and jax/jaxlib must match exactly; the export calling-convention
        ranges must overlap.
        """
        problems = []
        if self.protocol != other.protocol:
            problems.append(
                f"wire protocol {self.protocol} on the {me}, {other.protocol} on the {them}"
            )
        for name in ("package", "jax", "jaxlib"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                label = "pathways_nb" if name == "package" else name
                problems.append(f"{label} {mine} on the {me}, {theirs} on the {them}")
        known = min(self.export_min, other.export_min) >= 0
        if known and (self.export_min > other.export_max or other.export_min > self.export_max):
            problems.append(
                f"jax.export calling conventions {self.export_min}..{self.export_max} on the {me}, "
                f"{other.export_min}..{other.export_max} on the {them}"
            )
        if not problems:
            return None
        return (
            "; ".join(problems)
            + f". Install the same versions on both sides (upgrade whichever of the {me} or the "
            f"{them} is older, e.g. `pip install -U pathways_nb jax jaxlib`)."
        )


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def local_versions(with_export: bool = True) -> Versions:
    """The versions of this process.

    ``with_export=False`` leaves the export range unknown (-1) so that the controller,
    which never touches programs, need not import JAX.
    """
    lo = hi = -1
    if with_export:
        from jax import export

        lo = int(export.minimum_supported_calling_convention_version)
        hi = int(export.maximum_supported_calling_convention_version)
    return Versions(
        protocol=PROTOCOL_VERSION,
        package=_dist_version("pathways_nb"),
        jax=_dist_version("jax"),
        jaxlib=_dist_version("jaxlib"),
        export_max=hi,
        export_min=lo,
    )

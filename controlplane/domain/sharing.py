"""GPU sharing modes, MIG geometry and the GPU-equivalent quota unit.

Kept free of I/O so both the API validation and the pure scheduling core use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction


class SharingKind(StrEnum):
    EXCLUSIVE = "exclusive"
    MIG = "mig"
    MPS = "mps"
    TIMESLICE = "timeslice"


class InvalidSharingMode(ValueError):
    pass


# Maximum instances per GPU for each MIG profile, keyed by GPU model, from the NVIDIA MIG user
# guide (cross-checked against mig-parted and GKE's partition tables). The same profile string
# has different geometry on different GPUs, so lookups are always (model, profile).
MIG_PROFILES: dict[str, dict[str, int]] = {
    "A100-40GB": {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
    "A100-80GB": {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
    "H100-80GB": {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
    "H200-141GB": {
        "1g.18gb": 7,
        "1g.35gb": 4,
        "2g.35gb": 3,
        "3g.71gb": 2,
        "4g.71gb": 1,
        "7g.141gb": 1,
    },
}

# Memory slices (eighths of the GPU's memory) each profile takes; a GPU has 8.
_MEMORY_EIGHTHS: dict[str, dict[str, int]] = {
    "A100-40GB": {"1g.5gb": 1, "1g.10gb": 2, "2g.10gb": 2, "3g.20gb": 4, "4g.20gb": 4, "7g.40gb": 8},
    "A100-80GB": {"1g.10gb": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 4, "4g.40gb": 4, "7g.80gb": 8},
    "H100-80GB": {"1g.10gb": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 4, "4g.40gb": 4, "7g.80gb": 8},
    "H200-141GB": {"1g.18gb": 1, "1g.35gb": 2, "2g.35gb": 2, "3g.71gb": 4, "4g.71gb": 4, "7g.141gb": 8},
}
_COUNT = re.compile(r"[1-9][0-9]{0,3}")
MIG_PROFILE_PATTERN = r"^[1-7]g\.[0-9]+gb$"
_PROFILE = re.compile(r"([1-7])g\.[0-9]+gb")

# mig-parted's `all-balanced` layout: 1g x2 + 2g x1 + 3g x1 on A100, H100 and H200.
_BALANCED = {
    "A100-40GB": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
    "A100-80GB": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    "H100-80GB": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    "H200-141GB": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
}


def sharing_pattern(profiles: Iterable[str] | None = None) -> str:
    """The syntax `SharingMode.parse` takes, as an ECMA-262 and Python pattern (no surrounding
    spaces). With `profiles` (a GPU model's), MIG layouts exactly as `mig_slices_per_gpu` reads them,
    made of those profiles; without, any `mig:` text (the model decides, and says why not). How many
    instances a layout asks for, against one GPU's slices, is `mig_slices_per_gpu`'s to say."""
    shares = r"exclusive|(mps|timeslice):([2-9]|[1-9][0-9]{1,3})"
    if profiles is None:
        return rf"^({shares}|mig:.+)$"
    profile = "(" + "|".join(re.escape(p) for p in profiles) + ")"
    part = rf"{profile}(\*{_COUNT.pattern})?"
    return rf"^({shares}|mig:(all-balanced|all-{profile}|{part}(\+{part})*))$"


def mig_compute_slices(profile: str) -> int:
    """Compute slices of a MIG profile (`3g.40gb` -> 3)."""
    match = _PROFILE.fullmatch(profile)
    if match is None:
        raise InvalidSharingMode(f"'{profile}' is not a MIG profile like 3g.40gb")
    return int(match.group(1))


def mig_gpu_eq(profile: str) -> Fraction:
    return Fraction(mig_compute_slices(profile), 7)


@dataclass(frozen=True)
class SharingMode:
    """How a pool's GPUs are offered: whole, as MIG slices, or as MPS / time-slice shares."""

    kind: SharingKind
    replicas: int = 1
    mig_layout: str = ""

    @classmethod
    def parse(cls, text: str) -> SharingMode:
        kind, _, arg = text.strip().partition(":")
        if kind == SharingKind.EXCLUSIVE and not arg:
            return cls(SharingKind.EXCLUSIVE)
        if kind in (SharingKind.MPS, SharingKind.TIMESLICE):
            if not _COUNT.fullmatch(arg) or int(arg) < 2:
                raise InvalidSharingMode(f"'{text}': {kind} needs a replica count of at least 2, e.g. {kind}:4")
            return cls(SharingKind(kind), replicas=int(arg))
        if kind == SharingKind.MIG:
            if not arg:
                raise InvalidSharingMode(f"'{text}': mig needs a layout, e.g. mig:all-balanced")
            return cls(SharingKind.MIG, mig_layout=arg)
        raise InvalidSharingMode(
            f"'{text}' is not a sharing mode; use exclusive, mig:<layout>, mps:<n> or timeslice:<n>"
        )

    def __str__(self) -> str:
        if self.kind is SharingKind.EXCLUSIVE:
            return "exclusive"
        if self.kind is SharingKind.MIG:
            return f"mig:{self.mig_layout}"
        return f"{self.kind}:{self.replicas}"

    @property
    def isolated(self) -> bool:
        """Time-slicing gives tenants no memory or fault isolation."""
        return self.kind is not SharingKind.TIMESLICE

    @property
    def shared(self) -> bool:
        return self.kind in (SharingKind.MPS, SharingKind.TIMESLICE)

    def mig_slices_per_gpu(self, gpu_model: str) -> dict[str, int]:
        """MIG instances each GPU of `gpu_model` carries under this layout.

        Layouts: `all-<profile>` (as many of one profile as fit), `all-balanced`, or an explicit
        list `1g.10gb*2+2g.20gb+3g.40gb`.
        """
        if self.kind is not SharingKind.MIG:
            return {}
        table = MIG_PROFILES.get(gpu_model)
        if table is None:
            raise InvalidSharingMode(
                f"GPU model {gpu_model} does not support MIG; MIG models: {', '.join(MIG_PROFILES)}"
            )
        layout = self.mig_layout
        if layout == "all-balanced":
            return dict(_BALANCED[gpu_model])
        if layout.startswith("all-"):
            profile = layout[4:]
            if profile not in table:
                raise InvalidSharingMode(f"{gpu_model} has no MIG profile {profile}")
            return {profile: table[profile]}
        slices: dict[str, int] = {}
        for part in layout.split("+"):
            profile, star, count = part.partition("*")
            if profile not in table:
                raise InvalidSharingMode(f"{gpu_model} has no MIG profile {profile}")
            if star and not _COUNT.fullmatch(count):
                raise InvalidSharingMode(f"MIG layout {layout}: '{count}' is not a positive count")
            slices[profile] = slices.get(profile, 0) + (int(count) if star else 1)
        if sum(mig_compute_slices(p) * n for p, n in slices.items()) > 7:
            raise InvalidSharingMode(f"MIG layout {layout} needs more than 7 compute slices")
        for profile, instances in slices.items():
            if instances > table[profile]:
                raise InvalidSharingMode(
                    f"{gpu_model} holds at most {table[profile]} x {profile}, layout asks {instances}"
                )
        if sum(_MEMORY_EIGHTHS[gpu_model][p] * n for p, n in slices.items()) > 8:
            raise InvalidSharingMode(f"MIG layout {layout} needs more than the 8 memory slices of a {gpu_model}")
        return slices


def shares_for_fraction(fraction: float, replicas: int) -> int:
    """Shared slots a fractional request needs on a pool split into `replicas` shares per GPU."""
    return max(1, math.ceil(fraction * replicas - 1e-9))

"""GPU price table and cost projection for the dry run.

Figures are published prices and our measured step times, dated: prices move, so every ``GpuPrice`` carries the date
they were true on and output should show it. Money is ``decimal.Decimal`` throughout, because job specs carry budgets
as strings (``maxCostUSD: "5.00"``) and binary floats cannot hold cents exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Protocol

from nodus.core.errors import NodusError

PRICES_AS_OF = date(2026, 10, 26)
SECONDS_PER_HOUR = Decimal(3600)
CENT = Decimal("0.01")
BYTES_PER_GB = 10**9  # decimal gigabytes, as the estimate reports them


class UnknownGpu(NodusError):
    """A GPU name that is not in the price table."""


class InvalidCostInput(NodusError):
    """A negative or non-numeric step count, step time or rate."""


@dataclass(frozen=True)
class GpuPrice:
    name: str  # as vendors write it, with the memory size, e.g. "H100 SXM 80 GB"
    memory_gb: int
    seconds_per_step: Decimal  # one training step of the default GRPO job
    usd_per_hour: Decimal
    as_of: date
    aliases: tuple[str, ...] = ()


def _price(name: str, memory_gb: int, seconds_per_step: str, usd_per_hour: str, *aliases: str) -> GpuPrice:
    return GpuPrice(name, memory_gb, Decimal(seconds_per_step), Decimal(usd_per_hour), PRICES_AS_OF, aliases)


GPU_PRICES: tuple[GpuPrice, ...] = (
    _price("H100 SXM 80 GB", 80, "0.45", "2.600", "h100", "h100-sxm"),
    _price("A100 80 GB", 80, "0.7", "1.090", "a100"),
    _price("L40S 48 GB", 48, "1", "0.793", "l40s"),
    _price("RTX 4090 24 GB", 24, "1.2", "0.290", "4090", "rtx4090"),
    _price("RTX A6000 48 GB", 48, "1.3", "0.333", "a6000", "rtx-a6000"),
)


def _normalized(name: str) -> str:
    """Case, spaces and dashes do not matter: "RTX 4090", "rtx-4090" and "rtx4090" are one name."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _names(gpu: GpuPrice) -> set[str]:
    full = _normalized(gpu.name)
    without_memory = full.removesuffix(f"{gpu.memory_gb}gb")
    return {full, without_memory, *(_normalized(alias) for alias in gpu.aliases)}


def lookup_gpu(name: str) -> GpuPrice:
    """The table entry for ``name``: its full name or a short alias (``h100``, ``a100``, ``l40s``, ``4090``, ...)."""
    wanted = _normalized(name)
    for gpu in GPU_PRICES:
        if wanted and wanted in _names(gpu):
            return gpu
    known = ", ".join(f"{gpu.name} ({gpu.aliases[0]})" for gpu in GPU_PRICES)
    raise UnknownGpu(f"unknown GPU {name!r}; known GPUs: {known}")


@dataclass(frozen=True)
class CostProjection:
    seconds: Decimal
    usd: Decimal  # rounded up to the cent: a projection checked against a budget must not round in its own favour


def _non_negative(label: str, value: Decimal | int | float | str) -> Decimal:
    try:
        number = Decimal(str(value))  # str() first, so 0.45 is 0.45 and not its binary approximation
    except InvalidOperation:
        raise InvalidCostInput(f"{label} must be a number, got {value!r}") from None
    if not number.is_finite() or number < 0:
        raise InvalidCostInput(f"{label} must be a finite number of 0 or more, got {value}")
    return number


def parse_usd_per_hour(text: str, name: str = "--gpu-rate") -> Decimal:
    """A rate the user typed (--gpu-rate, or the API's gpu_rate)."""
    try:
        rate = Decimal(text)
    except InvalidOperation:
        raise InvalidCostInput(f"{name} {text!r} is not a number of USD per hour, e.g. 2.60") from None
    if not rate.is_finite() or rate < 0:
        raise InvalidCostInput(f"{name} {text} must be 0 or more USD per hour")
    return rate


def project_cost(
    steps: int,
    seconds_per_step: Decimal | int | float | str,
    usd_per_hour: Decimal | int | float | str,
    eval_seconds: Decimal | int | float | str = 0,
) -> CostProjection:
    """Wall time ``steps × seconds_per_step + eval_seconds`` and its price at ``usd_per_hour``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise InvalidCostInput(f"steps must be a whole number of 0 or more, got {steps!r}")
    seconds = steps * _non_negative("seconds per step", seconds_per_step) + _non_negative("eval seconds", eval_seconds)
    usd = (seconds * _non_negative("USD per hour", usd_per_hour) / SECONDS_PER_HOUR).quantize(CENT, ROUND_CEILING)
    return CostProjection(seconds=seconds, usd=usd)


class SizedEstimate(Protocol):
    """Anything with a byte total, e.g. ``nodus.trainer.estimate.MemoryEstimate``."""

    @property
    def total_bytes(self) -> int: ...


def fits(estimate: SizedEstimate, gpu: GpuPrice) -> tuple[bool, str]:
    """Whether the estimate fits in ``gpu``'s memory, with a one-line message for the dry run.

    Capacity is taken as ``memory_gb × 1e9`` bytes. Vendors' "80 GB" is really 80 GiB (85.9e9 bytes), so this leaves
    about 7% unclaimed, roughly what the CUDA context and allocator take, which the estimate does not count.
    """
    capacity = gpu.memory_gb * BYTES_PER_GB
    needed_gb = estimate.total_bytes / BYTES_PER_GB
    if estimate.total_bytes <= capacity:
        spare_gb = (capacity - estimate.total_bytes) / BYTES_PER_GB
        return True, (
            f"fits {gpu.name}: {needed_gb:.2f} GB estimated of {gpu.memory_gb} GB, "
            f"{spare_gb:.2f} GB left for activations and logits"
        )
    over_gb = (estimate.total_bytes - capacity) / BYTES_PER_GB
    return False, (
        f"does not fit {gpu.name}: {needed_gb:.2f} GB estimated, {over_gb:.2f} GB over its {gpu.memory_gb} GB; "
        "use QLoRA, fewer generations, shorter completions, or a GPU with more memory"
    )

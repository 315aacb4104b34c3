"""The benchmarks' one timing harness: interleaved rounds, peak memory, the run's environment, budgets.

Timing: every contender is warmed up, then the contenders are called in turn, one call each
per round, in an order rotated every round (interleaving spreads machine noise, e.g. other
processes on a shared CPU, over all contenders instead of penalising whichever ran during a
busy spell). The statistic is the median over rounds. CUDA calls are synchronised.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` above the allocation at the start of
the call. On CPU, where PyTorch keeps no allocator statistics, the call runs once under
``torch.profiler`` with ``profile_memory=True``, which records every allocation and free made
through PyTorch's CPU allocator (eager ops, autograd buffers, oneDNN workspaces held in tensors,
buffers of compiled inductor code); the peak of the running sum of those events is the peak
memory above the start of the call. It is exact and deterministic for tensor memory, does not
depend on how the C library recycles freed pages (as RSS does), and misses only memory allocated
outside PyTorch's allocator (e.g. oneDNN's internal scratchpad, Python objects).
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import logging
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = [
    "sync",
    "interleaved",
    "peak_memory",
    "environment",
    "Budget",
    "write_json",
]

try:  # torch 2.11 sets this logger to DEBUG at import (gone by 2.13): every compiled scan printed its graphs
    from torch._higher_order_ops import partitioner as _hop_partitioner

    _hop_partitioner.logger.setLevel(logging.WARNING)
except (ImportError, AttributeError):
    pass


class Budget:
    """A benchmark's time budget in seconds (``None``: unlimited). A row starts only while time is left, and a
    row once started runs to its end: give the caller's hard limit a margin of one row."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()

    def left(self) -> bool:
        return self.seconds is None or time.perf_counter() - self.start < self.seconds

    def report(self, done: int, planned: int) -> dict:
        """What the run covered, for its results: rows done of planned, and whether the budget cut it short."""
        return {"budget_s": self.seconds, "rows_done": done, "rows_planned": planned, "complete": done == planned}


def write_json(path: Path, doc: dict) -> None:
    """Write ``doc`` to ``path`` whole (a temporary file renamed over it): a run stopped while writing keeps the
    rows of its previous write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def sync(device: torch.device) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(
    contenders: dict[str, Callable[[], object]],
    device: torch.device,
    *,
    warmup: int = 2,
    repeats: int = 7,
    max_seconds: float = 20.0,
    settle: bool = False,
) -> dict[str, dict]:
    """Median seconds per call of each contender, timed in rotating interleaved rounds.

    Args:
        contenders: name -> zero-argument callable doing one full call (e.g. forward+backward).
        device: where the work runs (CUDA is synchronised around every call).
        warmup: untimed calls per contender before timing (at least 1).
        repeats: timed rounds; each round calls every contender once.
        max_seconds: a contender whose timed calls add up to more than this is dropped from
            later rounds (it keeps at least 3 samples), so a very slow baseline cannot eat the
            whole time budget.
        settle: call each contender once, untimed, right before its timed call, so that the timed call
            meets the memory its own previous call left (as in a training loop, where the same step runs
            again and again) rather than its neighbour's: a contender whose buffers are too large for the
            C library to keep (glibc maps them fresh, or trims them off its heap) otherwise pays for
            whatever its neighbour did with the heap.

    Returns:
        name -> ``{"median_s", "min_s", "samples", "first_call_s"}`` (``first_call_s``: the first
        warmup call, which includes compilation for compiled contenders); a contender that
        raised gets ``{"error"}``.
    """
    results: dict[str, dict] = {}
    samples: dict[str, list[float]] = {}
    first: dict[str, float] = {}
    live: list[str] = []
    for name, fn in contenders.items():
        try:
            for i in range(max(warmup, 1)):
                sync(device)
                t0 = time.perf_counter()
                fn()
                sync(device)
                if i == 0:
                    first[name] = time.perf_counter() - t0
        except Exception as exc:  # a contender that cannot run this config is reported, not fatal
            results[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            continue
        samples[name] = []
        live.append(name)
    for r in range(repeats):
        order = live[r % len(live):] + live[: r % len(live)] if live else []
        for name in order:
            fn = contenders[name]
            if settle:
                fn()
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            samples[name].append(time.perf_counter() - t0)
        live = [n for n in live if len(samples[n]) < 3 or sum(samples[n]) < max_seconds]
    for name, s in samples.items():
        results[name] = {"median_s": statistics.median(s), "min_s": min(s), "samples": len(s),
                         "first_call_s": first[name]}
    return results


def _cpu_peak(fn: Callable[[], object]) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:  # allocations are positive, frees negative
        live += nbytes
        peak = max(peak, live)
    return peak


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated by one call of ``fn`` above the start of the call (see module doc)."""
    gc.collect()
    if device.type != "cuda":
        return _cpu_peak(fn)
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def _version(name: str) -> str | None:
    try:
        module = __import__(name)
    except Exception:
        return None
    return getattr(module, "__version__", "unknown")


def environment(device: torch.device) -> dict:
    """Device, library versions, thread count and date of a benchmark run."""
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                match = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.MULTILINE)
            if match:
                device_name = match.group(1).strip()
        except OSError:
            pass
    return {
        "device": str(device),
        "device_name": device_name,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "tensordict": _version("tensordict"),
        "torchrl": _version("torchrl"),
        "triton": _version("triton"),
        "python": platform.python_version(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }

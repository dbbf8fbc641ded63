"""What machine a benchmark ran on, read from the machine itself (never written by hand).

Usage::

    from e2e.machine import describe
    print(describe())   # machine: <CPU model>, 2 CPUs, 23.4 GiB, flags avx2 avx512f ...; torch ...

Figures copied into ``docs/results.md`` carry this line with them: a ratio measured on a CPU
with AVX-512 and 2 MiB of L2 per core need not hold on one without.
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch

#: CPU features that decide how fast torch's conversion and multiply kernels run
INTERESTING_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",
    "asimd",
    "sve",
    "sve2",
    "bf16",
)


def _cpuinfo() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, sep, value = line.partition(":")
                if sep and key.strip() not in fields:
                    fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def _cache_sizes() -> str:
    """Per-core L2 and shared L3 from sysfs (cpu0), when the kernel exposes them."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    sizes = []
    try:
        for index in sorted(i for i in os.listdir(base) if i.startswith("index")):
            folder = os.path.join(base, index)
            with open(os.path.join(folder, "level"), encoding="utf-8") as handle:
                level = handle.read().strip()
            with open(os.path.join(folder, "type"), encoding="utf-8") as handle:
                kind = handle.read().strip()
            with open(os.path.join(folder, "size"), encoding="utf-8") as handle:
                size = handle.read().strip()
            if level in ("2", "3") and kind in ("Unified", "Data"):
                sizes.append(f"L{level} {size}")
    except OSError:
        return ""
    return ", ".join(sizes)


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def describe() -> str:
    """One line: CPU model, CPU count, memory, caches, SIMD flags, torch and its threads."""
    info = _cpuinfo()
    model = info.get("model name") or info.get("Model") or platform.processor() or "?"
    flags = set((info.get("flags") or info.get("Features") or "").split())
    shown = " ".join(f for f in INTERESTING_FLAGS if f in flags) or "none listed"
    memory = _memory_gib()
    caches = _cache_sizes()
    parts = [
        f"machine: {model} ({platform.machine()})",
        f"{os.cpu_count()} CPUs",
        f"{memory:.1f} GiB" if memory else "memory ?",
    ]
    if caches:
        parts.append(caches)
    parts.append(f"flags {shown}")
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        ", ".join(parts)
        + f"; torch {torch.__version__} (kernels {capability}), {torch.get_num_threads()} threads"
        + f" by default, load average {load:.1f}"
    )


def finish(started: float, json_path: str | None, reps: int, rows: dict) -> None:
    """A benchmark's closing lines: its total time and the load average now, and, when asked,
    its rows with this machine's line and the repetitions as JSON at ``json_path``."""
    print(f"total {time.perf_counter() - started:.0f} s, load average now {os.getloadavg()[0]:.1f}")
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump({"machine": describe(), "reps": reps, "rows": rows}, handle, indent=1)

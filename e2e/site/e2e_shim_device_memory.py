"""Only for the KV-token benchmark (``E2E_DEVICE_BYTES=<bytes>``): each process a device of its own.

On a CPU sglang sizes its KV pool from the host's free memory (``get_free_cpu_memory``:
psutil's ``MemAvailable``, or a cgroup-v2 limit less its usage), read once before the weights
load and once at sizing: on a machine other processes share, what they allocate in between
moves the pool by more than the draft's vocabulary copy does. With ``E2E_DEVICE_BYTES`` set,
that function answers ``E2E_DEVICE_BYTES`` less the anonymous memory this process holds
(``RssAnon``: its tensors, the KV pool, Python's heap): the free memory of a device of that size
that the process owns alone, which is what an accelerator reports (``mem_get_info``) to the rank
it belongs to. Everything else of sglang's sizing runs as it is (the two readings, the
``--mem-fraction-static`` slack, the cell size, the Mamba split). Pages nobody wrote are not
resident and cost nothing, as on the CPU without the shim. Announced on its first answer
(``DEVICE_LINE``), which ``benchmarks/kv_tokens.py`` requires in every log it reads.
"""

from __future__ import annotations

import os

from e2e_shim_hooks import after_import, say

ENV = "E2E_DEVICE_BYTES"
COMMON = "sglang.srt.utils.common"
#: the line the benchmark requires (its start; the size follows)
DEVICE_LINE = f"{COMMON}.get_free_cpu_memory answers a device of"


def anonymous_bytes() -> int:
    """This process's resident anonymous memory (``RssAnon`` of /proc/self/status)."""
    with open("/proc/self/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def _device_of(size: int):
    def install(module) -> None:
        told: list[bool] = []

        def get_free_cpu_memory() -> int:
            if not told:
                told.append(True)
                say(f"{DEVICE_LINE} {size} bytes less this process's RssAnon")
            return size - anonymous_bytes()

        module.get_free_cpu_memory = get_free_cpu_memory

    return install


def install() -> None:
    size = os.environ.get(ENV)
    if size:
        after_import(COMMON, _device_of(int(size)))

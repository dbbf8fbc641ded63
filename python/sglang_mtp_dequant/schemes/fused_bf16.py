"""One pass from integer codes to bf16: ``bf16((q - offset) * scale)``, compiled by numba.

Usage::

    out = fused_bf16.decode(codes_2d, scale, offset)   # None when numba cannot run here

Why a kernel: eager torch decodes in three passes (codes -> fp32, ``(x - offset) * scale``,
fp32 -> bf16) and a dozen small operations per tensor; on the 256 small expert tensors of a
MoE draft that measured 2.5 x a plain ``q.to(torch.bfloat16)``. This kernel reads each code
once and writes its bf16 once, at about the cost of that cast (``benchmarks/bench_dequant.py``,
docs/results.md). numba rather than a hand-built extension: sglang itself requires numba
(0.5.23 pins ``numba==0.65.1``), so it costs a user nothing, JIT-compiles for the CPU it runs
on (AVX2, NEON, ...), and needs no compiler at install time.

The bits are the torch path's, which the tests compare exactly: the subtraction and the
multiplication are single fp32 IEEE operations (numba's default: no fast-math, so no fused
multiply-add), and the rounding to bf16 is round-to-nearest-even on the fp32 bits, which is
what ``c10::BFloat16`` does for every non-NaN value (inf included). NaN cannot arise: codes are
integers and the schemes refuse non-finite scales and offsets. Subtracting a zero offset is
exact, so one kernel serves offset and offset-free schemes.

Threads: whole rows are split into ``torch.get_num_threads()`` chunks at most (none smaller
than ``_MIN_CHUNK_ELEMENTS``) run by numba's parallel loop. Tried on the MoE set before this:
a pool of Python threads around a serial kernel paid a thread wake-up per tensor (hundreds of
small tensors) and left torch's own pool asleep for the loader's next copy; numba's workqueue
layer did no better; its OpenMP layer hands work over by spinning, as torch's pool does, and
is what ``make bench`` measures. On an NPU (or GPU) sglang's ``ModelRunner.load_model`` sets
torch to one thread for the whole load, so there the kernel runs on one thread, as the cast
would.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import numpy as np
import torch

logger = logging.getLogger(__name__)

# A chunk smaller than this costs more to hand to a thread than it saves.
_MIN_CHUNK_ELEMENTS = 1 << 18

#: integer code dtypes the kernel reads (int8: W8 and unpacked int4; int16: two-stage int4)
CODE_DTYPES = (torch.int8, torch.int16)


def _decode_chunks(codes, scale, offset, out, chunks):  # pragma: no cover - compiled
    """``out`` (int16 bits of bf16) from ``codes`` (rows, in) and the fp32 ``scale`` (rows,
    groups), each group a contiguous run of ``in``; ``offset`` has the shape of ``scale``, or
    no rows for an offset-free scheme. ``chunks`` runs of whole rows go to numba's threads.

    Written for LLVM's vectorizer: one plain loop over a group's slice (a loop over a computed
    index range did not vectorize well, several times slower when tried); int32 bit
    arithmetic spelled out (numba widens integer scalars to int64, halving the vector width).
    """
    rows = codes.shape[0]
    groups = scale.shape[1]
    width = codes.shape[1] // groups
    shifted = offset.shape[0] != 0
    step = (rows + chunks - 1) // chunks
    for chunk in prange(chunks):
        for r in range(chunk * step, min(rows, (chunk + 1) * step)):
            for g in range(groups):
                q = codes[r, g * width : (g + 1) * width]
                bf16 = out[r, g * width : (g + 1) * width]
                s = scale[r, g]
                o = offset[r, g] if shifted else np.float32(0)
                for j in range(width):
                    x = np.float32(q[j])
                    if shifted:
                        x = np.float32(x - o)
                    bits = np.float32(x * s).view(np.int32)
                    # to bf16, nearest with ties to even: add 0x7FFF plus the lowest kept bit
                    rounded = np.int32(bits + np.int32(0x7FFF) + np.int32((bits >> 16) & 1))
                    bf16[j] = np.int16(np.int32(rounded >> 16))


#: ``numba.prange`` once ``_compile`` has imported numba (the loop above is then compiled as a
#: parallel loop); plain ``range`` before, so importing this module never imports numba
prange = range


class _Kernel:
    """The compiled kernel, made on first use: a load that decodes nothing (a checkpoint the
    plugin does not concern) never imports numba."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compiled: Callable | None = None
        self._unavailable: str | None = None

    def compiled(self) -> Callable | None:
        with self._lock:
            if self._compiled is None and self._unavailable is None:
                self._compiled, self._unavailable = _compile()
                if self._unavailable:
                    logger.warning(
                        "sglang-mtp-dequant: %s; decoding with torch instead (same bits, "
                        "about 1.5-2.5 x slower)",
                        self._unavailable,
                    )
            return self._compiled


def _compile() -> tuple[Callable | None, str | None]:
    """The jitted kernel, or why there is none. numba caches the compiled code on disk (beside
    this file, or in its user cache when that is read-only) for the next process."""
    try:
        import numba
    except ImportError as exc:  # sglang requires numba, but a trimmed environment may not
        return None, f"numba is not importable ({exc})"
    if numba.config.DISABLE_JIT:
        # NUMBA_DISABLE_JIT would run the kernel as a Python loop: minutes per tensor
        return None, "NUMBA_DISABLE_JIT is set"
    if "NUMBA_NUM_THREADS" not in os.environ:
        # numba starts one worker per CPU at its first parallel loop (192 on a Kunpeng host,
        # in every rank); this kernel never uses more than torch's intra-op count
        numba.config.NUMBA_NUM_THREADS = max(
            1, min(numba.config.NUMBA_NUM_THREADS, torch.get_num_threads())
        )
    global prange
    prange = numba.prange
    options = {"nogil": True, "parallel": True, "boundscheck": False, "fastmath": False}
    try:
        return numba.njit(cache=True, **options)(_decode_chunks), None
    except RuntimeError:  # no writable cache location anywhere
        return numba.njit(**options)(_decode_chunks), None


_KERNEL = _Kernel()
_warm_up_started = threading.Event()


def warm_up(when: Callable[[], bool] | None = None) -> None:
    """Make the kernel ready in a background thread, once per process; with ``when``, only if
    ``when()`` (run in that thread, so a slow check costs the caller nothing) says so.

    Readiness costs ~0.9 s in a new process (importing numba, then numba loading its cached
    machine code on the first call; ~2.5 s the first time ever, compiling): more than the
    kernel saves on one dense 27B MTP layer, so it must not sit on the load's critical path.
    The plugin starts it before sglang loads the target model (``plugin.py``), which takes far
    longer than that, and again, unconditionally, when a draft load begins. A decode that
    arrives before it is done simply waits for it (numba's compile lock).
    """
    if _warm_up_started.is_set():
        return
    if when is None:
        _warm_up_started.set()
    threading.Thread(
        target=_make_ready, args=(when,), name="mtp-dequant-warm-up", daemon=True
    ).start()


def _make_ready(when: Callable[[], bool] | None) -> None:
    try:
        if when is not None:
            if not when() or _warm_up_started.is_set():
                return
            _warm_up_started.set()
        decode(torch.zeros((1, 1), dtype=torch.int8), torch.ones((1, 1)), None)
    except Exception:  # noqa: BLE001 - a warm-up must never fail a load; the decode reports
        logger.debug("sglang-mtp-dequant: kernel warm-up failed", exc_info=True)


def decode(
    codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None
) -> torch.Tensor | None:
    """bf16 ``(codes - offset) * scale`` for 2-D CPU ``codes`` and the fp32 (rows, groups)
    ``scale``/``offset`` of an ``AffineDecoder``; None when the kernel cannot run here (no
    numba, JIT disabled) or the codes are not its kind, so the caller decodes with torch.

    Kept lean: a MoE draft calls this once for each of hundreds of small tensors, and each
    microsecond here is ~0.1 % of the plain cast of such a tensor.
    """
    if codes.dtype not in CODE_DTYPES or not codes.is_cpu or codes.dim() != 2:
        return None
    if scale.dtype != torch.float32 or (offset is not None and offset.dtype != torch.float32):
        return None  # the kernel's arithmetic is fp32: other dtypes would round differently
    kernel = _KERNEL.compiled()
    if kernel is None:
        return None
    rows, in_features = codes.shape
    out = torch.empty((rows, in_features), dtype=torch.bfloat16)
    if rows == 0 or in_features == 0:
        return out
    chunks = _use_threads(min(rows * in_features // _MIN_CHUNK_ELEMENTS, rows))
    kernel(
        codes.contiguous().numpy(),
        scale.contiguous().numpy(),
        _NO_OFFSET if offset is None else offset.contiguous().numpy(),
        out.view(torch.int16).numpy(),
        chunks,
    )
    return out


#: what the kernel reads as "no offset" (no rows), for any number of groups
_NO_OFFSET = np.empty((0, 1), dtype=np.float32)

_threads_set = threading.local()


def _use_threads(wanted: int) -> int:
    """Up to ``wanted`` threads, no more than torch's intra-op count (what a plain cast would
    use) nor numba's pool; numba's setting is per calling thread and is changed only when it
    differs from the last one this thread set."""
    import numba

    threads = max(1, min(wanted, torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if getattr(_threads_set, "value", None) != threads:
        numba.set_num_threads(threads)
        _threads_set.value = threads
    return threads

"""``sglang-mtp-dequant verify``: load sglang's real draft on the CPU and check every parameter.

Usage::

    report = run_verify("/ckpt", reference="/ckpt-float-mtp.safetensors")
    print(render_verify(report))
    sys.exit(0 if report.ok else 1)
"""

from .independent import independent_dequantize
from .render import render_verify
from .report import ParamRow, VerifyReport
from .run import run_verify

__all__ = ["ParamRow", "VerifyReport", "independent_dequantize", "render_verify", "run_verify"]

"""The one place that decodes quantization schemes: codes + companions -> float weights.

Usage::

    scheme = scheme_for("W8A8_DYNAMIC")
    scheme.check_storage(weight_info, companion_infos)      # headers only
    decoder = scheme.prepare(weight_info, {"weight_scale": s, "weight_offset": o}, group_size=0)
    w_bf16 = decoder.decompress(q_int8, torch.bfloat16)

One class per scheme, registered under the description's types, declaring the companions it
reads and their storage, so ``prepare`` finds every problem before sglang streams a weight.
"""

from . import fp8, int4, int8, mx  # noqa: F401 - importing a scheme module registers its classes
from .affine import AffineDecoder, dequantize
from .base import Scheme, infer_type, known_types, register_scheme, scheme_for

__all__ = [
    "AffineDecoder",
    "Scheme",
    "dequantize",
    "infer_type",
    "known_types",
    "register_scheme",
    "scheme_for",
]

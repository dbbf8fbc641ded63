"""The one place that decodes quantization schemes: codes + companions -> float weights.

Usage::

    scheme = scheme_for("W8A8_DYNAMIC")
    scheme.check_storage(weight_info, companion_infos)      # headers only
    decoder = scheme.prepare(weight_info, {"weight_scale": s, "weight_offset": o}, group_size=0)
    w_bf16 = decoder.decompress(q_int8, torch.bfloat16)

One class per scheme, registered by the ``@register_scheme`` decorator under the type strings
``quant_model_description.json`` gives its tensors (the compressed-tensors layout: a class per
format, a registry, a ``decompress``). Each class declares the companions it reads and how
they are stored; ``prepare`` sees only those small tensors, so every dtype, shape and value
problem is found before sglang streams a single weight; ``decompress`` then runs once per
weight as it streams by, through the one pure function ``affine.dequantize``.

The arithmetic is ModelSlim's: ``w = (q - offset) * scale`` in fp32, rounded once to the
draft's dtype. int4 schemes (``int4.py``) first unpack two codes a byte; float8 schemes
(``fp8.py``) have no offset; MX schemes (``mx.py``) scale float8 or packed fp4 (e2m1) codes by
a power of two per block of 32 inputs.
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

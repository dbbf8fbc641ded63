"""The one place that decodes quantization schemes: integer codes + companions -> float weights.

Usage::

    scheme = scheme_for("W8A8_DYNAMIC")
    decoder = scheme.prepare(weight_info, {"weight_scale": s, "weight_offset": o}, group_size=0)
    w_bf16 = decoder.decompress(q_int8, torch.bfloat16)

One class per ModelSlim scheme, found through a registry keyed by the type string that
``quant_model_description.json`` gives the tensor (the compressed-tensors layout: a class per
format, a registry, a ``decompress``). ``prepare`` sees only the small companion tensors, so
every shape and value problem is found before sglang streams a single weight; ``decompress``
then runs once per weight as it streams by.

The arithmetic is ModelSlim's: ``w = (q - offset) * scale`` in fp32, rounded once to the
draft's dtype (``q = clamp(round(w / scale + offset))`` is how msmodelslim quantized it).
int4 schemes (``int4.py``) first unpack two codes a byte through the decoder's ``unpack`` hook.
"""

from .base import AffineDecoder, Scheme, infer_type, known_types, register_scheme, scheme_for
from .int4 import W4A8Dynamic, W4A16Int4
from .int8 import AffineInt8, AsymmetricInt8, StaticInt8

register_scheme(AffineInt8())
register_scheme(AsymmetricInt8())
register_scheme(StaticInt8())
register_scheme(W4A8Dynamic())
register_scheme(W4A16Int4())

__all__ = [
    "AffineDecoder",
    "AffineInt8",
    "AsymmetricInt8",
    "Scheme",
    "StaticInt8",
    "W4A8Dynamic",
    "W4A16Int4",
    "infer_type",
    "known_types",
    "register_scheme",
    "scheme_for",
]

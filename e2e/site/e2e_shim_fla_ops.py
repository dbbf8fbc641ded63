"""``@triton.jit`` functions that call the Triton builtins sglang's FLA ``op.py`` aliases.

``sglang/kernels/ops/attention/fla/op.py`` binds ``exp = tl.exp`` (and ``exp2``, ``log``,
``log2``) at module level, for its kernels to call; on a GPU Triton's compiler resolves the
alias, Triton's interpreter rejects it. ``e2e_shim_gdn`` puts these functions in their place
(the default, ``FLA_USE_FAST_OPS`` unset, branch of ``op.py``): each calls exactly the builtin
the alias named. Imported only by the GDN shim, in a process that imports sglang's FLA ops.
"""

from __future__ import annotations

import triton
import triton.language as tl

ALIASES = ("exp", "exp2", "log", "log2")


@triton.jit
def exp(x):
    return tl.exp(x)


@triton.jit
def exp2(x):
    return tl.math.exp2(x)


@triton.jit
def log(x):
    return tl.log(x)


@triton.jit
def log2(x):
    return tl.log2(x)

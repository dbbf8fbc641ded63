"""The plugin's environment switches, read one way: a typo stops the start-up, naming itself.

Usage::

    mode = env_choice("SGLANG_MTP_DEQUANT_GUARD", "error", ("error", "warn", "off"))

A switch that silently fell back to its default on a misspelt value would serve with the
behaviour the user meant to turn off (or on), so every switch is checked the same way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..errors import SettingError

#: ``on`` (default) | ``off``: the draft's own embed_tokens / lm_head never allocated where
#: sglang binds the target's into them (``draft_vocab.py``), or allocated as stock sglang does
SHARE_VOCAB_ENV = "SGLANG_MTP_DEQUANT_SHARE_VOCAB"


def env_choice(name: str, default: str, allowed: Sequence[str]) -> str:
    """Environment variable ``name``, stripped and lower-cased (``default`` when unset or
    empty); a value not in ``allowed`` raises ``SettingError`` naming it and the choices."""
    raw = os.environ.get(name, default).strip().lower() or default
    if raw not in allowed:
        raise SettingError(
            setting=name,
            problem=f"{name}={os.environ.get(name)!r} is not one of {', '.join(allowed)}",
            hint=f"set it to one of those, or unset it ({default})",
        )
    return raw

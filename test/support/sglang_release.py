"""What differs, for the tests, between the sglang releases they run in (``make compat`` runs
the activation, dense-scheme, guard and release tests in each supported release)."""

from __future__ import annotations

from sglang_mtp_dequant.serving import releases

#: the installed sglang's release, e.g. (0, 5, 20)
RELEASE = releases.installed().release or ()

#: the draft parameters sglang's own MTP ``load_weights`` leaves for the target to fill at serve
#: time (stock and plugin alike, so a load leaves them as built: never compared): ``lm_head``
#: always; the embedding too before 0.5.20, whose ``load_weights`` first maps
#: ``model.embed_tokens.weight`` itself
TARGET_FILLED = ("lm_head.weight",) + (
    ("model.embed_tokens.weight",) if RELEASE < (0, 5, 20) else ()
)

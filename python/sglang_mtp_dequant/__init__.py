"""sglang-mtp-dequant: load ModelSlim-quantized MTP/NextN draft weights correctly in SGLang.

Installed, it registers itself under sglang's general-plugin entry-point group
(``sglang.srt.plugins`` -> ``serving.plugin:register``). Three tiers, each importing only the
ones before it: ``formats/`` (what a checkpoint holds and says; no sglang), ``serving/`` (inside
sglang's processes; ``sglang_private`` the ledger of sglang's private names) and ``tools/`` (the
console script, never imported by the plugin); ``errors`` is shared by all three.
docs/design.md maps every module.
"""

__version__ = "0.1.0"

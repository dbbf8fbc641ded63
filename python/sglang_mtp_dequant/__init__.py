"""sglang-mtp-dequant: load ModelSlim-quantized MTP/NextN draft weights correctly in SGLang.

Installed, it registers itself under sglang's general-plugin entry-point group
(``sglang.srt.plugins`` -> ``serving.plugin:register``). Three tiers, each importing only the
ones before it (``test/test_packaging.py`` checks it; docs/design.md maps every module):

- ``formats/``: what a checkpoint holds and says (``description``, ``checkpoint``, ``config``,
  ``naming``, ``foreign``, ``library``, ``plan``, ``schemes/``); imports no sglang;
- ``serving/``: what runs inside sglang's processes (``plugin``, ``load``, ``stream``,
  ``drafts``, ``float_layers``, ``target_layers``, ``guard/``, ``ray_setup``, ...) and
  ``sglang_private``, the one ledger of sglang's private names;
- ``tools/``: the ``sglang-mtp-dequant`` console script (``cli``, ``doctor/``, ``verify/``,
  ``forms``, ``dryrun``, ``launch``, ...), never imported by the plugin.

``errors`` is shared by all three.
"""

__version__ = "0.1.0"

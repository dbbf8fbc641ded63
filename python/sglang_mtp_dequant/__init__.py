"""sglang-mtp-dequant: load ModelSlim-quantized MTP/NextN draft weights correctly in SGLang.

Installed, it registers itself under sglang's general-plugin entry-point group
(``sglang.srt.plugins`` -> ``serving.plugin:register``); every sglang process then hooks the
draft classes' ``load_weights``. Three tiers, each importing only the ones before it
(``test/test_packaging.py`` checks it):

- ``formats/``: what a checkpoint holds and how its codes decode; imports no sglang
  (``checkpoint``, ``config``, ``naming``, ``foreign``, ``plan``, ``schemes/``);
- ``serving/``: what runs inside sglang's processes (``plugin`` hooks, ``stream``, ``drafts``,
  ``sources``, ``ownership``, ``guard/``, ``load_record``, ``ray_setup``, ``context``), and
  ``sglang_private``, the one ledger of sglang's private names;
- ``tools/``: the ``sglang-mtp-dequant`` console script (``cli``, ``doctor/``, ``verify/``,
  ``dryrun``, ``preflight``, ``resolve``, ``activation``, ``verdicts``, the CPU set-up
  ``cpu_env`` / ``cpu_sglang``), never imported by the plugin.

``errors`` is shared by all three. docs/design.md maps every module to its job.
"""

__version__ = "0.1.0"

"""sglang-mtp-dequant: load ModelSlim-quantized MTP/NextN draft weights correctly in SGLang.

Installed, it registers itself under sglang's general-plugin entry-point group
(``sglang.srt.plugins``); every sglang process then hooks the draft classes' ``load_weights``
(see ``plugin.py``). Modules, one job each:

- ``checkpoint``: what a checkpoint folder holds (files, index, description, headers)
- ``schemes``: how each ModelSlim scheme decodes to float weights
- ``plan``: the per-tensor decision (dequantize / keep / error) for one checkpoint
- ``stream``: the transform of sglang's ``(name, tensor)`` weight stream
- ``drafts``: the hooked draft classes and their checkpoint naming
- ``plugin``: the sglang entry point and hook
"""

__version__ = "0.1.0"

"""The pieces of ``benchmarks/accept_length.py`` (``make accept``), one job per module.

- ``env``: the CPU environment shims, applied before transformers or sglang import
- ``corpus``: the byte-level training / held-out text (sglang 0.5.23's own source files)
- ``model``: the tiny Qwen3.5-shaped target and its MTP head, built from transformers modules
- ``train``: the step-budgeted training run and its cache
- ``export``: the float checkpoint (Hugging Face layout) and the ModelSlim W8A8_DYNAMIC writer
- ``writer_proof``: the writer checked byte for byte against msmodelslim's own output
- ``sglang_load``: the three draft loads through sglang's real class and weight iterator
- ``speculate``: the greedy MTP speculative-decoding simulation and its statistics
- ``report``: the table, the final line and the plot
"""

"""What the tests and the benchmarks share, importable as ``support`` (``test/`` on the path).

- ``paths``: where the fixtures are (``fixture_dir``, ``reference_file``, ``DENSE_W8``);
- ``checkpoints``: the one ModelSlim checkpoint writer and the one fixture editor;
- ``reference``: the reference dequantizer, written from the format's definition and
  independent of the package's decode path (whole tensors, fp32 / float64 formulas);
- ``hub_cache``: Hugging Face and ModelScope cache layouts (snapshots of symlinks into blobs);
- ``draft_cases``: every hooked draft class with a tiny checkpoint of its layout (pytest
  fixtures ``draft_case`` and ``audits``);
- ``real_layouts``: header-faithful replicas of published GLM-5.1 / DeepSeek-V3.2 inventories;
- ``foreign_checkpoints``: compressed-tensors and ModelOpt drafts written by their own code;
- ``cpu_sglang``: sglang's drafts built and loaded on the CPU the ways only tests need (a
  rank's world, ``load_model``, a stream with no ``ModelConfig``, hand-made configs);
- ``rank_worker``: one TP/EP rank of a draft load, as a spawned child of a test or benchmark.

Pytest's fixtures stay in ``test/conftest.py`` (and ``draft_cases``, loaded as a plugin); the
helpers live here so no test imports ``conftest``.
"""

"""Shared set-up: sglang 0.5.23's real classes on the CPU, the plugin loaded from its entry point.

What is real here: sglang's ``load_plugins()`` (which finds this package through the installed
``sglang.srt.plugins`` entry point), its ``HookRegistry``, its ``Qwen3_5ForCausalLMMTP`` and
``safetensors_weights_iterator``, and checkpoints written by msmodelslim 26.1.0. What is not:
the two CPU environment shims of ``sglang_mtp_dequant.tools.cpu_sglang`` (a torchvision operator
schema and the CUDA rotary kernel import), which only let sglang import and build on a machine
without a GPU or NPU; no test runs a forward pass.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import pytest

from support.paths import fixture_dir

#: fixtures defined beside the checkpoints they load (``draft_case``, ``audits``)
pytest_plugins = ["support.draft_cases"]


_SESSION_TMP: list[str] = []


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Every temporary file of the run under one folder, removed when the run ends.

    sglang writes lock files into the system temp dir when it resolves a hub id without
    --download-dir, torch and Ray keep caches there, and the spawned scheduler processes
    inherit the environment: ``TMPDIR`` (and pytest's own ``--basetemp``) point into this
    folder, so a test run leaves nothing behind (``pytest --basetemp DIR`` keeps DIR).
    """
    root = tempfile.mkdtemp(prefix="sglang-mtp-dequant-tests-")
    _SESSION_TMP.append(root)
    os.environ["TMPDIR"] = root
    tempfile.tempdir = root
    if not config.option.basetemp:
        config.option.basetemp = os.path.join(root, "pytest")


def pytest_unconfigure(config: pytest.Config) -> None:
    for root in _SESSION_TMP:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def sglang_cpu():
    """Prepare this process like an sglang scheduler and load plugins the way sglang does."""
    from sglang_mtp_dequant.tools.cpu_sglang import prepare_cpu_process

    prepare_cpu_process(fixture_dir("q35_dense_w8a8_dynamic"))
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang_mtp_dequant.serving.context import registered_targets

    target = "sglang.srt.models.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights"
    assert target in registered_targets(), "load_plugins() did not run this package's register()"
    return target


@pytest.fixture
def load_draft(sglang_cpu, caplog):
    """Build the real draft for a checkpoint and load it through sglang's DefaultModelLoader,
    with or without the plugin, as a draft worker does.

    ``folder`` is the checkpoint's ``--model-path`` (a folder, or a hub id in the cache), the
    other keywords sglang's server arguments of the same names. ``plugin=False`` calls
    sglang's own, unwrapped ``load_weights`` (``__wrapped__`` of the hook): exactly what stock
    sglang does.
    """
    from sglang_mtp_dequant.serving.sglang_private import unwrapped
    from sglang_mtp_dequant.tools.cpu_sglang import (
        build_draft,
        draft_model_config,
        publish_context,
        sglang_weights,
    )

    caplog.set_level(logging.INFO)

    def load(
        folder,
        *,
        plugin=True,
        draft_path=None,
        target_path=None,
        download_dir=None,
        revision=None,
        dtype="auto",
    ):
        publish_context(target_path or folder, draft_path, download_dir=download_dir, dtype=dtype)
        config = draft_model_config(draft_path or folder, revision=revision)
        model = build_draft(config)
        method = type(model).load_weights
        if not plugin:
            method = unwrapped(method)
        method(model, sglang_weights(config, model, download_dir=download_dir))
        return model

    return load


@pytest.fixture
def rmsnorm_restored():
    """Undo, after the test, what sglang's ``ModelSlimConfig`` does to ``RMSNorm`` for the whole
    process when a description lists a ``norm.bias`` (a zero bias on every norm built after):
    real behaviour the test may want, but it must not leak into the tests that follow."""
    from sglang.srt.layers.layernorm import RMSNorm

    saved = {k: RMSNorm.__dict__[k] for k in ("__init__", "forward_npu") if k in RMSNorm.__dict__}
    yield RMSNorm
    for key, value in saved.items():
        setattr(RMSNorm, key, value)


@pytest.fixture
def copy_checkpoint(tmp_path):
    """A writable copy of a fixture checkpoint (the test then changes its layout)."""

    def copy(name: str, dest: str = "ckpt") -> str:
        target = tmp_path / dest
        shutil.copytree(fixture_dir(name), target)
        return str(target)

    return copy

"""Shared set-up: sglang 0.5.23's real classes on the CPU, the plugin loaded from its entry point.

What is real here: sglang's ``load_plugins()`` (which finds this package through the installed
``sglang.srt.plugins`` entry point), its ``HookRegistry``, its ``Qwen3_5ForCausalLMMTP`` and
``safetensors_weights_iterator``, and checkpoints written by msmodelslim 26.1.0. What is not:
the two CPU environment shims of ``sglang_mtp_dequant.cpu_sglang`` (a torchvision operator
schema and the CUDA rotary kernel import), which only let sglang import and build on a machine
without a GPU or NPU; no test runs a forward pass.
"""

from __future__ import annotations

import logging
import os
import shutil

import pytest

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
MODELSLIM = os.path.join(FIXTURES, "modelslim")
REFERENCE = os.path.join(FIXTURES, "reference")

DENSE_W8 = (
    "q35_dense_w8a8_dynamic",
    "q35_dense_w8a8_static",
    "q35_dense_w8a16_asym",
    "q35_dense_w8a8_dynamic_pergroup",
)


def fixture_dir(name: str) -> str:
    return os.path.join(MODELSLIM, name)


def reference_file(name: str) -> str:
    return os.path.join(REFERENCE, f"{name}.safetensors")


@pytest.fixture(scope="session")
def sglang_cpu():
    """Prepare this process like an sglang scheduler and load plugins the way sglang does."""
    from sglang_mtp_dequant.cpu_sglang import prepare_cpu_process

    prepare_cpu_process(fixture_dir("q35_dense_w8a8_dynamic"))
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang_mtp_dequant.plugin import registered_targets

    target = "sglang.srt.models.qwen3_5_mtp.Qwen3_5ForCausalLMMTP.load_weights"
    assert target in registered_targets(), "load_plugins() did not run this package's register()"
    return target


@pytest.fixture
def load_draft(sglang_cpu, caplog):
    """Build the real draft for a checkpoint folder and load it, with or without the plugin.

    ``plugin=False`` calls sglang's own, unwrapped ``load_weights`` (``__wrapped__`` of the
    hook): exactly what stock sglang does.
    """
    from sglang_mtp_dequant.cpu_sglang import CpuDraftBuilder, publish_context

    caplog.set_level(logging.INFO)

    def load(folder, *, plugin=True, draft_path=None, target_path=None, files=None, dtype=None):
        import torch

        from sglang_mtp_dequant.cpu_sglang import safetensors_stream, weight_files

        publish_context(target_path or folder, draft_path)
        builder = CpuDraftBuilder(folder, dtype=dtype or torch.bfloat16)
        model = builder.build_draft()
        stream = safetensors_stream(files if files is not None else weight_files(folder))
        method = type(model).load_weights
        if not plugin:
            method = method.__wrapped__
        method(model, stream)
        return model

    return load


@pytest.fixture
def copy_checkpoint(tmp_path):
    """A writable copy of a fixture checkpoint (the test then changes its layout)."""

    def copy(name: str, dest: str = "ckpt") -> str:
        target = tmp_path / dest
        shutil.copytree(fixture_dir(name), target)
        return str(target)

    return copy

"""The installed sglang release against the ledger and the declared range, and what happens
outside it: the plugin registers nothing below the range (one WARNING), the CLI answers with
its own verdict, and an ImportError from sglang is never a checkpoint problem.

The release matrix (``make compat``, ``compat/run.py``) runs this file in every supported
sglang release, so the ledger's ``checked_in`` claims are checked in each of them. The tests
that need a release below the range fake only the installed version number (there is no such
sglang in this environment); the matrix also runs the real 0.5.11 (docs/results.md).
"""

from __future__ import annotations

import json
import logging
import pkgutil
import sys

import pytest

from sglang_mtp_dequant.serving import releases
from sglang_mtp_dequant.serving.sglang_private import LEDGER
from sglang_mtp_dequant.tools.cli import main
from sglang_mtp_dequant.tools.verdicts import EXIT_CODES
from support.paths import fixture_dir

INSTALLED = releases.installed()
OLD = releases.Support("0.5.11", (0, 5, 11))


def test_the_installed_sglang_is_a_tested_release():
    assert INSTALLED.tested, f"sglang {INSTALLED.version} is outside {releases.range_text()}"


def _resolves(where: str) -> bool:
    module, _, attribute = where.rpartition(".")
    try:
        return hasattr(pkgutil.resolve_name(module), attribute)
    except (ImportError, AttributeError):
        return False


#: the installed release as the ledger spells releases ("0.5.20")
RELEASE = ".".join(map(str, (INSTALLED.release or ())[:3]))


@pytest.mark.parametrize(
    "entry", [e for e in LEDGER if e.where and RELEASE in e.checked_in], ids=lambda e: e.where
)
def test_each_ledger_name_exists_in_the_releases_it_claims(sglang_cpu, entry):
    """Every ledger name said to be checked in the installed release resolves in it (the
    matrix runs this in each release; names of other releases only are not collected)."""
    assert _resolves(entry.where), f"{entry.where} is not in sglang {INSTALLED.version}"


@pytest.mark.parametrize(
    "version, release",
    [
        ("0.5.17.dev3+g1a2b", (0, 5, 17)),
        ("0.5.23rc1", (0, 5, 23)),
        ("0.5.14.post2", (0, 5, 14)),
        ("unknown", None),
    ],
)
def test_release_of_reads_dev_and_post_builds(version, release):
    assert releases.release_of(version) == release


def test_below_the_range_nothing_is_registered_and_one_warning_says_why(
    sglang_cpu, caplog, monkeypatch
):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_mtp_dequant.serving.plugin import register

    monkeypatch.setattr(releases, "installed", lambda: OLD)
    hooks_before = {target: list(hooks) for target, hooks in HookRegistry._hooks.items()}
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    register()
    ours = [r for r in caplog.records if r.name == "sglang_mtp_dequant"]
    assert [r.levelname for r in ours] == ["WARNING"], ours
    message = ours[0].getMessage()
    assert "sglang 0.5.11" in message and releases.range_text() in message, message
    assert {t: list(h) for t, h in HookRegistry._hooks.items()} == hooks_before


@pytest.mark.parametrize("command", ["doctor", "verify"])
def test_the_cli_below_the_range_says_which_sglang_it_needs(monkeypatch, capsys, command):
    monkeypatch.setattr(releases, "installed", lambda: OLD)
    code = main([command, fixture_dir("q35_dense_w8a8_dynamic"), "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert code == EXIT_CODES["needs-sglang"] == 6
    assert answer["verdict"] == "needs-sglang"
    assert f"this command needs sglang >= {releases.MINIMUM} (found 0.5.11)" in answer["reason"]


def test_an_import_error_inside_sglang_is_not_a_checkpoint_problem(sglang_cpu, monkeypatch, capsys):
    """What sglang 0.5.14-0.5.20 did before the adapters: a name sglang lacks raised an
    ImportError while the CLI resolved the checkpoint, and the doctor said the (valid) draft
    cannot be served. Here sglang's resolver raises the same ImportError."""
    from sglang_mtp_dequant.serving import sglang_private

    def missing(*_args, **_kwargs):
        raise ImportError(
            "cannot import name 'get_server_args' from 'sglang.srt.server_args'",
            name="sglang.srt.server_args",
        )

    monkeypatch.setattr(sglang_private, "prepare_weights", missing)
    code = main(["doctor", fixture_dir("q35_dense_w8a8_dynamic"), "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert code == EXIT_CODES["sglang-broken"] == 7, answer
    assert "get_server_args" in answer["reason"] and "not of the checkpoint" in answer["reason"]
    assert "not a checkpoint folder" not in json.dumps(answer)


def test_a_draft_family_that_cannot_import_does_not_stop_another(sglang_cpu, monkeypatch):
    """sglang 0.5.15's glm4_moe_nextn needs cutlass, absent on a CPU host: building a Qwen3.5
    draft as on NPU must still work, with Qwen3.5's own NPU rule answered."""
    from sglang_mtp_dequant.serving import sglang_private
    from sglang_mtp_dequant.tools.cpu_env import npu_quantization_rule
    from sglang_mtp_dequant.tools.cpu_sglang import build_draft, draft_model_config, publish_context

    broken = "sglang.srt.models.glm4_moe_nextn"
    monkeypatch.setitem(sys.modules, broken, None)  # importing it now raises ImportError
    folder = fixture_dir("q35_dense_w8a8_dynamic")
    publish_context(folder)
    config = draft_model_config(folder)
    qwen = sys.modules["sglang.srt.models.qwen3_5_mtp"]
    with npu_quantization_rule():
        assert sglang_private.draft_module_is_npu(qwen)() is True
        draft = build_draft(config, device="meta")
    assert type(draft).__name__ == "Qwen3_5ForCausalLMMTP"

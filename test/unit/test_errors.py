"""The package's errors (errors.py): one hierarchy, every message built from its subject, the
problem, detail lines and what to do, under the package's name."""

from __future__ import annotations

import pytest

from sglang_mtp_dequant.errors import (
    PREFIX,
    CheckpointFormatError,
    DraftWeightError,
    MtpDequantError,
    SettingError,
    explain,
    what_to_do,
)
from sglang_mtp_dequant.serving.guard.report import MisloadedDraftError
from sglang_mtp_dequant.serving.ray_setup import PluginNotInRayWorkersError

T = "mtp.layers.0.mlp.up_proj.weight"
FILE = "/ckpt/quant_model_weights-00001-of-00002.safetensors"


@pytest.mark.parametrize(
    "error, builtin",
    [
        (DraftWeightError, ValueError),
        (CheckpointFormatError, ValueError),
        (SettingError, ValueError),
        (MisloadedDraftError, DraftWeightError),
        (PluginNotInRayWorkersError, RuntimeError),
    ],
)
def test_every_error_is_the_packages_and_a_builtin_callers_catch(error, builtin):
    """Callers that catch ``ValueError`` around a load keep catching them; one ``except
    MtpDequantError`` catches all of them."""
    assert issubclass(error, MtpDequantError) and issubclass(error, builtin)
    assert issubclass(MtpDequantError, Exception) and not issubclass(MtpDequantError, ValueError)


def test_what_to_do_with_and_without_subject_and_details():
    assert what_to_do("s", "p", "h") == "s: p. What to do: h"
    assert what_to_do(None, "p", "h") == "p. What to do: h"
    assert what_to_do("", "p", "h") == "p. What to do: h"
    assert what_to_do("s", "p", "h", ["  - a", "  - b"]) == "s: p:\n  - a\n  - b\nWhat to do: h"
    assert explain("s", "p", "h") == f"{PREFIX}: s: p. What to do: h"
    assert PREFIX == "sglang-mtp-dequant"


def test_a_draft_weight_error_names_tensor_file_problem_and_what_to_do():
    error = DraftWeightError(
        tensor=T, file=FILE, problem="int8 weight has no weight_scale", hint="re-export it"
    )
    assert (error.tensor, error.file, error.problem, error.hint) == (
        T,
        FILE,
        "int8 weight has no weight_scale",
        "re-export it",
    )
    assert error.subject == f"draft tensor {T!r} in {FILE}"
    assert str(error) == (
        f"sglang-mtp-dequant: draft tensor {T!r} in {FILE}: int8 weight has no weight_scale. "
        "What to do: re-export it"
    )
    assert error.details == ()


def test_a_draft_weight_error_without_file_or_with_its_own_subject():
    no_file = DraftWeightError(tensor=T, file=None, problem="p", hint="h")
    assert str(no_file) == f"sglang-mtp-dequant: draft tensor {T!r}: p. What to do: h"
    own = DraftWeightError(tensor=T, file=FILE, problem="p", hint="h", subject="the draft")
    assert str(own) == "sglang-mtp-dequant: the draft: p. What to do: h"
    assert own.file == FILE  # kept for callers even when the subject does not say it
    details = DraftWeightError(tensor=T, file=None, problem="p", hint="h", details=["  x"])
    assert details.details == ("  x",)
    assert str(details).endswith(": p:\n  x\nWhat to do: h")


def test_also_refused_names_three_others_and_counts_the_rest():
    error = DraftWeightError(tensor=T, file=FILE, problem="p", hint="h", details=["  d"])
    assert error.also_refused([]) is error
    two = error.also_refused(["a", "b"])
    assert two.problem == "p (also refused: a, b)"
    five = error.also_refused(["a", "b", "c", "d", "e"])
    assert five.problem == "p (also refused: a, b, c and 2 more)"
    assert (five.tensor, five.file, five.hint, five.details, five.subject) == (
        T,
        FILE,
        "h",
        ("  d",),
        error.subject,
    )
    assert str(five) == f"{PREFIX}: {error.subject}: {five.problem}:\n  d\nWhat to do: h"


def test_a_checkpoint_format_error_is_about_its_file():
    error = CheckpointFormatError(file=FILE, problem="is truncated", hint="download it again")
    assert error.file == FILE and error.subject == FILE
    assert str(error) == f"{PREFIX}: {FILE}: is truncated. What to do: download it again"


def test_a_setting_error_keeps_the_setting_and_says_only_the_problem():
    error = SettingError(
        setting="SGLANG_MTP_DEQUANT_GUARD",
        problem="SGLANG_MTP_DEQUANT_GUARD='maybe' is not one of off, warn, error",
        hint="unset it",
    )
    assert error.setting == "SGLANG_MTP_DEQUANT_GUARD" and error.subject is None
    assert str(error) == (
        f"{PREFIX}: SGLANG_MTP_DEQUANT_GUARD='maybe' is not one of off, warn, error. "
        "What to do: unset it"
    )


def test_the_base_takes_keywords_only():
    with pytest.raises(TypeError):
        MtpDequantError("s", "p", "h")  # type: ignore[misc]
    error = PluginNotInRayWorkersError(subject="Ray worker pid 7", problem="p", hint="h")
    assert str(error) == f"{PREFIX}: Ray worker pid 7: p. What to do: h"
    assert error.args == (str(error),)

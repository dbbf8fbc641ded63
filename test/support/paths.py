"""Where the committed fixtures and the package's sources are."""

from __future__ import annotations

import os

TEST = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TEST)
FIXTURES = os.path.join(TEST, "fixtures")
MODELSLIM = os.path.join(FIXTURES, "modelslim")
REFERENCE = os.path.join(FIXTURES, "reference")
E2E = os.path.join(FIXTURES, "e2e")
PACKAGE = os.path.join(ROOT, "python", "sglang_mtp_dequant")

#: the dense Qwen3.5 fixtures msmodelslim wrote with 8-bit MTP projections
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


def package_files(under: str = "") -> list[str]:
    """The package's ``.py`` files (those under its folder ``under``), sorted: what the
    repository's checks read of its source."""
    return sorted(
        os.path.join(parent, name)
        for parent, _, names in os.walk(os.path.join(PACKAGE, under))
        for name in names
        if name.endswith(".py")
    )

"""The doctor's answer for every export users hold, in every launch form: the table of issue 48.

Usage (from the repository root; about 2 min on 2 cores)::

    .venv/bin/python benchmarks/doctor_exports.py [--markdown t.md]

For each export, ``sglang-mtp-dequant doctor <folder> --device npu --speculative-algorithm
EAGLE`` with each form's flags (``tools/forms.py``), asked through the doctor's own function
(what the CLI runs): sglang 0.5.23's draft built on the meta device as on NPU, its loader dry
run stock and through the plugin. Prints the machine, then one row per export and form: the
stock column, the plugin column (the doctor's verdict), the draft's bytes per rank with the
plugin. ``test/integration/test_doctor_exports.py`` asserts each cell.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import support_on_path  # noqa: F401  (the repository root and test/ on sys.path)

from support.paths import E2E, MODELSLIM

#: (folder, what it is), the exports of issue 48 in the order the table lists them
EXPORTS = (
    (os.path.join(E2E, "w8a8"), "Qwen3.5 dense, W8A8_DYNAMIC"),
    (os.path.join(E2E, "hybrid_w8a8"), "Qwen3.5 hybrid (Gated DeltaNet), W8A8_DYNAMIC"),
    (os.path.join(E2E, "hybrid_qwen36_recipe"), "Qwen3.5 hybrid, Qwen3.6 recipe"),
    (os.path.join(E2E, "moe_w8a8"), "Qwen3.5-MoE, W8A8_DYNAMIC"),
    (os.path.join(E2E, "moe_float_experts"), "Qwen3.5-MoE, routed experts FLOAT"),
    (os.path.join(MODELSLIM, "glm5_w8a8_mtp"), "GLM-5 W8A8, NextN layer quantized"),
    (os.path.join(MODELSLIM, "glm5_w8a8_nextn_float"), "GLM-5 W8A8, NextN layer FLOAT"),
    (os.path.join(MODELSLIM, "deepseek_v3_w8a8_dynamic_mix_mtp"), "DeepSeek-V3, NextN quantized"),
    (
        os.path.join(MODELSLIM, "deepseek_v3_w8a8_dynamic_mix_nextn_float"),
        "DeepSeek-V3, NextN FLOAT",
    ),
    (os.path.join(MODELSLIM, "q35_dense_w8a16_asym"), "Qwen3.5 dense, W8A16"),
    (os.path.join(MODELSLIM, "q35_dense_wfp8afp8_dynamic"), "Qwen3.5 dense, WFP8AFP8_DYNAMIC"),
    (os.path.join(MODELSLIM, "q35_dense_w4a8_dynamic"), "Qwen3.5 dense, W4A8_DYNAMIC"),
    (os.path.join(E2E, "vl_hybrid"), "Qwen3.6 VL dense hybrid, vision tower W8A8_DYNAMIC"),
    (os.path.join(E2E, "vl_moe"), "Qwen3.5 VL MoE, vision tower W8A8_DYNAMIC, experts FLOAT"),
)
NPU = ("--device", "npu", "--speculative-algorithm", "EAGLE")


def rows() -> list[str]:
    from sglang_mtp_dequant.tools.cpu_env import ensure_torchvision_importable

    ensure_torchvision_importable()
    from sglang_mtp_dequant.tools.doctor import diagnose
    from sglang_mtp_dequant.tools.forms import FORMS
    from sglang_mtp_dequant.tools.launch import parse_launch

    out = [
        "| export | form | stock sglang 0.5.23 | with the plugin | draft per rank (plugin) |",
        "|---|---|---|---|---|",
    ]
    for folder, what in EXPORTS:
        for key, form in FORMS.items():
            report = diagnose(folder, launch=parse_launch(folder, [*NPU, *form.flags]))
            plugin = report.plugin_outcome.replace("|", "/")
            size = "-" if report.draft_bytes is None else f"{report.draft_bytes:,} B"
            name = os.path.basename(folder)
            out.append(
                f"| `{name}` ({what}) | {key} {form.label} | {report.stock_outcome} | "
                f"{plugin} | {size} |"
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--markdown", default=None, help="write the table here")
    args = parser.parse_args()
    from machine import describe

    print(describe(), flush=True)
    started = time.perf_counter()
    table = "\n".join(rows())
    print(table)
    took = time.perf_counter() - started
    print(f"doctor_exports: {len(EXPORTS)} exports x 4 forms in {took:.0f} s")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The user's sglang launch, read by sglang's own argument parser, and the platform it names.

Usage::

    launch = parse_launch("/models/q35", ["--device", "cuda", "--quantization", "w8a8_int8"])
    launch = parse_launch(None, ["python", "-m", "sglang.launch_server", "--model-path", "/m"])
    launch.checkpoint        # what the draft loads from: --speculative-draft-model-path or PATH
    with launch.platform():  # sglang's platform answers stood in while the draft is built
        draft = build_draft(model_config, device="meta")

Why sglang's parser: the answer must be for the launch the user will run, flag for flag. The
platform's answers are stood in while the draft is built; without flags: NPU, the draft
quantization unset.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

#: the ServerArgs fields that decide how the draft is built and where its files come from
PUBLISHED = (
    "quantization",
    "speculative_algorithm",
    "speculative_draft_model_quantization",
    "speculative_draft_model_revision",
    "revision",
    "download_dir",
    "dtype",
    "load_format",
    "trust_remote_code",
)
DEFAULT_DEVICE = "npu"
#: the GPU the CUDA answers stand in for (Hopper, sm90)
CUDA_CAPABILITY = (9, 0)


#: how the answer is asked without launch flags (``Launch.describe`` of a flagless launch)
DEFAULT_ANSWER = (
    "asked as on NPU with the draft quantization unset (no launch flags given; pass your sglang "
    "launch flags, e.g. --device cuda, for the answer for that launch)"
)


class LaunchError(ValueError):
    """The launch flags are not a command sglang's parser accepts."""


@dataclass
class Launch:
    """One sglang launch as its parser read it (``namespace``), and what was given."""

    namespace: argparse.Namespace
    flags: list[str] = field(default_factory=list)

    @property
    def given(self) -> bool:
        return bool(self.flags)

    @property
    def model_path(self) -> str:
        return str(self.namespace.model_path)

    @property
    def checkpoint(self) -> str:
        """The checkpoint the draft loads from (what the doctor and verify look at)."""
        return str(self.namespace.speculative_draft_model_path or self.namespace.model_path)

    @property
    def device(self) -> str:
        return str(self.namespace.device or DEFAULT_DEVICE)

    @property
    def download_dir(self) -> str | None:
        return self.namespace.download_dir

    @property
    def revision(self) -> str | None:
        if self.namespace.speculative_draft_model_path:
            return self.namespace.speculative_draft_model_revision
        return self.namespace.revision

    def server_args(self) -> dict[str, Any]:
        """The published ServerArgs fields (beside ``device="cpu"``): the user's, as given."""
        return {name: getattr(self.namespace, name) for name in PUBLISHED}

    @contextlib.contextmanager
    def platform(self) -> Iterator[None]:
        """sglang's platform answers for ``--device`` while the draft class is built."""
        from .cpu_env import cuda_capability_answered, npu_kernels_looked_up, npu_quantization_rule

        if self.device == "npu":
            with npu_quantization_rule(), npu_kernels_looked_up():
                yield
        elif self.device == "cuda":
            with cuda_capability_answered(CUDA_CAPABILITY, note=CUDA_BUILD_NOTE):
                yield
        else:
            yield

    def describe(self) -> str:
        """How the answer was asked, one sentence."""
        if not self.given:
            return DEFAULT_ANSWER
        how = {
            "npu": "as on NPU (the draft classes' NPU quantization rule answered as on NPU)",
            "cuda": (
                f"as on CUDA (torch.cuda.get_device_capability() answered "
                f"{CUDA_CAPABILITY} while the draft was built)"
            ),
        }.get(self.device, f"as on {self.device}, with no platform answer stood in")
        device = "" if self.namespace.device else " (--device not given: NPU assumed)"
        return f"asked for the launch `{' '.join(self.flags)}`, {how}{device}"

    def notes(self) -> list[str]:
        """What the CPU run could not reproduce of this launch."""
        said = []
        tp, ep = self.namespace.tp_size, self.namespace.ep_size
        if (tp or 1) > 1 or (ep or 1) > 1:
            said.append(
                f"--tp-size {tp} / --ep-size {ep}: the dry run is one rank of a world of one; "
                "sglang's loaders place the same checkpoint names on every rank (each keeps "
                "its shard and experts), so the same tensors are checked"
            )
        if self.device == "npu" and self.namespace.speculative_draft_model_quantization:
            said.append(
                "a draft quantized on NPU: its quantization schemes were picked by this "
                "CPU's sglang (the NPU kernels' own choices are not stood in)"
            )
        return said


CUDA_BUILD_NOTE = (
    "platform stand-in: --device cuda on this CPU; while the draft was built, "
    f"torch.cuda.get_device_capability() answered {CUDA_CAPABILITY} (an sm90 GPU), which is what "
    "sglang's quantization configs ask to pick their schemes; nothing else of the build reads it"
)


def parse_launch(path: str | None, argv: Sequence[str]) -> Launch:
    """Read ``argv`` (launch flags for checkpoint ``path``, or a whole command) with sglang's
    ``ServerArgs`` parser; ``LaunchError`` when it refuses them, or without a model path."""
    from .cpu_env import ensure_torchvision_importable

    words = list(argv)
    start = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    flags = words[start:]
    ensure_torchvision_importable()
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve", add_help=False, exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    given_path = "--model-path" in flags or any(f.startswith("--model-path=") for f in flags)
    if path is not None and given_path:
        raise LaunchError("give the checkpoint either as PATH or as --model-path, not both")
    full = flags if given_path or path is None else ["--model-path", path, *flags]
    if not given_path and path is None:
        raise LaunchError("no checkpoint: give PATH, or a launch command with --model-path")
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(full)
    except (argparse.ArgumentError, SystemExit) as exc:
        said = stderr.getvalue().strip().splitlines()
        raise LaunchError(
            f"sglang's launch_server parser refused the flags: {said[-1] if said else exc}"
        ) from None
    return Launch(namespace, flags)


def without_flags(flags: Sequence[str], names: Sequence[str]) -> list[str]:
    """``flags`` less each of ``names`` with its value (``--name value`` or ``--name=value``)."""
    out: list[str] = []
    skip = False
    for word in flags:
        if skip:
            skip = False
        elif word in names:
            skip = True
        elif not any(word.startswith(f"{name}=") for name in names):
            out.append(word)
    return out


def with_quantization(
    launch: Launch | None, path: str, quantization_flags: Sequence[str]
) -> Launch:
    """The same launch (or none, for ``path``) with its two quantization flags replaced."""
    names = ("--quantization", "--speculative-draft-model-quantization")
    words = without_flags(launch.flags if launch is not None else [], names)
    given_path = any(w == "--model-path" or w.startswith("--model-path=") for w in words)
    return parse_launch(None if given_path else path, [*words, *quantization_flags])


def checkpoint_in(words: Sequence[str]) -> str | None:
    """The draft's checkpoint a launch command names, read without sglang."""
    found: dict[str, str] = {}
    for i, word in enumerate(words):
        for flag in ("--model-path", "--speculative-draft-model-path"):
            if word == flag and i + 1 < len(words):
                found[flag] = words[i + 1]
            elif word.startswith(f"{flag}="):
                found[flag] = word.split("=", 1)[1]
    return found.get("--speculative-draft-model-path") or found.get("--model-path")


def default_launch(path: str) -> Launch:
    """The launch the CLI answers for without flags: ``path`` on NPU, nothing else set."""
    return parse_launch(path, [])

"""One sglang server, started as users start it, on the CPU, and stopped with nothing left.

Usage::

    run = ServerRun("plugin", "/m/w8a8", speculative=True, plugin=True, quantization="modelslim")
    with Server(run, log_dir=".cache/e2e") as server:      # waits for /health
        print(server.port, server.log_path)
    # here the server and every process it spawned are gone (also on Ctrl-C or an error)

The command is ``python -m sglang.launch_server`` with EAGLE's flags, the launch form's
quantization flags (``--quantization`` and ``--speculative-draft-model-quantization``, each
only if the run gives it: ``e2e/plan.py``'s forms F1-F4), ``--tp-size`` if any, and the flags
sglang needs on a CPU with no sgl-kernel (docs/results.md says why each is there). The
environment adds ``TRITON_INTERPRET=1`` (sglang's Triton kernels run under Triton's
interpreter) and this package's ``site/`` folder first on ``PYTHONPATH`` (the CPU shims,
``site/sitecustomize.py``); ``SGLANG_PLUGINS=none`` switches the plugin off the way sglang
documents.

The server runs in its own session (process group): stopping it signals the whole group,
then waits until no process of the group is left, escalating from SIGTERM to SIGKILL. Should
the harness itself be killed, the launcher gets SIGTERM from the kernel (``PR_SET_PDEATHSIG``).
Each server gets a temporary folder of its own as ``TMPDIR`` (``TEMP_PREFIX``), removed once its
group is gone: sglang names its ZMQ sockets with ``tempfile.NamedTemporaryFile(delete=False)``
(``PortArgs.init_new``) and never removes them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass

from sglang_mtp_dequant.formats.description import DESCRIPTION_NAME as DESCRIPTION
from sglang_mtp_dequant.tools.forms import MODELSLIM, draft_quantization

HERE = os.path.dirname(os.path.abspath(__file__))
SITE = os.path.join(HERE, "site")
#: the prefix of each server's own TMPDIR (short: sglang's ZMQ socket paths live in it)
TEMP_PREFIX = "sglang-e2e-"

#: EAGLE with the draft's own MTP head: 3 steps, top-1, 4 draft tokens
SPECULATIVE_FLAGS = (
    "--speculative-algorithm", "EAGLE",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
)  # fmt: skip
#: sglang on a CPU without sgl-kernel (docs/results.md, "What was real")
CPU_FLAGS = (
    "--device", "cpu",
    "--attention-backend", "triton",
    "--dtype", "float32",
    "--disable-cuda-graph",
    "--skip-tokenizer-init",
    "--triton-attention-num-kv-splits", "1",
    "--disable-overlap-schedule",
    "--mamba-radix-cache-strategy", "no_buffer",
    "--disable-radix-cache",
    # of the memory free at start-up (on a CPU: the host's); what other processes allocate
    # while the weights load counts against it, so 0.05 failed on a shared machine
    # ("Loaded weights leave no GPU memory for the KV cache"); --max-total-tokens caps the pool
    "--mem-fraction-static", "0.15",
    "--max-total-tokens", "8192",
    "--max-running-requests", "8",
    "--context-length", "1024",
    "--chunked-prefill-size", "1024",
    "--random-seed", "0",
)  # fmt: skip


#: the variables a shell line of a run shows (the rest is the caller's environment)
SHOWN_ENVIRONMENT = (
    "TRITON_INTERPRET",
    "PYTHONPATH",
    "SGLANG_PLUGINS",
    "SGLANG_CPU_OMP_THREADS_BIND",
    "E2E_DRAFT_NPU_CHECK",
)
#: set in every server process's environment to its log's path: children inherit it, so any
#: process of a server can be found (tests check that none outlives its run)
RUN_MARK = "SGLANG_MTP_DEQUANT_E2E_SERVER_LOG"


class ServerError(RuntimeError):
    """A server that did not start or answer; the message ends with its log's tail."""


@dataclass(frozen=True)
class ServerRun:
    """One server of the comparison: what it serves, how, and whether the plugin is on."""

    label: str
    target: str
    #: EAGLE with the target's MTP head (False: the reference run, no speculative decoding)
    speculative: bool
    plugin: bool
    #: ``--speculative-draft-model-path``; None: no draft path, sglang drafts with the target
    #: folder's own MTP head (the user's launch of one ModelSlim folder)
    draft: str | None = None
    #: ``--quantization`` of the target; None: the flag is not given (sglang auto-detects a
    #: ModelSlim folder for the target from its description)
    quantization: str | None = None
    #: ``--speculative-draft-model-quantization``: ``unquant`` (the draft built unquantized),
    #: ``modelslim`` (built quantized, through the same kernels as the target), or None: the
    #: flag is not given, and sglang takes the target's CLI ``--quantization`` (never the
    #: auto-detected one: ``arg_groups/serving_hook.py``)
    draft_quantization: str | None = "unquant"
    tp_size: int = 1
    #: an sglang source tree's ``python/`` put before the installed sglang (the feature
    #: branch, ``make upstream-tree``); None: the installed sglang
    sglang_path: str | None = None
    #: the Qwen3.5 MTP module's ``is_npu`` answers True (``site/e2e_shim_npu_check.py``): the
    #: upstream run's draft servers, since PR 1 decodes on an NPU only
    draft_npu_check: bool = False

    @property
    def draft_folder(self) -> str | None:
        """The folder the draft's weights come from (None without speculative decoding)."""
        if not self.speculative:
            return None
        return self.draft or self.target

    @property
    def target_modelslim(self) -> bool:
        """sglang builds the target's ModelSlim layers quantized: ``--quantization modelslim``,
        or no ``--quantization`` and a ModelSlim description in the folder (auto-detected)."""
        if self.quantization is not None:
            return self.quantization == MODELSLIM
        return os.path.isfile(os.path.join(self.target, DESCRIPTION))

    @property
    def draft_built(self) -> str | None:
        """The quantization sglang builds the draft with (None: unquantized, bf16 on an NPU):
        the draft flag, else the target's CLI ``--quantization``; None without speculation."""
        if not self.speculative:
            return None
        return draft_quantization(self.quantization, self.draft_quantization)

    def command(self, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", self.target]
        cmd += ["--host", "127.0.0.1", "--port", str(port), *CPU_FLAGS]
        if self.quantization is not None:
            cmd += ["--quantization", self.quantization]
        if self.tp_size != 1:
            cmd += ["--tp-size", str(self.tp_size)]
        if self.speculative:
            cmd += SPECULATIVE_FLAGS
            if self.draft_quantization is not None:
                cmd += ["--speculative-draft-model-quantization", self.draft_quantization]
            if self.draft is not None:
                cmd += ["--speculative-draft-model-path", self.draft]
        return cmd

    def shell_command(self, port: int) -> str:
        """The command as a shell line, with the environment it runs in beyond the caller's
        (what docs/results.md shows for each run)."""
        env = self.environment()
        shown = [f"{k}={env[k]}" for k in SHOWN_ENVIRONMENT if k in env]
        return " ".join([*shown, "python", *self.command(port)[1:]])

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["TRITON_INTERPRET"] = "1"
        # exactly the shims (and the tree, if any): an inherited PYTHONPATH (make upstream-test
        # runs this harness with the branch's tree on it) must not reach the stock server
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE, self.sglang_path) if p)
        env.pop("SGLANG_USE_CPU_ENGINE", None)  # needs sgl-kernel's CPU build (docs)
        if self.tp_size != 1:
            # sglang's CPU rank start-up binds each rank's OpenMP threads to the cores this
            # names (utils/numa_utils.py); one core per rank, ranks split by '|'
            cores = sorted(os.sched_getaffinity(0))
            env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(
                str(cores[rank % len(cores)]) for rank in range(self.tp_size)
            )
        if self.draft_npu_check:
            env["E2E_DRAFT_NPU_CHECK"] = "1"
        else:
            env.pop("E2E_DRAFT_NPU_CHECK", None)
        if self.plugin:
            env.pop("SGLANG_PLUGINS", None)
        else:
            env["SGLANG_PLUGINS"] = "none"
        return env


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


#: how the plugin's own messages start (its INFO lines and its guard's refusals)
PLUGIN_PREFIX = "sglang-mtp-dequant:"


def plugin_messages(path: str, limit: int = 10) -> str:
    """The plugin's own lines in a server's log (a refusal names the tensor and what to do),
    or "" if it said nothing."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            found = [line for line in handle if PLUGIN_PREFIX in line]
    except OSError:
        return ""
    return "".join(found[-limit:])


def log_tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines))
    except OSError:
        return "(no log)"


class Server:
    """A running ``sglang.launch_server`` for one ``ServerRun`` (a context manager)."""

    def __init__(
        self,
        run: ServerRun,
        log_dir: str,
        port: int | None = None,
        start_timeout: float = 600.0,
    ) -> None:
        self.run = run
        if port is None:
            # the package's one free_port, imported here: it brings torch, which --help skips
            from sglang_mtp_dequant.tools.cpu_sglang import free_port

            port = free_port()
        self.port = port
        self.log_path = os.path.join(log_dir, f"server-{run.label}.log")
        self.start_timeout = start_timeout
        self.process: subprocess.Popen | None = None
        self.temp_dir: str | None = None
        self.started_seconds = 0.0

    def __enter__(self) -> Server:
        if port_in_use(self.port):
            raise ServerError(f"port {self.port} on 127.0.0.1 is in use: pick another --port")
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        started = time.perf_counter()
        self.temp_dir = tempfile.mkdtemp(prefix=TEMP_PREFIX)
        env = {**self.run.environment(), RUN_MARK: self.log_path, "TMPDIR": self.temp_dir}
        try:
            with open(self.log_path, "w", encoding="utf-8") as log:
                self.process = subprocess.Popen(
                    self.run.command(self.port),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=_terminate_with_parent,
                )
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.started_seconds = time.perf_counter() - started
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                said = plugin_messages(self.log_path)
                raise ServerError(
                    f"the {self.run.label} server exited with status {code} during start-up; "
                    + (f"the plugin said:\n{said}" if said else "")
                    + f"log {self.log_path}, last lines:\n{log_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        raise ServerError(
            f"the {self.run.label} server did not answer /health within "
            f"{self.start_timeout:.0f} s; log {self.log_path}, last lines:\n"
            f"{log_tail(self.log_path)}"
        )

    def stop(self, grace: float = 30.0) -> None:
        """Signal the server's whole process group; return once no process of it is left,
        its temporary folder removed."""
        process, self.process = self.process, None
        try:
            if process is not None:
                _stop_group(process, self.run.label, grace)
        finally:
            if self.temp_dir is not None:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
                self.temp_dir = None


def _stop_group(process: subprocess.Popen, label: str, grace: float) -> None:
    """SIGTERM, then SIGKILL, the group ``process`` leads, until no process of it is left."""
    group = process.pid  # start_new_session: the launcher leads its own group
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            process.poll()  # reap the launcher itself
            if not group_alive(group):
                return
            time.sleep(0.2)
    process.poll()
    if group_alive(group):
        raise ServerError(f"processes of the {label} server (group {group}) survive")


def _terminate_with_parent() -> None:
    """In the server's launcher, before exec: SIGTERM it if the harness dies without
    stopping it (a SIGKILL cannot be handled); sglang's launcher then stops its children."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def group_alive(group: int) -> bool:
    """Whether any process of process group ``group`` exists (zombies not counted)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(_in_group(pid, group) for pid in _pids())


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _in_group(pid: int, group: int) -> bool:
    """``pid`` is a live (not zombie) member of ``group``, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            stat = handle.read()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return fields[0] != "Z" and int(fields[2]) == group

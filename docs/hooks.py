"""MkDocs hooks: the committed benchmark plots and the generated pictures join the site.

The benchmark pages include the committed reports themselves (``--8<--``, from
``benchmarks/results``); their plots are added here under ``benchmarks/`` so the pages and the
reports' own relative links find them. The partitioners' pictures are drawn by ``make docs``
(``fedbalance_benchmarks.docs_pictures``) into ``build/docs-pictures`` and added under
``partitioners/``. mkdocstrings reads ``fl_adapters`` from ``adapters/`` through a link named
after the import name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PICTURES = ROOT / "build" / "docs-pictures"
API_SRC = ROOT / "build" / "api-src"


@event_priority(100)  # before mkdocstrings reads its paths
def on_config(config: Any) -> Any:
    API_SRC.mkdir(parents=True, exist_ok=True)
    link = API_SRC / "fl_adapters"
    if not link.is_symlink():
        os.symlink(ROOT / "adapters", link)
    return config


def on_files(files: Files, config: Any) -> Files:
    for folder, uri in ((RESULTS, "benchmarks"), (PICTURES, "partitioners")):
        for png in sorted(folder.glob("*.png")):
            files.append(File.generated(config, f"{uri}/{png.name}", abs_src_path=str(png)))
    return files


#: ``<!-- plots: GLOB -->`` in a page: every committed plot matching GLOB (``{a,b}`` allowed).
PLOTS = re.compile(r"<!-- plots: (\S+) -->")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    def images(match: re.Match[str]) -> str:
        found = sorted(
            {p.name for pattern in _braces(match.group(1)) for p in RESULTS.glob(pattern)}
        )
        if not found:
            raise ValueError(f"{page.file.src_uri}: no plot matches {match.group(1)}")
        return "\n\n".join(f"![{name[:-4]}]({name})" for name in found)

    return PLOTS.sub(images, markdown)


def _braces(pattern: str) -> list[str]:
    """``a_{x,y}.png`` -> ``[a_x.png, a_y.png]`` (one brace group)."""
    match = re.search(r"\{([^}]*)\}", pattern)
    if not match:
        return [pattern]
    return [
        pattern[: match.start()] + alt + pattern[match.end() :] for alt in match.group(1).split(",")
    ]

"""Every relative link in README.md, docs/, docs/results/ and the folders' READMEs reaches a file that
exists and, with a #fragment, a heading of that file (GitHub's anchor rules). Numbers in
headings change as results are published, and a stale anchor fails without a word on GitHub."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "results").glob("*.md")),
             *sorted(ROOT.glob("*/README.md"))]


def github_anchors(markdown: Path) -> set:
    """The anchors GitHub gives the headings: lower case, markup and punctuation dropped
    (word characters, '-' and spaces kept), spaces to '-', repeats numbered -1, -2, ..."""
    seen, anchors, in_code = {}, set(), False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def relative_links(markdown: Path):
    in_code = False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code:
            yield from (t for t in re.findall(r"\]\(([^)\s]+)\)", line) if not re.match(r"[a-z]+:", t))


def test_the_anchor_rules_match_githubs_on_known_headings(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Results on an H200 (2026-12-04): what 15 minutes could show\n"
                    "## `--dual-scale` and **fp16**\n## Notes\n## Notes\n```\n# not a heading\n```\n")
    assert github_anchors(page) == {"results-on-an-h200-2026-12-04-what-15-minutes-could-show",
                                    "--dual-scale-and-fp16", "notes", "notes-1"}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(document):
    broken = []
    for target in relative_links(document):
        path, _, fragment = target.partition("#")
        destination = (document.parent / path).resolve() if path else document
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in github_anchors(destination):
            broken.append(f"{target}: no such heading")
    assert not broken, broken

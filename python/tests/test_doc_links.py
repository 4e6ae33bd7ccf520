"""Documentation links: every relative link in README.md and docs/*.md names a file that exists,
and every `#anchor` one of that Markdown file's headings (GitHub's heading ids: lower case,
punctuation dropped, spaces as hyphens). README and docs link into each other by section, so a
moved or renamed section must take its links with it. Links inside code blocks and to other
sites are not checked. No build needed."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_ids(path):
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in heading_ids(dest):
            bad.append(f"{target}: no heading with id '{anchor}' in {dest.name}")
    assert not bad, f"{doc.relative_to(ROOT)}: " + "; ".join(bad)

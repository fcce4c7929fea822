"""The docs hold together: every page in docs/ is listed in docs/README.md, and every relative
link in docs/, the README and examples/README.md reaches a file that exists (and, with a
#fragment into a Markdown page, a heading of that page, by GitHub's anchor rule)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted([*DOCS.glob("*.md"), ROOT / "README.md", ROOT / "examples" / "README.md"])
# [text](target) outside code spans; a target has no spaces.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    return CODE_SPAN.sub("", CODE_FENCE.sub("", text))


def links(page: Path) -> list[str]:
    return LINK.findall(_prose(page.read_text(encoding="utf-8")))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to -."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(h) for h in HEADING.findall(CODE_FENCE.sub("", page.read_text("utf-8")))}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(
                f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}"
            )
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_every_doc_is_linked_from_the_index() -> None:
    index = DOCS / "README.md"
    listed = {(index.parent / t.partition("#")[0]).resolve() for t in links(index)}
    pages = {p.resolve() for p in DOCS.glob("*.md") if p.name != "README.md"}
    assert sorted(p.name for p in pages - listed) == []


def test_the_readme_links_the_first_rollout_guide_before_any_other_doc() -> None:
    readme_links = [t for t in links(ROOT / "README.md") if t.startswith("docs/")]
    assert readme_links[0] == "docs/first-rollout.md"


def test_the_checker_finds_a_broken_link_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "# Title here\n\n[ok](#title-here) [gone](b.md) [bad](a.md#nope) `[code](x.md)`\n"
        "```\n[fenced](y.md)\n```\n[web](https://example.com/x)\n"
    )
    assert broken_links(tmp_path / "a.md") == [
        f"b.md: no {tmp_path / 'b.md'}",
        "a.md#nope: no heading #nope in a.md",
    ]


def test_anchor_follows_githubs_rule() -> None:
    assert anchor("Build and push the images with Docker or Podman") == (
        "build-and-push-the-images-with-docker-or-podman"
    )
    assert anchor("Check the target first: `kvgate check`") == "check-the-target-first-kvgate-check"
    assert anchor("4. What you will see, phase by phase") == "4-what-you-will-see-phase-by-phase"

"""The documentation: the MkDocs site under docs/ builds in strict mode, and README.md stays a short
introduction whose links into the docs lead somewhere.

Strict mode turns MkDocs' warnings into errors, and docs/mkdocs.yml raises every link check to a
warning, so a link to a missing page or heading, a relative link that cannot be a page, or a page
left out of `nav` fails the build. The failing cases below break a copy of docs/ to show that the
build does fail for each, and names the cause.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"
README_MAX_LINES = 200  # a newcomer's five minutes; the reference lives in docs/pages/

# A Markdown link's target: [text](target). Code spans are removed before matching.
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`]*`")


def build(docs: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(docs / "mkdocs.yml"),
                           "-d", str(site)], cwd=docs, capture_output=True, text=True, timeout=120)


def test_site_builds_in_strict_mode(tmp_path):
    done = build(DOCS, tmp_path / "site")
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def _break_link(pages: Path) -> str:
    api = pages / "api.md"
    api.write_text(api.read_text().replace("(reliability.md)", "(reliabilty.md)", 1))
    return "reliabilty.md"


def _break_anchor(pages: Path) -> str:
    config = pages / "configuration.md"
    config.write_text(config.read_text().replace("reliability.md#bounds", "reliability.md#no-such-heading", 1))
    return "no-such-heading"


def _add_page_outside_nav(pages: Path) -> str:
    (pages / "orphan.md").write_text("# A page nobody links to\n")
    return "orphan.md"


def _link_to_folder(pages: Path) -> str:
    security = pages / "security.md"
    security.write_text(security.read_text() + "\nSee [the deployment](../deployment/).\n")
    return "../deployment/"


@pytest.mark.parametrize("breakage", [_break_link, _break_anchor, _add_page_outside_nav, _link_to_folder],
                         ids=["missing page", "missing anchor", "page not in nav", "unrecognized link"])
def test_strict_build_fails_for_a_broken_docs_tree(tmp_path, breakage):
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("site"))
    culprit = breakage(docs / "pages")
    done = build(docs, tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode != 0, f"the strict build passed a docs tree with {culprit!r}:\n{output}"
    assert culprit in output, f"the build failed, but not naming {culprit!r}:\n{output}"


def test_readme_is_short_and_shows_the_two_commands():
    text = README.read_text()
    lines = text.count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines, more than {README_MAX_LINES}: move reference "
                                       "material into a page under docs/pages/ and link to it")
    for command in ("make demo", "make test"):
        assert command in text, f"README.md no longer shows `{command}`"


def _headings(page: Path) -> set[str]:
    """The anchors MkDocs gives a page's headings (its toc extension's default slugs)."""
    in_code = False
    slugs = set()
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"#{1,6} (.+)", line)):
            slugs.add(slugify(match.group(1).replace("`", ""), "-"))
    return slugs


def test_readme_links_lead_to_existing_pages_and_headings():
    targets = LINK.findall(CODE_SPAN.sub("", README.read_text()))
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/pages/") for t in local), "README.md links to no docs page"
    for target in local:
        path, _, anchor = target.partition("#")
        page = REPO / path
        assert page.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert anchor in _headings(page), f"README.md links to {target}, but {path} has no heading #{anchor}"

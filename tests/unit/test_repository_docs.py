"""The project's documents are in the repository: no tracked file cites a document outside it (the design notes
once kept beside the checkout, now docs/), and every relative link of the Markdown documents (docs/, the READMEs,
trainer/docs/) reaches a tracked file.

Needs the git checkout (the list of tracked files); ansible-test units runs on an installed copy without it, so there
these tests are skipped."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The outside documents by name (spelled in pieces so that this file does not cite them itself), and the folder they
# lived in beside the checkout.
OUTSIDE_NAMES = ("DESIGN", "DFLASH", "HARNESS", "PROXMOX", "STYLE")
OUTSIDE = re.compile(r"(?<![\w/.-])(?:%s)\.md\b|(?:\.\./|/work/)shared\b" % "|".join(OUTSIDE_NAMES))

LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
pytestmark = pytest.mark.checkout  # ansible-test units skips it (tests/unit/conftest.py)


def tracked_files():
    if not os.path.exists(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout (ansible-test's installed copy): the tracked files are unknown here")
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True).stdout
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def outside_citations(text):
    """[(line number, line)] of the lines of text that cite a document outside the repository."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]


def markdown_documents(files):
    return [p for p in files if p.endswith(".md") and (
        p.startswith("docs/") or "/docs/" in p or os.path.basename(p) == "README.md")]


def relative_links(text):
    """The link targets of a Markdown text that point into the repository (not URLs, not anchors of the same page),
    without their #anchor; links inside code blocks and code spans are not links."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    targets = []
    for target in LINK.findall(text):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0].split("?", 1)[0])
    return targets


def broken_links(md_path, text, tracked):
    """The relative links of md_path (a repository path) that reach no tracked file or folder of the repository."""
    folders = {os.path.dirname(p) for p in tracked}
    for path in list(folders):
        while path:
            path = os.path.dirname(path)
            folders.add(path)
    tracked_set = set(tracked)
    broken = []
    for target in relative_links(text):
        resolved = os.path.normpath(os.path.join(os.path.dirname(md_path), target))
        if resolved.startswith("..") or os.path.isabs(target) or (resolved not in tracked_set and
                                                                   resolved not in folders):
            broken.append(target)
    return broken


def test_no_tracked_file_cites_a_document_outside_the_repository():
    found = []
    for path in tracked_files():
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full) or os.path.islink(full):
            continue
        with open(full, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        found += ["%s:%d: %s" % (path, n, line[:160]) for n, line in outside_citations(text)]
    assert found == [], "cite docs/ instead:\n" + "\n".join(found)


def test_every_relative_markdown_link_reaches_a_file_of_the_repository():
    tracked = tracked_files()
    documents = markdown_documents(tracked)
    assert "docs/design.md" in documents and "README.md" in documents
    broken = []
    for path in documents:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            broken += ["%s: %s" % (path, target) for target in broken_links(path, f.read(), tracked)]
    assert broken == [], "\n".join(broken)


@pytest.mark.parametrize("line, cites", [
    ("see " + "DESIGN" + ".md, \"The run contract\"", True),
    ("(" + "PROXMOX" + ".md's statements)", True),
    ("Trains a drafter (see `/work/" + "sha" + "red/" + "DFLASH" + ".md`)", True),
    ("cat ../" + "sha" + "red/notes.txt", True),
    ("see docs/design.md, \"The run contract\"", False),
    ("docs/dflash.md rule for K = 5", False),
    ("the shared part of the vocabulary", False),
])
def test_the_outside_citation_check_tells_them_apart(line, cites):
    assert bool(outside_citations(line)) is cites


def test_the_link_check_finds_a_broken_link_and_ignores_urls_anchors_and_code():
    tracked = ["README.md", "docs/design.md", "docs/dflash.md", "trainer/README.md", "tests/harness/README.md"]
    text = ("[ok](dflash.md) [anchor](design.md#the-run-contract) [up](../trainer/README.md) [dir](../tests/harness)\n"
            "[url](https://example.org/x.md) [self](#layers) `[code](missing.md)`\n"
            "```\n[block](missing-too.md)\n```\n"
            "[gone](proxmox.md) [outside](../../elsewhere.md)\n")
    assert broken_links("docs/design.md", text, tracked) == ["proxmox.md", "../../elsewhere.md"]

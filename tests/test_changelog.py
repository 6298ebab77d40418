"""CHANGELOG.md keeps its form: Keep a Changelog's groups only, `## [X.Y.Z] - YYYY-MM-DD` headings newest first, the
newest version (or the one below `[Unreleased]`) being `procap.__version__`, and the file shipped in the sdist."""

from __future__ import annotations

import datetime
import fnmatch
import re
from pathlib import Path

import pytest

import procap

ROOT = Path(__file__).resolve().parents[1]
CHANGELOG = ROOT / "CHANGELOG.md"

GROUPS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
UNRELEASED = "[Unreleased]"
RELEASE = re.compile(r"\[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d{2}-\d{2})")


def sections(text: str) -> list[tuple[str, list[str]]]:
    """Each `## ` heading's text with the `### ` headings below it, in file order."""
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            found.append((line[3:].strip(), []))
        elif line.startswith("### "):
            if not found:
                raise AssertionError(f"group heading {line!r} before any version heading")
            found[-1][1].append(line[4:].strip())
    return found


def releases(text: str) -> list[tuple[str, datetime.date]]:
    """(version, date) of every released section, in file order; fails on a heading of another form."""
    out = []
    for heading, _ in sections(text):
        if heading == UNRELEASED:
            continue
        match = RELEASE.fullmatch(heading)
        assert match, f"version heading {heading!r} is not '[X.Y.Z] - YYYY-MM-DD' (or {UNRELEASED})"
        out.append((match["version"], datetime.date.fromisoformat(match["date"])))
    return out


def check(text: str, version: str) -> None:
    """Every rule of the file's form, as one function so the tests below can also feed it broken copies."""
    found = sections(text)
    assert found, "no version sections"
    headings = [heading for heading, _ in found]
    assert UNRELEASED not in headings[1:], f"{UNRELEASED} must be the top section"
    released = releases(text)
    assert released, "no released version"
    newest = released[0][0]
    where = f"the section below {UNRELEASED}" if headings[0] == UNRELEASED else "the newest section"
    assert newest == version, f"{where} is {newest}, procap.__version__ is {version}"
    dates = [date for _, date in released]
    assert dates == sorted(dates, reverse=True), f"release dates are not newest first: {dates}"
    versions = [tuple(int(part) for part in v.split(".")) for v, _ in released]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions), versions
    for heading, groups in found:
        unknown = [group for group in groups if group not in GROUPS]
        assert not unknown, f"{heading}: {unknown} are not Keep a Changelog groups {GROUPS}"
        assert len(set(groups)) == len(groups), f"{heading}: a group appears twice: {groups}"


def test_the_changelog_follows_keep_a_changelog_and_names_the_current_version():
    check(CHANGELOG.read_text(encoding="utf-8"), procap.__version__)


def test_every_group_and_release_has_entries():
    # An empty [Unreleased] is fine (just after a release); an empty group or released version is not.
    text = CHANGELOG.read_text(encoding="utf-8")
    for block in re.split(r"^(?=##+ )", text, flags=re.MULTILINE)[1:]:
        heading, _, body = block.partition("\n")
        if heading.startswith("### ") or (heading.startswith("## ") and heading != f"## {UNRELEASED}"):
            whole = body if heading.startswith("### ") else text.split(heading, 1)[1].split("\n## ", 1)[0]
            assert re.search(r"^- \S", whole, flags=re.MULTILINE), f"{heading!r} has no entry"


BROKEN = {
    "an invented group": lambda t: t.replace("### Fixed", "### Bug fixes", 1),
    "a heading without a date": lambda t: re.sub(r"## \[0\.1\.0\] - \S+", "## [0.1.0]", t),
    "a version other than procap.__version__": lambda t: t.replace("## [0.1.0]", "## [0.2.0]", 1),
    "a second Unreleased below a version": lambda t: t + "\n## [Unreleased]\n\n### Added\n\n- something\n",
    "Unreleased missing and an older version on top": lambda t: t.replace("## [Unreleased]", "## [0.0.1] - 2026-11-20"),
    "dates going up": lambda t: t.replace(
        "## [0.1.0] - 2026-11-25", "## [0.1.0] - 2026-11-25\n\n## [0.0.9] - 2026-12-01"
    ),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_changelog_is_caught(name):
    text = CHANGELOG.read_text(encoding="utf-8")
    if procap.__version__ != "0.1.0" or "## [0.1.0] - 2026-11-25" not in text:
        pytest.skip("the broken copies are written against the 0.1.0 file")
    broken = BROKEN[name](text)
    assert broken != text
    with pytest.raises(AssertionError):
        check(broken, procap.__version__)


def test_the_sdist_ships_the_changelog():
    # setuptools adds README.md and LICENSE by itself, not CHANGELOG.md: MANIFEST.in must name it, and no later
    # exclusion may take it out again (tests/test_setup.py checks a built sdist).
    commands = [line.split() for line in (ROOT / "MANIFEST.in").read_text().splitlines()]
    commands = [words for words in commands if words and not words[0].startswith("#")]
    assert ["include", "CHANGELOG.md"] in commands
    for words in commands[commands.index(["include", "CHANGELOG.md"]) + 1 :]:
        if words[0] in ("exclude", "global-exclude"):
            assert not any(fnmatch.fnmatch("CHANGELOG.md", pattern) for pattern in words[1:]), words

"""The tracked files speak about the software as it is, not about how it was developed.

Development-process wording (work-session numbers, issue numbers, dated runs, "this
machine") tells a user nothing about the current software and goes stale. History belongs
in ``CHANGELOG.md``, the one file exempt here. Every tracked text file (``git ls-files``,
and new files not ignored by git) is read; binary files are skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXEMPT = {"CHANGELOG.md"}
PROCESS_WORDS = re.compile(
    r"\bstops? [0-9]|this st[o]p|issue [0-9]|this (2-core )?machine|20[0-9]{2}-[0-9]{2}-[0-9]{2}",
    re.IGNORECASE,
)


def _tracked_text_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    files = []
    for name in filter(None, names):
        path = ROOT / name
        if name in EXEMPT or not path.is_file():
            continue
        head = path.read_bytes()[:8192]
        if b"\0" in head:  # binary
            continue
        files.append(path)
    return files


def test_no_process_words_in_tracked_files():
    hits = []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if PROCESS_WORDS.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "development-process wording:\n" + "\n".join(hits)


# Built from parts, so that this file holds none of the words it looks for.
CAUGHT = {"session": "measured at st" + "op 52", "issue": "see iss" + "ue 31",
          "machine": "on this 2-core mach" + "ine", "date": "run on 20" + "26-11-24"}


@pytest.mark.parametrize("kind", list(CAUGHT))
def test_the_pattern_catches_process_words(kind):
    assert PROCESS_WORDS.search(CAUGHT[kind])


@pytest.mark.parametrize("line", ["the test stops when s² < σ²", "a chain stops at its next step",
                                  "GitHub issues", "machine-readable results"])
def test_the_pattern_leaves_ordinary_words(line):
    assert not PROCESS_WORDS.search(line)

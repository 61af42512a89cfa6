"""The release note as one self-contained HTML page: the Markdown that `release_note` writes, with the
gate's plot embedded (a base64 PNG), for people who would rather look than read.

The Markdown is lanectl's own and uses a small subset (headings, paragraphs, lists, pipe tables, fenced
code, inline code, backslash escapes), so it is converted here rather than with a Markdown library; every
piece of text is HTML-escaped, since lane names, reasons and log lines come from recipes, engines and a
results.json anyone may have edited, and control characters are shown escaped.
"""

from __future__ import annotations

import base64
import html
import re

from lanectl.output import shown

STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 64rem; margin: 2rem auto; padding: 0 1rem; color: #1b1b1b; }
h1 { font-size: 1.5rem; border-bottom: 2px solid #2b6cb0; padding-bottom: .3rem; }
h2 { font-size: 1.15rem; margin-top: 1.8rem; color: #2b6cb0; }
table { border-collapse: collapse; margin: .6rem 0; }
th, td { border: 1px solid #ccd; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #eef2f8; }
code, pre { font-family: ui-monospace, monospace; font-size: .9em; background: #f3f4f6; }
pre { padding: .6rem; overflow-x: auto; }
img { max-width: 100%; border: 1px solid #ccd; margin: .6rem 0; }
"""
PLOT_AFTER = "## Measured, this window"
# A backslash before ASCII punctuation (how the note escapes text), or a run of backticks (a code span's fence).
INLINE_TOKEN = re.compile(r"\\([!-/:-@\[-`{-~])|(`+)")


def _inline(text: str) -> str:
    """One line of the note's Markdown as HTML: backslash escapes read as the character they escape, code spans
    as <code>, everything HTML-escaped. A backtick run with no closing run of the same length is text."""
    text = shown(text)
    out: list[str] = []
    plain: list[str] = []
    position = 0
    while (found := INLINE_TOKEN.search(text, position)) is not None:
        plain.append(text[position:found.start()])
        position = found.end()
        if found.group(1) is not None:
            plain.append(found.group(1))
            continue
        fence = found.group(2)
        closing = re.compile(f"(?<!`){fence}(?!`)").search(text, position)
        if closing is None:
            plain.append(fence)
            continue
        code = text[position:closing.start()]
        if len(code) > 2 and code.startswith(" ") and code.endswith(" "):
            code = code[1:-1]
        out.append(html.escape("".join(plain)) + f"<code>{html.escape(code)}</code>")
        plain = []
        position = closing.end()
    plain.append(text[position:])
    return "".join(out) + html.escape("".join(plain))


def _plain_text(text: str) -> str:
    """A line of the note as text with no markup: for the page's <title>."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", shown(text)).replace("`", "")


def _cells(row: str) -> list[str]:
    # GFM splits a row on every pipe not escaped by a backslash, code spans included, then reads `\|` as `|`.
    cells = re.split(r"(?<!\\)\|", row.strip().strip("|"))
    return [cell.strip().replace("\\|", "|") for cell in cells]


def note_html(markdown: str, plot_png: bytes | None) -> str:
    """The page; `plot_png` (the run's ratios.png) goes under the "Measured" heading when there is one."""
    out: list[str] = []
    lines = markdown.splitlines()
    title = _plain_text(lines[0].lstrip("# ").strip()) if lines else "Release note"
    i = 0
    while i < len(lines):
        text = lines[i]
        if text.startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            out.append("<pre>" + html.escape("\n".join(lines[i + 1:end])) + "</pre>")
            i = end + 1
            continue
        if text.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i])
                i += 1
            head, body = _cells(rows[0]), [_cells(r) for r in rows[2:]]
            out.append("<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in body)
                       + "</tbody></table>")
            continue
        if text.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        heading = re.match(r"(#{1,3}) (.*)", text)
        if heading:
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            if text == PLOT_AFTER and plot_png:
                encoded = base64.b64encode(plot_png).decode("ascii")
                out.append(f'<img alt="candidate / control ratio per cell, with 95% intervals and the bar" '
                           f'src="data:image/png;base64,{encoded}">')
        elif text.strip():
            out.append(f"<p>{_inline(text)}</p>")
        i += 1
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(out) + "\n</body></html>\n")

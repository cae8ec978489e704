"""The user's text (class names, file and folder names, a model card's values) inside the Markdown, HTML and YAML
that foodvit writes: report.md, the demo page, a Space's README and its settings, the static page's README; and in
the lines the command line prints (terminal).

Markdown renders inline HTML, so a class folder named `<img src=x onerror=alert(1)>` written as it is becomes a live
element in whatever shows the file, and `<img src=https:evil.example>` makes each reader's browser ask another site
for it. Text of the user's therefore goes through here: it is shown as the characters it holds, never read as markup,
a link, a picture or a setting. (The static page sets such text as text, with textContent, and needs none of this.)
"""

from __future__ import annotations

import re

# ASCII punctuation that Markdown may read as markup: CommonMark's emphasis, code, links and pictures, headings,
# lists, escapes; GitHub's tables, strikethrough and bare links (https:..., www....); Gradio's math ($...$).
# CommonMark shows any ASCII punctuation after a backslash as itself.
_ACTIVE = frozenset("\\`*_{}[]()#+-.!|~$:")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# line breaks and the other control characters: in a heading, a table's row or a list item, a line break would end it
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def text(value: object) -> str:
    """`value` as Markdown inline text that shows exactly its characters: <, > and & as HTML entities, each other
    character Markdown may read as markup after a backslash, line breaks and other control characters as spaces."""
    return "".join(_ENTITIES.get(c) or ("\\" + c if c in _ACTIVE else c) for c in _CONTROL.sub(" ", str(value)))


def code(value: object, *, table: bool = False) -> str:
    """`value` as a Markdown code span (shown as it is, in a fixed-width font; HTML inside one is never rendered):
    fenced by more backticks than any run of them inside it, line breaks as spaces. table=True for a span in a
    table's cell, whose `|` would otherwise end the cell."""
    inner = _CONTROL.sub(" ", str(value))
    if not inner:
        return ""
    if table:
        inner = inner.replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", inner)), default=0) + 1)
    pad = " " if inner[0] in "` " or inner[-1] in "` " else ""  # CommonMark takes one space off each end
    return f"{fence}{pad}{inner}{pad}{fence}"


def yaml_string(value: object) -> str:
    """`value` as a YAML double-quoted scalar, which any YAML parser reads back as exactly that string: a quote and a
    backslash escaped, and every character YAML does not allow as it is (line breaks, control characters) as its
    \\u or \\U escape. (A plain scalar breaks on `: `, ` #`, a leading quote, ...: `title: foodvit: cats, dogs`.)"""
    out = []
    for c in str(value):
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable() and c != "\ufeff":
            out.append(c)
        else:
            out.append(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


# what a terminal takes for commands or layout rather than text: control characters (a line break starts a line that
# reads as foodvit's own, ESC starts a colour or cursor sequence) and the bidirectional overrides, which reorder it
_TERMINAL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def terminal(value: object) -> str:
    """`value` as a line the command line prints: each control character and bidirectional override as its escape
    (\\n, \\x1b, \\u202e), every other character as it is."""
    return _TERMINAL.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), str(value))

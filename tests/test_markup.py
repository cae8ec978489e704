"""markup.py: the user's text in the Markdown foodvit writes shows as its characters (rendered by a CommonMark
renderer with HTML on, as GitHub's, Hugging Face's and Gradio's are), and in YAML reads back as itself."""

import pytest
from helpers import rendered_markdown

from foodvit import markup

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "<img src=https:evil.example>",
    "<script>alert(1)</script>",
    'mac & "cheese": #1 | *best* _of_ `all`',
    "[click](https://evil.example) ![p](https://evil.example/p.png)",
    "https://evil.example www.evil.example",
    "&lt;img src=x&gt; &amp;",
    "# heading\n- item\n\n<img src=x>",
    "back\\slash \\<b> ~~struck~~ $$x$$",
    "```fenced```",
    "-",
    "1. first",
    "plain",
]


def rendered(markdown: str):
    return rendered_markdown(markdown)


def shown(value: str) -> str:
    """What a reader should see: the characters, a line break or another control character as a space."""
    return "".join(" " if not c.isprintable() else c for c in value)


@pytest.mark.parametrize("value", HOSTILE)
def test_text_shows_its_characters_in_a_heading_a_table_and_a_list_and_nothing_else(value):
    heading = rendered(f"# foodvit: {markup.text(value)}")
    assert heading.tags == ["h1"] and heading.text.strip() == f"foodvit: {shown(value)}".strip()
    table = rendered(f"| class | p |\n|---|---|\n| {markup.text(value)} | 0.5 |")
    assert set(table.tags) == {"table", "thead", "tbody", "tr", "th", "td"} and table.tags.count("td") == 2
    assert shown(value).strip() in table.text
    item = rendered(f"- **classes**: {markup.text(value)}, pizza")
    assert item.tags == ["ul", "li", "strong"] and item.text.strip() == f"classes: {shown(value)}, pizza"


@pytest.mark.parametrize("value", HOSTILE)
def test_code_is_one_code_span_of_its_characters_in_a_table_or_out(value):
    span = rendered(f"recipe {markup.code(value)}")
    assert span.tags == ["p", "code"] and span.text.strip() == f"recipe {shown(value)}".strip()
    cell = rendered(f"| | |\n|---|---|\n| data | {markup.code(value, table=True)} |")
    assert cell.tags.count("td") == 2 and cell.tags.count("code") == 1 and shown(value) in cell.text


@pytest.mark.parametrize(
    "value",
    [
        *HOSTILE,
        "foodvit: cats, dogs",
        "'single'",
        '"double"',
        "two\nlines",
        "tab\there",
        " spaced ",
        "@at",
        "%percent",
        "🍕 pizza",
        "\u2028\x85\ufeff",
        "null",
        "yes",
        "1.5",
    ],
)
def test_a_yaml_string_reads_back_as_itself(value):
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(f"title: {markup.yaml_string(value)}\nsdk: gradio\n") == {"title": value, "sdk": "gradio"}


def test_terminal_shows_control_characters_escaped_and_every_other_character_as_it_is():
    shown = markup.terminal("steak\nsushi: 0.999\r\x1b[31mRED\x1b[0m \u202egnp.exe caf\u00e9 \u7bc0 <b>")
    assert shown == "steak\\nsushi: 0.999\\r\\x1b[31mRED\\x1b[0m \\u202egnp.exe caf\u00e9 \u7bc0 <b>"
    assert shown.isprintable() and markup.terminal(42) == "42"

"""The documentation against the code: docs/settings.md lists every engine setting and every
server flag as the code declares them, and the pages link only to files (and sections) that
exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wyoming_kazeia.__main__ import build_parser
from wyoming_kazeia.settings import EngineSettings

ROOT = Path(__file__).resolve().parents[1]
SETTINGS_DOC = ROOT / "docs" / "settings.md"
PAGES = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", *(ROOT / "docs").glob("*.md")])

# [text](target): the target up to the first space (a title may follow) or ")".
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row (header and separator rows included), an escaped
    pipe (`\\|`) kept inside its cell as `|`."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
            rows.append([cell.strip().replace("\\|", "|") for cell in cells])
    return rows


def row_with(rows: list[list[str]], first_cell: str) -> list[str] | None:
    return next((row for row in rows if row and row[0] == first_cell), None)


def links(page: Path) -> list[str]:
    """The relative link targets of a page, outside code blocks and code spans."""
    text = CODE_SPAN.sub("", CODE_BLOCK.sub("", page.read_text()))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in CODE_BLOCK.sub("", page.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def test_every_setting_is_documented_with_its_variable() -> None:
    rows = table_rows(SETTINGS_DOC.read_text())
    for name, env, allowed, _doc in EngineSettings.describe():
        row = row_with(rows, f"`{name}`")
        assert row is not None, f"docs/settings.md has no row for setting {name}"
        assert f"`{env}`" in row, f"docs/settings.md: {name}'s row does not name {env}"
        assert f"`{allowed}`" in row, f"docs/settings.md: {name}'s row does not say {allowed!r}"


def test_every_setting_is_documented_with_its_default() -> None:
    rows = table_rows(SETTINGS_DOC.read_text())
    header = rows[0]
    assert header[:4] == ["setting", "flag", "variable", "default"], header
    defaults = EngineSettings()
    for name, *_ in EngineSettings.describe():
        row = row_with(rows, f"`{name}`")
        assert row is not None
        value = getattr(defaults, name)
        if value is None:  # the model's value, random, another setting's: said in words
            continue
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        assert row[3].strip("`") == shown, f"docs/settings.md: {name}'s default is {shown}"


def server_flags() -> list[tuple[list[str], str | None]]:
    """Every flag of the server's parser: its long option strings and its variable (named in
    its help), --help and --version aside."""
    flags = []
    for action in build_parser()._actions:
        options = [o for o in action.option_strings if o.startswith("--")]
        if not options or options[0] in ("--help", "--version"):
            continue
        variable = re.search(r"\b(KZTTS_[A-Z_]+)", action.help or "")
        flags.append((options, variable.group(1) if variable else None))
    return flags


def test_the_server_has_flags_to_document() -> None:
    options = {o for option_strings, _ in server_flags() for o in option_strings}
    assert {"--uri", "--voice", "--threads", "--mqtt-host", "--no-mqtt-tls"} <= options


@pytest.mark.parametrize(
    ("options", "variable"), [pytest.param(o, v, id=o[0]) for o, v in server_flags()]
)
def test_every_flag_is_documented_with_its_variable(
    options: list[str], variable: str | None
) -> None:
    text = SETTINGS_DOC.read_text()
    lines = [line for line in text.splitlines() if line.startswith("|")]
    # A row naming the flag exactly (`--mqtt-tls`, not a prefix of --mqtt-tls-x).
    found = [
        line
        for line in lines
        if all(re.search(rf"`{re.escape(o)}(?![-\w])[^`]*`", line) for o in options)
    ]
    assert found, f"docs/settings.md has no table row for {', '.join(options)}"
    if variable is not None:
        assert any(f"`{variable}`" in line for line in found), (
            f"docs/settings.md: the row of {options[0]} does not name {variable}"
        )


def test_the_readme_and_the_settings_page_agree_on_the_default_voice() -> None:
    from wyoming_kazeia.voices import DEFAULT_SPEAKER

    for page in (ROOT / "README.md", SETTINGS_DOC):
        row = row_with(table_rows(page.read_text()), "`--voice`")
        assert row is not None, f"{page.name} has no --voice row"
        assert f"`{DEFAULT_SPEAKER}`" in row[2], page.name


def test_there_are_pages_and_links_to_check() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/settings.md", "docs/speakable-text.md"} <= names
    assert len(links(ROOT / "README.md")) > 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_an_existing_file(page: Path) -> None:
    missing = [
        target
        for target in links(page)
        if not (page.parent / target.split("#")[0]).resolve().exists()
    ]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_section_link_names_a_heading_of_its_page(page: Path) -> None:
    text = CODE_SPAN.sub("", CODE_BLOCK.sub("", page.read_text()))
    targets = [*links(page), *(t for t in LINK.findall(text) if t.startswith("#"))]
    broken = []
    for target in targets:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        is_page = linked.suffix == ".md" and linked.is_file()
        if anchor and is_page and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing sections: {broken}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme_links = {t.split("#")[0] for t in links(ROOT / "README.md")}
    for page in (ROOT / "docs").glob("*.md"):
        assert page.relative_to(ROOT).as_posix() in readme_links, f"README.md omits {page.name}"

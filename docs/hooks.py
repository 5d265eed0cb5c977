"""MkDocs hook: the generated sections of the pages, and the formulas.

A page says where generated content goes with a marker; the generated text is committed between
the marker and its closing marker, so the page reads whole on GitHub and in an editor::

    <!-- pflower:keys fedprox -->

    | key | type | default | allowed | description |
    ...

    <!-- /pflower:keys -->

``python docs/hooks.py --write`` (re)writes every section of every page from the code (a bare
marker, without its closing one, becomes a section); ``--check`` lists the stale pages
(tests/test_docs.py fails on one). The build drops the markers and puts in the text generated
now, so the site is current even where a committed section is not.

Markers (anywhere in a page but in a code span):

- ``<!-- pflower:config-reference -->``: every run-config key (:func:`pflower.reference.config_reference`)
- ``<!-- pflower:methods -->``: the table of declared methods, each linked to its page
- ``<!-- pflower:method-files -->``: the README's table of declared methods with their files
- ``<!-- pflower:method-count -->``: how many methods are declared (inline)
- ``<!-- pflower:row-keys -->``: the keys each method's strategy adds to metrics.json's rows
- ``<!-- pflower:client-state -->``: each method's declared client state (:mod:`pflower.client_state`)
- ``<!-- pflower:keys NAME -->``: method NAME's own keys
- ``<!-- pflower:evaluates -->``: what each method's clients evaluate; ``<!-- pflower:evaluates NAME -->``: NAME's
- ``<!-- pflower:code NAME -->``: where method NAME's declaration, client and server code live
- ``<!-- pflower:example NAME -->``: a short measured run of NAME's declared ``example`` (see :func:`example`)
- ``<!-- pflower:records NAME -->``: every recorded run of method NAME in the benchmark suites
  (:func:`pflower.method_records.method_records_markdown`)
- ``<!-- pflower:claims PAPER -->``: the checklist of PAPER's claims from ``bench/claims.toml`` and
  the records (:func:`pflower.claims.checklist_markdown`); ``<!-- pflower:claim-counts -->``: each
  paper's counts, linked to its checklist
- ``<!-- pflower:twin-runs -->``: runs recorded in two suites with one config and seed whose
  results differ, side by side with their machines (:func:`pflower.bench.twin_runs_markdown`)
- ``<!-- pflower:include PATH -->``: a file of the repository (PATH from its root) as a code block
- ``<!-- pflower:docker-test NAME -->``: the README's block marked ``<!-- docker-test: NAME -->``,
  the commands tests/test_docker_demo.py runs word for word

An unknown marker, an undeclared method or a missing file stops the build with the page's name.
A section is a block (blank lines around its text) except ``evaluates NAME``, one sentence that
runs on into the text after its closing marker, and ``method-count``, a number within its line.
README.md's sections are written and checked with the pages' (it is no page of the site).

Math: a page writes TeX between ``$...$`` (inline) or ``$$...$$`` (display), as GitHub reads it;
``pymdownx.arithmatex`` (generic mode) marks it and :func:`mathml` turns each formula into MathML
at build time (``latex2mathml``), so the site renders formulas with no script and no CDN.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

from pflower import reference
from pflower.bench import twin_runs_markdown
from pflower.claims import checklist_markdown, counts_markdown, load_claims
from pflower.method_records import method_records_markdown
from pflower.methods import declarations

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: A generated section: its marker, then (once written) the text generated and the closing
#: marker; ``body`` is None for a bare marker. A marker in a code span (between backticks) is
#: text about markers and stays as it is.
SECTION = re.compile(
    r"(?<!`)<!-- pflower:(?P<kind>[a-z-]+)(?: (?P<arg>\S+))? -->(?!`)(?:(?P<body>(?:(?!<!-- /?pflower:).)*?)<!-- /pflower:(?P=kind) -->)?",
    re.S,
)
LEFTOVER = re.compile(r"(?<!`)<!-- /?pflower:")
#: The command that rewrites the committed sections (the staleness test names it).
WRITE_COMMAND = ".venv/bin/python docs/hooks.py --write"


def example(name: str) -> str:
    """A short measured run of method ``name``'s declared ``example`` on the default data, from
    this checkout's record (the ``examples`` suite of ``pflower-bench``); no record stops the build."""
    from pflower.bench import example_markdown

    try:
        return example_markdown(name, ROOT / "bench" / "records", ROOT / "bench" / "suites.toml")
    except (ValueError, KeyError, IndexError, OSError, SystemExit) as err:
        raise PluginError(f"the example of method '{name}': {err}") from None


#: Each paper's claims (:mod:`pflower.claims`).
CLAIMS = ROOT / "bench" / "claims.toml"


def _paper(name: str | None, page: str) -> str:
    if name not in load_claims(CLAIMS):
        raise PluginError(f"{page}: no paper '{name}' in bench/claims.toml (it has {', '.join(load_claims(CLAIMS))})")
    return name


def _method(name: str | None, page: str) -> str:
    if name not in declarations():
        raise PluginError(f"{page}: no declared method {name!r} (methods: {', '.join(declarations())})")
    return name


def _include(path: str | None, page: str) -> str:
    file = ROOT / (path or "")
    if not path or not file.is_file():
        raise PluginError(f"{page}: cannot include {path!r}: no such file in the repository")
    language = {".py": "python", ".toml": "toml", ".yml": "yaml", ".sh": "bash"}.get(file.suffix, "")
    return f"```{language}\n{file.read_text().rstrip()}\n```"


def _docker_test(name: str | None, page: str) -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = {m[1]: m[2] for m in re.finditer(r"<!-- docker-test: (\S+) -->\n```bash\n(.*?)```", readme, re.S)}
    if name not in blocks:
        raise PluginError(f"{page}: README.md has no block marked '<!-- docker-test: {name} -->' (it has {', '.join(blocks)})")
    return f"```bash\n{blocks[name]}```"


def render(kind: str, arg: str | None, page: str) -> str:
    """The Markdown that replaces the marker ``<!-- pflower:KIND ARG -->`` on ``page``."""
    if kind == "config-reference":
        return reference.config_reference()
    if kind == "methods":
        return reference.methods_table(link=_link_to_methods(page) + "{name}.md")
    if kind == "method-files":
        return reference.method_files_table()
    if kind == "method-count":
        return reference.method_count()
    if kind == "row-keys":
        return reference.row_keys_table(link=_link_to_methods(page) + "{name}.md")
    if kind == "client-state":
        return reference.client_state_table(link=_link_to_methods(page) + "{name}.md")
    if kind == "keys":
        return reference.method_keys(_method(arg, page))
    if kind == "evaluates":
        if arg is None:
            return reference.evaluation_table(link=_link_to_methods(page) + "{name}.md")
        return f"A client evaluates {reference.evaluates(_method(arg, page))}."
    if kind == "code":
        return reference.method_code(_method(arg, page))
    if kind == "example":
        return example(_method(arg, page))
    if kind == "records":
        return method_records_markdown(_method(arg, page), ROOT / "bench" / "suites.toml", ROOT / "bench" / "records", DOCS, link="../" * page.count("/"))
    if kind == "claims":
        return checklist_markdown(_paper(arg, page), CLAIMS, ROOT / "bench" / "suites.toml", ROOT / "bench" / "records")
    if kind == "claim-counts":
        link = "docs/{page}" if page == README else "../" * page.count("/") + "{page}"
        return counts_markdown(CLAIMS, ROOT / "bench" / "suites.toml", ROOT / "bench" / "records", link=link)
    if kind == "twin-runs":
        return twin_runs_markdown(ROOT / "bench" / "records")
    if kind == "include":
        return _include(arg, page)
    if kind == "docker-test":
        return _docker_test(arg, page)
    raise PluginError(f"{page}: unknown marker '<!-- pflower:{kind} -->'")


def _link_to_methods(page: str) -> str:
    """The relative path from ``page`` (a path under docs/) to the methods folder."""
    depth = page.count("/")
    return "../" * depth + "methods/" if not page.startswith("methods/") else ""


def _leftover(text: str, page: str) -> None:
    left = LEFTOVER.search(text)
    if left:
        raise PluginError(f"{page}: a malformed marker: {text[left.start() :].splitlines()[0]!r}")


def expand(markdown: str, page: str) -> str:
    """``markdown`` as the site shows it: every section (or bare marker) replaced by the text
    generated now, the markers dropped."""
    out = SECTION.sub(lambda m: render(m["kind"], m["arg"], page), markdown)
    _leftover(out, page)
    return out


def _separator(kind: str, arg: str | None) -> str:
    """What stands between a section's markers and its text: nothing for a number within its
    line (``method-count``), a line break for a sentence (``evaluates NAME``), a blank line for a block."""
    if kind == "method-count":
        return ""
    return "\n" if kind == "evaluates" and arg is not None else "\n\n"


def section(kind: str, arg: str | None, content: str) -> str:
    """A generated section as committed: marker, text, closing marker."""
    sep = _separator(kind, arg)
    return f"<!-- pflower:{kind}{f' {arg}' if arg else ''} -->{sep}{content.strip(chr(10))}{sep}<!-- /pflower:{kind} -->"


def regenerate(markdown: str, page: str) -> str:
    """``markdown`` with every section rewritten from the code (what ``--write`` commits). Text
    after a bare marker on its line goes on the line after the new section's closing marker."""
    out, end = [], 0
    for m in SECTION.finditer(markdown):
        out.append(markdown[end : m.start()])
        out.append(section(m["kind"], m["arg"], render(m["kind"], m["arg"], page)))
        end = m.end()
        if m["body"] is None:
            rest = re.match(r"[ \t]*(?=\S)", markdown[end:])
            if rest:  # text on the marker's line
                out.append("\n")
                end += rest.end()
    out.append(markdown[end:])
    text = "".join(out)
    _leftover(SECTION.sub("", text), page)
    return text


#: README.md's name among the pages (a path under docs/ would be ../README.md; no site page).
README = "../README.md"


def pages() -> dict[str, Path]:
    """Every page of the site, by its path under docs/, and the README."""
    return {**{p.relative_to(DOCS).as_posix(): p for p in sorted(DOCS.rglob("*.md"))}, README: ROOT / "README.md"}


def stale() -> list[str]:
    """The pages whose committed sections differ from what the code generates now."""
    return [name for name, path in pages().items() if regenerate(text := path.read_text(), name) != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="docs/hooks.py", description="The pages' generated sections, from the code.")
    parser.add_argument("--write", action="store_true", help="rewrite every stale page's sections")
    parser.add_argument("--check", action="store_true", help="list the stale pages; exit 1 if there is one")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        parser.error("say --write or --check")
    names = stale()
    for name in names:
        if args.write:
            path = pages()[name]
            path.write_text(regenerate(path.read_text(), name))
        print(f"{'rewrote' if args.write else 'stale'}: {pages()[name].relative_to(ROOT)}")
    return 1 if names and args.check else 0


def on_pre_build(config) -> None:
    """A new build reads the records again (``mkdocs serve`` keeps this module's imports)."""
    from pflower import method_records

    method_records._rows.cache_clear()


def on_page_markdown(markdown: str, page, config, files) -> str:
    return expand(markdown, page.file.src_uri)


#: What pymdownx.arithmatex (generic) makes of ``$...$`` and ``$$...$$``: the TeX, HTML-escaped.
ARITHMATEX = re.compile(r'<span class="arithmatex">\\\((?P<inline>.*?)\\\)</span>|<div class="arithmatex">\\\[(?P<block>.*?)\\\]</div>', re.S)


def mathml(page_html: str, page: str = "") -> str:
    """``page_html`` with every formula arithmatex marked as MathML (a formula latex2mathml cannot
    read stops the build, naming the page and the formula)."""
    from latex2mathml.converter import convert

    def one(m: re.Match) -> str:
        tex = html.unescape(m["inline"] if m["inline"] is not None else m["block"]).strip()
        try:
            out = convert(tex, display="inline" if m["inline"] is not None else "block")
        except Exception as err:  # latex2mathml raises its own errors and plain ones alike
            raise PluginError(f"{page}: the formula {tex!r} is not TeX that latex2mathml reads: {err!r}") from None
        unknown = re.findall(r"\\(?:[A-Za-z]+|[^A-Za-z\s])", out)  # what it does not know comes out as text (\Big\| as a literal \|)
        if unknown:
            raise PluginError(f"{page}: the formula {tex!r} is not TeX that latex2mathml reads: {', '.join(unknown)}")
        return out

    return ARITHMATEX.sub(one, page_html)


#: A table cell's content or code span kept on one line (extra.css: ``.whole``), its text as
#: shown: one token of up to 24 characters (a method, key, value or ``train/<class>/``), a figure
#: such as ``0.5792 ± 0.0097`` or a rank such as ``=8 of 19``.
WHOLE = re.compile(r"\S{1,24}|[+-]?\d+(\.\d+)? ± \d+(\.\d+)?|=?\d+ of \d+")
CELL = re.compile(r"<(td|th)(\s[^>]*)?>(.*?)</\1>", re.S)
CODE = re.compile(r"<code>([^<]*)</code>")
#: A path's slash, where a long code span may break (not in ``//`` or ``:///``).
SLASH = re.compile(r"(?<![/:])/(?!/)")


def _whole(text: str) -> bool:
    """Whether HTML ``text`` (no tags: a cell holding a link or emphasis is not one token) is kept whole."""
    return "<" not in text and WHOLE.fullmatch(html.unescape(text.strip())) is not None


def whole_cells(page_html: str) -> str:
    """``page_html`` with each table cell (and code span in a cell) that :data:`WHOLE` matches
    marked ``whole``, so that a narrow column wraps its text but never splits a name or a figure;
    a longer code span may also break after each slash of a path."""

    def code(c: re.Match) -> str:
        return f'<code class="whole">{c[1]}</code>' if _whole(c[1]) else f"<code>{SLASH.sub('/<wbr>', c[1])}</code>"

    def cell(m: re.Match) -> str:
        tag, attrs, body = m[1], m[2] or "", CODE.sub(code, m[3])
        if tag == "td" and "class=" not in attrs and _whole(m[3]):
            attrs += ' class="whole"'
        return f"<{tag}{attrs}>{body}</{tag}>"

    return CELL.sub(cell, page_html)


def on_page_content(page_html: str, page, config, files) -> str:
    return whole_cells(mathml(page_html, page.file.src_uri))


if __name__ == "__main__":
    sys.exit(main())

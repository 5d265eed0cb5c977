"""MkDocs hook: pages say where generated content goes with a marker, and the build fills it in.

Markers (anywhere in a page but in a code span):

- ``<!-- pflower:config-reference -->``: every run-config key (:func:`pflower.reference.config_reference`)
- ``<!-- pflower:methods -->``: the table of declared methods, each linked to its page
- ``<!-- pflower:keys NAME -->``: method NAME's own keys
- ``<!-- pflower:evaluates -->``: what each method's clients evaluate; ``<!-- pflower:evaluates NAME -->``: NAME's
- ``<!-- pflower:code NAME -->``: where method NAME's declaration, client and server code live
- ``<!-- pflower:example NAME -->``: a short measured run of NAME's declared ``example`` (see :func:`example`)
- ``<!-- pflower:include PATH -->``: a file of the repository (PATH from its root) as a code block
- ``<!-- pflower:docker-test NAME -->``: the README's block marked ``<!-- docker-test: NAME -->``,
  the commands tests/test_docker_demo.py runs word for word

An unknown marker, an undeclared method or a missing file stops the build with the page's name.

Math: a page writes TeX between ``$...$`` (inline) or ``$$...$$`` (display), as GitHub reads it;
``pymdownx.arithmatex`` (generic mode) marks it and :func:`mathml` turns each formula into MathML
at build time (``latex2mathml``), so the site renders formulas with no script and no CDN.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

from pflower import reference
from pflower.methods import declarations

ROOT = Path(__file__).resolve().parent.parent
#: A marker; one in a code span (between backticks) is text about markers and stays as it is.
MARKER = re.compile(r"(?<!`)<!-- pflower:([a-z-]+)(?: (\S+))? -->(?!`)")
LEFTOVER = re.compile(r"(?<!`)<!-- pflower:")


def example(name: str) -> str:
    """A short measured run of method ``name``'s declared ``example`` on the default data, from
    this checkout's record (the ``examples`` suite of ``pflower-bench``); no record stops the build."""
    from pflower.bench import example_markdown

    try:
        return example_markdown(name, ROOT / "bench" / "records", ROOT / "bench" / "suites.toml")
    except (ValueError, KeyError, IndexError, OSError, SystemExit) as err:
        raise PluginError(f"the example of method '{name}': {err}") from None


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
    if kind == "include":
        return _include(arg, page)
    if kind == "docker-test":
        return _docker_test(arg, page)
    raise PluginError(f"{page}: unknown marker '<!-- pflower:{kind} -->'")


def _link_to_methods(page: str) -> str:
    """The relative path from ``page`` (a path under docs/) to the methods folder."""
    depth = page.count("/")
    return "../" * depth + "methods/" if not page.startswith("methods/") else ""


def expand(markdown: str, page: str) -> str:
    """``markdown`` with every pflower marker replaced."""
    out = MARKER.sub(lambda m: render(m.group(1), m.group(2), page), markdown)
    left = LEFTOVER.search(out)
    if left:
        raise PluginError(f"{page}: a malformed marker: {out[left.start() :].splitlines()[0]!r}")
    return out


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
        unknown = re.findall(r"\\[A-Za-z]+", out)  # a command it does not know comes out as text
        if unknown:
            raise PluginError(f"{page}: the formula {tex!r} is not TeX that latex2mathml reads: {', '.join(unknown)}")
        return out

    return ARITHMATEX.sub(one, page_html)


def on_page_content(page_html: str, page, config, files) -> str:
    return mathml(page_html, page.file.src_uri)

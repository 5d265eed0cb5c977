"""The documentation site: it builds with `mkdocs build --strict` (no broken link or anchor, no page
outside the nav) and loads nothing from elsewhere; formulas are TeX in the pages and MathML on the
site; the generated sections committed in the pages are what the code generates now; the
configuration reference is complete; and what a newcomer reads holds up: the glossary, the
diagrams and figures, commands that work as written, user pages that state what holds (dated
figures on measurements.md), and a README that stays a five-minute read."""

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT

from pflower import reference
from pflower.config import Settings, known_keys
from pflower.methods import declarations


def _hooks():
    spec = importlib.util.spec_from_file_location("pflower_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built once with `mkdocs build --strict`: (its folder, the build's log, its exit status)."""
    folder = tmp_path_factory.mktemp("docs") / "site"
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    return folder, out.stdout + out.stderr, out.returncode


def _page(site, name: str) -> str:
    folder, log, returncode = site
    assert returncode == 0, log
    return (folder / name / "index.html").read_text()


def _prose(page_html: str) -> str:
    """A built page's text outside code, scripts and formulas (what a reader sees as prose)."""
    body = page_html.split('<article class="md-content__inner', 1)[-1].split("</article>", 1)[0]
    return re.sub(r"<(pre|code|script|style|math)\b.*?</\1>", " ", body, flags=re.S)


def test_the_site_builds_strictly_without_a_warning(site):
    folder, log, returncode = site
    assert returncode == 0, log
    assert not re.search(r"^(WARNING|ERROR)", log, re.M), log
    page = _page(site, "configuration")
    assert "pflower:" not in page and "num-server-rounds" in page and "superfed.mixing" in page


#: Pages whose formulas are TeX in the source and MathML on the site.
MATH_PAGES = ["methods/pfedla", "methods/heurpfedla", "methods/federico", "methods/superfed", "methods/pfedme"]


def test_formulas_are_tex_in_the_source_and_mathml_on_the_site(site):
    for name in MATH_PAGES:
        source = (ROOT / "docs" / f"{name}.md").read_text()
        assert re.search(r"\$[^$\s][^$]*\\[a-z]+[^$]*\$", source), f"{name}.md: no $...$ TeX formula (GitHub renders them)"
        prose = _prose(_page(site, name))
        assert _page(site, name).count("<math") >= 2, name
        # No TeX left for a reader: no delimiters, no commands, no sub/superscript groups.
        leftover = re.findall(r"\$|\\[()\[\]]|\\[a-zA-Z]+|[_^]\{|arithmatex", prose)
        assert not leftover, f"{name}: raw TeX on the built page: {leftover[:5]}"
    # The pseudo-TeX the pages used to show (α_i^{l,j}, θ̄_i) is gone from the sources' prose too.
    for name in MATH_PAGES:
        prose = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$|`[^`\n]*`", "", (ROOT / "docs" / f"{name}.md").read_text(), flags=re.S)
        assert not re.search(r"[α-ωΑ-Ω][_^]|\u0304|[_^]\{", prose), name


def test_the_hook_turns_tex_into_mathml_and_refuses_what_it_cannot_read():
    from mkdocs.exceptions import PluginError

    hooks = _hooks()
    out = hooks.mathml('<p><span class="arithmatex">\\(\\alpha_i^{l,j} &lt; 1\\)</span></p><div class="arithmatex">\\[\\sum_j x_j\\]</div>')
    assert out.count("<math") == 2 and 'display="inline"' in out and 'display="block"' in out
    assert "&#x003B1;" in out and "<msubsup>" in out and "&#x0003C;" in out and "arithmatex" not in out  # α, α_i^{l,j}, <
    for bad in ("\\left( x", "x^", "\\nosuchcommand x", "\\Big\\| x \\Big\\|"):
        with pytest.raises(PluginError, match="latex2mathml"):
            hooks.mathml(f'<span class="arithmatex">\\({bad}\\)</span>', "x.md")


def test_the_site_loads_nothing_from_elsewhere_and_carries_its_css(site):
    folder, log, returncode = site
    assert returncode == 0, log
    pages = sorted(folder.rglob("*.html"))
    external = {
        str(p.relative_to(folder)): m for p in pages if (m := re.findall(r'<(?:link|script|img)\b[^>]*(?:src|href)="(?:https?:)?//[^"]*"', p.read_text()))
    }
    assert external == {}, "the site must work offline (no CDN)"
    assert "stylesheets/extra.css" in (ROOT / "mkdocs.yml").read_text()
    assert all('stylesheets/extra.css"' in p.read_text() for p in pages if p.name == "index.html")
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    # Long shell lines wrap; every other block scrolls with a visible scrollbar; in a table a name
    # or a figure the build marks whole stays on one line, and longer code breaks at a word's end
    # or after a path's slash, never mid-word.
    assert re.search(r"\.language-bash pre > code[^{]*\{[^}]*white-space: pre-wrap", css, re.S)
    assert re.search(r"pre > code \{[^}]*scrollbar-width: auto", css)
    assert re.search(r"td code,[^{]*\{[^}]*word-break: normal;[^}]*overflow-wrap: break-word", css, re.S)
    assert re.search(r"td\.whole,[^{]*code\.whole \{[^}]*white-space: nowrap", css, re.S)
    assert 'class="language-bash highlight"' in _page(site, "getting-started")
    methods, records = _page(site, "methods"), _page(site, "methods/pfedla")
    assert '<code class="whole">fedavg-ft</code>' in methods and "<code>pflower/<wbr>client_app/<wbr>fedbn.py</code>" in methods
    assert re.search(r'<td class="whole">0\.\d{4} ± 0\.\d{4}</td>', records) and '<code class="whole">pfedla-frozen</code>' in records


def test_every_key_has_a_description():
    missing = [n for n, f in Settings.model_fields.items() if n not in reference.NOT_KEYS and not f.description]
    missing += [f"{name}.{k}" for name, m in declarations().items() for k, f in m.params.model_fields.items() if not f.description]
    assert not missing, f"keys without a description: {missing}"


def test_the_reference_lists_every_key_with_its_type_default_bounds_and_description():
    text = reference.config_reference()
    rows = {r[0]: r for r in reference.rows(Settings)}
    rows |= {r[0]: r for name, m in declarations().items() for r in reference.rows(m.params, f"{name}.")}
    assert list(rows) == known_keys()
    for key in known_keys():
        assert f"| `{key}` |" in text, key
    assert rows["lr"][1:4] == ("float", "0.1", "value > 0")
    assert rows["dominant-fraction"][3] == "0 < value < 1"
    assert rows["test-mode"][1:4] == ("string", "'local'", "`'local'`, `'global'`, `'both'`")
    assert rows["download"][1:3] == ("boolean", "false")
    assert rows["superfed.start"][1:4] == ("float", "0.4", "0 ≤ value ≤ 1")
    assert all(f"`'{n}'`" in rows["method"][3] for n in declarations())
    assert "`superfed`" not in rows["finetune-epochs"][4] and "`fedavg`" in rows["gradual-interval"][4]
    assert reference.method_keys("fedavg").startswith("This method has no keys of its own")


def test_every_method_has_a_page_in_the_nav_with_its_generated_parts():
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in declarations():
        page = ROOT / "docs" / "methods" / f"{name}.md"
        assert f"methods/{name}.md" in nav, name
        text = page.read_text()
        for kind in ("keys", "evaluates", "example", "records", "code"):
            assert f"<!-- pflower:{kind} {name} -->" in text, (name, kind)


def test_the_hook_fills_every_marker_and_refuses_an_unknown_one():
    from mkdocs.exceptions import PluginError

    hooks = _hooks()
    text = hooks.expand("a\n<!-- pflower:keys fedprox -->\n<!-- pflower:code fedprox -->\n`<!-- pflower:keys NAME -->`\n", "methods/fedprox.md")
    assert "| `fedprox.mu` | float | `0.01` | value ≥ 0 |" in text
    assert "`pflower/client_app/fedprox.py` (`FedProxClient`)" in text and "`<!-- pflower:keys NAME -->`" in text
    assert hooks.expand("<!-- pflower:example fedprox -->", "methods/fedprox.md") == hooks.example("fedprox")
    block = hooks.expand("<!-- pflower:docker-test down -->", "deployment.md")
    assert block == "```bash\ndocker compose -f docker/compose.yml -f docker/compose.tls.yml down -v\n```"
    for bad in ("<!-- pflower:keys nosuch -->", "<!-- pflower:nosuch -->", "<!-- pflower:include nosuch.py -->", "<!-- pflower:keys fedprox-->"):
        with pytest.raises(PluginError):
            hooks.expand(bad, "x.md")


def test_every_generated_section_is_committed_and_current():
    """The pages carry their generated text (GitHub and editors show it): what the code generates
    now, between every marker and its closing marker."""
    hooks = _hooks()
    assert hooks.stale() == [], f"generated sections differ from the code: run `{hooks.WRITE_COMMAND}` and commit"
    for name, path in hooks.pages().items():
        for m in hooks.SECTION.finditer(path.read_text()):
            assert m["body"] is not None and m["body"].strip(), (name, m[0][:60])


def test_a_section_is_written_from_a_bare_marker_and_built_without_its_markers():
    from mkdocs.exceptions import PluginError

    hooks = _hooks()
    bare = "## Keys\n\n<!-- pflower:keys fedprox -->\n\ntext\n\n<!-- pflower:evaluates fedprox --> See the protocol.\n"
    written = hooks.regenerate(bare, "methods/fedprox.md")
    keys = hooks.reference.method_keys("fedprox")
    assert f"<!-- pflower:keys fedprox -->\n\n{keys}\n\n<!-- /pflower:keys -->\n\ntext" in written
    # One sentence, running on into the text after it on the site; the text moves below it.
    sentence = "A client evaluates the global model as the server sends it."
    assert written.endswith(f"<!-- pflower:evaluates fedprox -->\n{sentence}\n<!-- /pflower:evaluates -->\nSee the protocol.\n")
    assert hooks.regenerate(written, "methods/fedprox.md") == written
    # The site shows the text generated now, without markers, whether the section is current or stale.
    built = hooks.expand(written, "methods/fedprox.md")
    assert built == f"## Keys\n\n{keys}\n\ntext\n\n{sentence}\nSee the protocol.\n" and "pflower:" not in built
    stale = written.replace("`0.01`", "`0.5`")
    assert hooks.expand(stale, "methods/fedprox.md") == built and hooks.regenerate(stale, "methods/fedprox.md") == written
    for bad in ("<!-- pflower:keys fedprox -->x<!-- /pflower:code -->", "<!-- /pflower:keys -->"):
        with pytest.raises(PluginError, match="malformed"):
            hooks.regenerate(bad, "methods/fedprox.md")


def test_the_readme_is_a_five_minute_read():
    """At most 300 lines besides the generated method table (which grows by a row a method: a
    new method never pushes other prose out)."""
    text = re.sub(r"<!-- pflower:method-files -->.*?<!-- /pflower:method-files -->", "", (ROOT / "README.md").read_text(), flags=re.S)
    lines = text.splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines besides its method table; move detail to docs/"


def _lists_glued_to_a_paragraph(text: str) -> list[int]:
    """Lines that start a bulleted list right after a paragraph line: Python-Markdown renders them
    as that paragraph with a literal ' - ' (a list needs a blank line before it)."""
    glued, fence, prev = [], False, ""
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence, prev = not fence, ""
            continue
        item = re.match(r"[-*] ", line)
        in_list = re.match(r"\s*([-*]|\d+\.) ", prev) or prev.startswith("  ")
        if not fence and item and prev.strip() and not in_list and not prev.lstrip().startswith(("|", "<!--", "#", ">", "    ")):
            glued.append(number)
        prev = "" if fence else line
    return glued


def test_no_list_is_glued_to_the_paragraph_before_it():
    assert _lists_glued_to_a_paragraph("text\n- item\n") == [2] and _lists_glued_to_a_paragraph("text\n\n- item\n- next\n  more\n- last\n") == []
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    assert {str(p.relative_to(ROOT)): lines for p in pages if (lines := _lists_glued_to_a_paragraph(p.read_text()))} == {}


# ---------------------------------------------------------------------------------------------
# What a newcomer reads: the glossary, the pictures, the commands, and the tone of the pages.

#: Every term the glossary defines (its headings), as the pages link them.
GLOSSARY_TERMS = [
    "SuperLink", "SuperNode", "ServerApp", "ClientApp", "FAB", "Run config", "Node config", "Simulation engine", "Round",
    "Pathological partition", "non-IID_1 and non-IID_2", "Dirichlet partition", "Personalization", "Personalized model",
    "Head and body", "Global model", "Local model",
]  # fmt: skip


def test_the_glossary_is_in_the_nav_defines_the_terms_and_the_pages_link_it(site):
    assert "Glossary: glossary.md" in (ROOT / "mkdocs.yml").read_text()
    headings = re.findall(r"^### (.+)$", (ROOT / "docs" / "glossary.md").read_text(), re.M)
    assert [t for t in GLOSSARY_TERMS if t not in headings] == []
    # The pages a newcomer starts from link the terms where they first use them.
    for page in ("index.md", "getting-started.md", "deployment.md", "architecture.md", "simulation.md", "methods/index.md"):
        assert re.search(r"\]\((\.\./)?glossary\.md#[a-z0-9_-]+\)", (ROOT / "docs" / page).read_text()), page
    built = _page(site, "glossary")
    for anchor in ("superlink", "fab", "node-config", "non-iid_1-and-non-iid_2", "head-and-body"):
        assert f'id="{anchor}"' in built, anchor


def _images(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text) + re.findall(r'<img [^>]*src="([^"]+)"', text)


def test_every_image_a_page_shows_exists_and_the_figures_stay_small():
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    shown = {(p, src) for p in pages for src in _images(p) if not src.startswith(("http:", "https:"))}
    assert [f"{p.relative_to(ROOT)}: {src}" for p, src in shown if not (p.parent / src).is_file()] == []
    assert not [src for p, src in shown if src.startswith(("http:", "https:", "//"))]
    # The figures committed for the site (docs/figures): small, so the repository stays small.
    big = {f.name: f.stat().st_size for f in (ROOT / "docs" / "figures").iterdir() if f.stat().st_size >= 150_000}
    assert big == {}, "keep a figure under 150 KB"
    # The newcomer's pages show the diagrams and a sample of the main job's figures.
    wanted = {
        "index.md": ["figures/architecture.svg"],
        "architecture.md": ["figures/architecture.svg"],
        "deployment.md": ["figures/deployment.svg"],
        "getting-started.md": ["figures/main-job-partition.png", "figures/main-job-accuracy.png", "figures/main-job-alpha-heatmap.png"],
    }
    for page, sources in wanted.items():
        assert set(sources) <= set(_images(ROOT / "docs" / page)), page


def test_the_diagrams_are_what_scripts_diagrams_py_writes():
    spec = importlib.util.spec_from_file_location("pflower_diagrams", ROOT / "scripts" / "diagrams.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, draw in module.DIAGRAMS.items():
        svg = draw()
        assert (ROOT / "docs" / "figures" / name).read_text() == svg, f"docs/figures/{name} is stale: run `python scripts/diagrams.py`"
        assert svg.startswith("<svg ") and "<title>" in svg and "http://www.w3.org/2000/svg" in svg and "href=" not in svg
    architecture, deployment = module.architecture(), module.deployment()
    for term in ("ServerApp", "ClientApp", "SuperLink", "SuperNode", "simulation engine", "Ray", "strategies/"):
        assert term in architecture, term
    for term in ("flower-superlink", "flower-supernode", "TLS", "--enable-supernode-auth", "--auth-supernode-private-key", "ServerApp", "ClientApp"):
        assert term in deployment, term


#: Lab-notebook phrases: history of the work, other people's load, requirements from issues. The
#: user pages say what holds and how to reproduce it; dated figures live on measurements.md.
LAB_NOTEBOOK = [
    "previous session", "this session", "the issue", "issue's", "earlier commit", "last commit", "previous work",
    "target ≤", "target <", "target:", "(target", "today", "other engineers", "other people's", "we measured",
    "minutes here", " s here", "could not try here", "in the last suites", "first version",
]  # fmt: skip


def test_no_user_page_reads_like_a_lab_notebook():
    # measurements.md and the reproduction pages are the records of measurements (each run's time
    # "here" belongs there); every other page is a user page.
    pages = [p for p in sorted((ROOT / "docs").rglob("*.md")) if p.name != "measurements.md" and "reproductions" not in p.parts]
    found = {f"{p.relative_to(ROOT)}: {phrase!r}" for p in [*pages, ROOT / "README.md"] for phrase in LAB_NOTEBOOK if phrase.lower() in p.read_text().lower()}
    assert found == set(), "state what holds; move dated measurements to docs/measurements.md"
    nav = (ROOT / "mkdocs.yml").read_text()
    assert "Measurements: measurements.md" in nav
    measurements = (ROOT / "docs" / "measurements.md").read_text()
    # The one page of dated figures names its machine and gives every measurement a date.
    assert "Intel(R) Xeon(R) Processor" in measurements and "2 cores" in measurements
    for section in re.split(r"^## ", measurements, flags=re.M)[2:]:
        assert re.search(r"20\d\d-\d\d-\d\d", section), section.splitlines()[0]


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def _commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and heredoc bodies dropped."""
    block = re.sub(r"<<TOML\n.*?\nTOML\n", "\n", block, flags=re.S).replace("\\\n", " ")
    return [line.split(" #")[0].strip() for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_pages_write_every_command_for_the_activated_venv():
    """Said once per page: activate the venv; then every block calls the venv's commands bare."""
    for name in (
        "README.md",
        "docs/getting-started.md",
        "docs/deployment.md",
        "docs/performance.md",
        "docs/measurements.md",
        "docs/simulation.md",
        "docs/results.md",
    ):
        text = (ROOT / name).read_text()
        if name in ("README.md", "docs/getting-started.md", "docs/deployment.md", "docs/performance.md", "docs/measurements.md"):
            assert ". .venv/bin/activate" in text, f"{name}: say once to activate the venv"
        calls = [c for b in _bash_blocks(text) for c in _commands(b) if ".venv/bin/" in c and c != ". .venv/bin/activate"]
        assert calls == [], f"{name}: {calls}"


def _separate_machines(text: str) -> str:
    """The commands of a page's separate-machines walk-through (they start with the certificates)."""
    keys = ("flower-superlink", "flower-supernode", "supernode register", "certs --dir certs", "flwr run . prod")
    blocks = [b for b in _bash_blocks(text) if any(k in b for k in keys)]
    return "\n".join(b for b in blocks if "pflower-deploy up" not in b)


@pytest.mark.parametrize("page", ["README.md", "docs/deployment.md"])
def test_the_separate_machines_commands_work_as_written(page, tmp_path, monkeypatch):
    """Step 1 runs for real (the certificates); every path the later steps name is what it wrote;
    Flower's own parsers accept the SuperLink's and SuperNode's flags; the flwr CLI's connection
    written by the heredoc is the SuperLink's address and the CA."""
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    from pflower.deploy import cli

    text = _separate_machines((ROOT / page).read_text())
    commands = _commands(text)
    monkeypatch.chdir(tmp_path)
    certs = next(c for c in commands if c.startswith("pflower-deploy certs"))
    assert cli.main(shlex.split(certs)[1:]) == 0
    host = shlex.split(certs)[shlex.split(certs).index("--host") + 1]
    link = _parse_args_run_superlink().parse_args(shlex.split(next(c for c in commands if c.startswith("flower-superlink")))[1:])
    for path in (link.ssl_ca_certfile, link.ssl_certfile, link.ssl_keyfile):
        assert (tmp_path / path).is_file(), path
    assert link.enable_supernode_auth and Path(link.database).parent.as_posix() in {c.split()[-1] for c in commands if c.startswith("mkdir -p")}
    node = _parse_args_run_supernode().parse_args(shlex.split(next(c for c in commands if c.startswith("flower-supernode")))[1:])
    assert node.superlink == f"{host}:9092" and (tmp_path / node.root_certificates).is_file()
    assert (tmp_path / node.auth_supernode_private_key).is_file() and "partition-id=0" in node.node_config
    register = next(c for c in commands if "flwr supernode register" in c)
    for i in range(3):
        key = register.split("register ")[1].split()[0].replace("$i", str(i))
        assert (tmp_path / key).is_file(), key
    toml = re.search(r"<<TOML\n(.*?)\nTOML", text, re.S)[1].replace("$PWD", str(tmp_path))
    config = tomllib.loads(toml)["superlink"]
    connection = config[config["default"]]
    assert connection["address"] == f"{host}:8000" and Path(connection["root-certificates"]) == tmp_path / link.ssl_ca_certfile
    assert f"flwr run . {config['default']} " in text and f"register certs/keys/node$i.pub {config['default']}" in text

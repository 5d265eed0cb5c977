"""The documentation's two diagrams, written as plain SVG (no Graphviz, nothing fetched at build).

    .venv/bin/python scripts/diagrams.py          # rewrites docs/figures/architecture.svg and deployment.svg

tests/test_docs.py fails while a committed SVG differs from what this script writes. Each
diagram is a list of boxes, arrows and labels at fixed coordinates; text is SVG text (searchable,
sharp at any zoom) in the reader's sans-serif font, sized so the longest line fits its box.
"""

from __future__ import annotations

import sys
from html import escape
from pathlib import Path

FIGURES = Path(__file__).resolve().parent.parent / "docs" / "figures"

#: Fill and stroke per kind of box: Flower's processes, pflower's code, machines, data.
STYLE = {
    "flower": ("#e8eefc", "#3f51b5"),
    "pflower": ("#fff4e0", "#e07b00"),
    "machine": ("#ffffff", "#777777"),
    "engine": ("#eef7ee", "#2e7d32"),
    "data": ("#f3f3f3", "#999999"),
}
LINE = 17  # px between text lines at font-size 13


class Svg:
    def __init__(self, width: int, height: int, title: str):
        self.width, self.height, self.title = width, height, title
        self.parts: list[str] = []

    def box(self, x, y, w, h, kind, title="", lines=(), dashed=False, title_size=14):
        fill, stroke = STYLE[kind]
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        self.parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{fill}" stroke="{stroke}" stroke-width="1.5"{dash}/>')
        ty = y + 20
        if title:
            self.text(x + 10, ty, title, size=title_size, bold=True, color=stroke if kind != "data" else "#444")
            ty += LINE + 2
        for line in lines:
            self.text(x + 10, ty, line)
            ty += LINE

    def text(self, x, y, s, size=13, bold=False, color="#222", anchor="start", italic=False):
        weight = ' font-weight="bold"' if bold else ""
        style = ' font-style="italic"' if italic else ""
        self.parts.append(f'<text x="{x}" y="{y}" font-size="{size}" fill="{color}" text-anchor="{anchor}"{weight}{style}>{escape(s)}</text>')

    def arrow(self, x1, y1, x2, y2, both=False, color="#333", dashed=False):
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        start = ' marker-start="url(#head)"' if both else ""
        self.parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{color}" stroke-width="1.6"{dash}{start} marker-end="url(#head)"/>')

    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" viewBox="0 0 {self.width} {self.height}" '
            f'role="img" aria-label="{escape(self.title)}" font-family="Helvetica, Arial, sans-serif">\n'
            f"<title>{escape(self.title)}</title>\n"
            '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            '<path d="M0,0 L10,5 L0,10 z" fill="#333"/></marker></defs>\n'
            f'<rect width="{self.width}" height="{self.height}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"


def architecture() -> str:
    """The ServerApp with its strategy, the SuperLink, and the ClientApps: in Ray's simulation
    engine (pflower-sim) or on SuperNodes (deployment)."""
    s = Svg(960, 700, "pflower's architecture: a ServerApp and a ClientApp on Flower, in simulation or deployment")
    # The ServerApp and its strategy.
    s.box(20, 16, 920, 262, "pflower", "ServerApp  (pflower/server_app/app.py, one process per run)")
    s.box(36, 58, 280, 62, "pflower", "", ["run config → Settings (config.py),", "checked once, before anything starts"])
    s.box(330, 58, 290, 62, "pflower", "", ["build.py: the method's declaration", "(methods/) names its strategy and client"])
    s.box(634, 58, 290, 62, "data", "", ["results-dir: metrics.json, figures,", "checkpoints; TensorBoard / MLflow"])
    s.box(36, 132, 888, 132, "pflower", "the method's strategy  (pflower/strategies/)", title_size=13)
    s.box(50, 162, 205, 90, "pflower", "", ["loop.py: the rounds,", "train → aggregate →", "evaluate; records,", "checkpoints"])
    s.box(267, 162, 205, 90, "pflower", "", ["federation.py: client ids", "(partition-id), seeded", "sampling, one phase of", "messages, bytes, missing"])
    s.box(484, 162, 205, 90, "pflower", "", ["gate.py + validation.py:", "every reply checked", "(shapes, NaN, bounds)", "before it is used"])
    s.box(701, 162, 210, 90, "pflower", "", ["the method's server:", "fedavg.py, pfedla.py,", "fedfomo.py, federico.py", "(a relay), …"])
    # Messages to and from the SuperLink.
    s.arrow(430, 282, 430, 330)
    s.arrow(530, 330, 530, 282)
    s.text(418, 310, "messages through Flower's Grid: the arrays the method sends", size=12, anchor="end")
    s.text(542, 310, "replies: the method's upload keys, metrics", size=12)
    s.box(
        20,
        334,
        920,
        52,
        "flower",
        "SuperLink  (flower-superlink)",
        ["routes every message between the ServerApp and the SuperNodes; holds the run: its FAB and run config"],
    )
    # Two ways to run the ClientApps.
    s.arrow(240, 390, 240, 424)
    s.arrow(720, 390, 720, 424)
    s.box(20, 428, 440, 150, "engine", "Simulation: pflower-sim, one machine", dashed=True)
    s.text(34, 466, "flower-superlink --simulation; Ray's simulation engine runs", size=12)
    s.text(34, 482, "each ClientApp in a Ray actor (one core each), for a virtual SuperNode", size=12)
    for i, label in enumerate(["ClientApp", "ClientApp", "ClientApp"]):
        s.box(34 + i * 140, 496, 128, 68, "pflower", label, [f"node {i if i < 2 else 'N−1'}", "(actor)"], title_size=13)
    s.box(500, 428, 440, 150, "flower", "Deployment: one SuperNode per machine", dashed=True)
    s.text(514, 466, "flower-supernode processes, TLS and node authentication;", size=12)
    s.text(514, 482, "each message's ClientApp a process (warm: forked)", size=12)
    for i in range(2):
        x = 514 + i * 212
        s.box(x, 496, 200, 68, "flower", f"SuperNode {i if i == 0 else 'i'}", [], title_size=13)
        s.box(x + 10, 522, 180, 34, "pflower", "ClientApp", [], title_size=13)
    # Inside every ClientApp.
    s.box(20, 598, 920, 90, "pflower", "Inside every ClientApp  (pflower/client_app/app.py, the same code in both ways)", title_size=13)
    s.text(34, 640, "its client id and data from the node config (partition-id; data-dir with dataset='node'); the method's ClientMethod", size=12)
    s.text(34, 657, "(client_app/<method>.py) trains with the one loop (training.py); the whole personal model stays in context.state", size=12)
    s.text(34, 674, "(and state-dir on a SuperNode); only the method's upload keys go back, and an evaluation rides on the next message", size=12)
    return s.render()


def deployment() -> str:
    """SuperLink, SuperNodes on their own machines, TLS and node authentication, the processes."""
    s = Svg(960, 640, "pflower deployed: a SuperLink and SuperNodes on separate machines, TLS and SuperNode authentication")
    # Where runs are submitted.
    s.box(20, 16, 300, 150, "machine", "Your machine", dashed=True)
    s.box(
        34,
        52,
        272,
        100,
        "flower",
        "flwr CLI",
        ["flwr run . prod  (the app as a FAB,", 'run config -c "...")', "flwr supernode register node<i>.pub", "$FLWR_HOME/config.toml: ca.crt"],
        title_size=13,
    )
    # The SuperLink machine.
    s.box(360, 16, 580, 300, "machine", "SuperLink machine", dashed=True)
    s.box(
        376,
        52,
        260,
        110,
        "flower",
        "SuperExec → ServerApp",
        ["one process per run:", "flwr-serverapp loads the", "ServerApp from the FAB", "(the method's strategy)"],
        title_size=13,
    )
    s.box(
        652,
        52,
        272,
        110,
        "data",
        "results-dir",
        ["metrics.json, figures,", "a checkpoint every round", "(resume-from);", "no training data needed"],
        title_size=13,
    )
    s.box(
        376,
        176,
        548,
        124,
        "flower",
        "flower-superlink",
        [
            "--ssl-certfile server.pem --ssl-keyfile server.key (TLS, certificate from your CA)",
            "--enable-supernode-auth: only registered node keys are let in",
            "--database state/superlink.db (runs and nodes survive a restart)",
            "Fleet API :9092 for the SuperNodes · :8000 for the flwr CLI",
        ],
        title_size=13,
    )
    s.arrow(306, 110, 372, 220)
    s.text(350, 150, "TLS", size=12, anchor="start")
    # SuperNodes, one machine each, dialling the SuperLink.
    for i, line in enumerate(
        ["SuperNodes dial the SuperLink:", "gRPC with TLS to :9092; each", "signs in with its private key", "(its public key registered)"]
    ):
        s.text(24, 214 + i * LINE, line, size=12, bold=i == 0)
    for i, (x, label) in enumerate([(20, "node 0"), (335, "node 1"), (650, "node i")]):
        s.box(x, 352, 290, 272, "machine", f"Machine of {label}", dashed=True)
        s.box(
            x + 14,
            386,
            262,
            92,
            "flower",
            "flower-supernode",
            [
                "--root-certificates ca.crt",
                f"--auth-supernode-private-key node{i if i < 2 else '<i>'}",
                f"--node-config 'partition-id={i if i < 2 else '<i>'} …'",
            ],
            title_size=13,
        )
        s.box(
            x + 14,
            490,
            262,
            62,
            "pflower",
            "SuperExec → ClientApp",
            ["a process per message (warm: forked", "from a server with torch imported)"],
            title_size=13,
        )
        s.box(x + 14, 564, 125, 48, "data", "data-dir", ["its own data"], title_size=12)
        s.box(x + 151, 564, 125, 48, "data", "state-dir", ["personal state"], title_size=12)
        s.arrow(x + 220, 384, 560 + (i - 1) * 150, 304)
    return s.render()


DIAGRAMS = {"architecture.svg": architecture, "deployment.svg": deployment}


def main() -> int:
    for name, draw in DIAGRAMS.items():
        (FIGURES / name).write_text(draw())
        print(f"wrote docs/figures/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

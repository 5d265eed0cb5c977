"""``pflower-check``: validate a run config against pflower's schema before anything starts.

The app's ``[tool.flwr.app.config]`` defaults with the ``-c`` overrides, parsed as ``flwr run``
parses them, go through :func:`pflower.config.load_settings`: an unknown key is named with the
closest known one, a bad value with its rule, a key of another method with both methods; and
``results-dir`` must be writable here, hold no other run, and the trackers turned on installed
(in simulation, where the ServerApp runs). Then the data is opened as every client will open it
and checked (:func:`pflower.datasets.federated.check_data`; with ``--num-clients``, the
partition too): a run whose data is wrong never starts. ``pflower-sim`` runs it with its
number of clients before it starts a SuperLink. For ``flwr run`` users: ``pflower-check -c "..." && flwr run . ...``.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

from pflower import help_text


def app_run_config(app: Path, overrides: str = "") -> dict:
    """The run config ``flwr run app -c overrides`` would submit (unknown override keys kept)."""
    from flwr.common.config import flatten_dict, parse_config_args

    project = tomllib.loads((app / "pyproject.toml").read_text())
    defaults = flatten_dict(project.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))
    return {**defaults, **parse_config_args([overrides] if overrides else None)}


#: A ``key=value`` pair as Flower's ``-c`` parser reads one (``flwr.common.config.parse_config_args``).
PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")


def unread(overrides: str) -> str | None:
    """The text of ``overrides`` that Flower's parser would drop without a word (``lr = 0.2``:
    spaces around ``=``; a word without one), or None if it reads every part."""
    left = PAIR.sub(" ", overrides).split()
    return " ".join(left) if left and not overrides.strip().endswith(".toml") else None


def unparsable(overrides: str) -> str | None:
    """Which ``key=value`` pair of ``overrides`` Flower's parser cannot read (its TOML: a bare
    word, ``.5``, a quote left open) or which key it is given twice, or None."""
    import tomli  # Flower's own parser (TOML 1.1; the standard library's reads 1.0)

    seen: set[str] = set()
    for key, value in PAIR.findall(overrides):
        try:
            tomli.loads(f"{key} = {value}")
        except tomli.TOMLDecodeError:
            return f"{key}={value} is no TOML value (a string needs quotes: key='text'; a number digits both sides of '.': 0.5)"
        if key in seen:
            return f"{key} is given twice"
        seen.add(key)
    return None


def at_least_one(what: str) -> Callable[[str], int]:
    """An argparse type: a whole number of at least 1, else ArgumentTypeError naming ``what``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}: a whole number of at least 1")
        return n

    return parse


#: A ``--num-clients`` value.
client_count = at_least_one("a number of clients")


def add_app_argument(p: argparse.ArgumentParser) -> None:
    """The Flower app directory: positional, as ``flwr run .`` takes it, or ``--app``."""
    p.add_argument("app_dir", nargs="?", type=Path, default=None, metavar="APP", help="the Flower app directory (default: .), as for flwr run")
    p.add_argument("--app", type=Path, default=None, help="the same, named")


def chosen_app(p: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    """The app directory the arguments name (``.`` if none); an error if they name two."""
    if args.app_dir is not None and args.app is not None and args.app_dir.resolve() != args.app.resolve():
        p.error(f"two app directories: {args.app_dir} and --app {args.app}")
    return args.app_dir or args.app or Path(".")


def is_pflower_app(app: Path) -> bool:
    project = tomllib.loads((app / "pyproject.toml").read_text())
    return project.get("tool", {}).get("flwr", {}).get("app", {}).get("components", {}).get("serverapp") == "pflower.server_app:app"


def check(app: Path, overrides: str = "", num_clients: int | None = None) -> str | None:
    """Why the run config of ``app`` with ``overrides`` would be refused, or None: its keys, the
    results-dir, then its data opened as every client will (:func:`pflower.build.check_data`; with
    ``num_clients``, their partition too)."""
    from pflower.build import check_data, check_model
    from pflower.config import ConfigError, check_server, load_settings

    if (dropped := unread(overrides)) is not None:
        return f"run config {overrides!r}: {dropped!r} is not a key=value pair (no spaces around '='; quote a value with spaces), and flwr run would drop it"
    if (bad := unparsable(overrides)) is not None and not overrides.strip().endswith(".toml"):
        return f"run config {overrides!r}: {bad}, and flwr run would refuse it"
    try:
        run_config = app_run_config(app, overrides)
    except Exception as err:  # noqa: BLE001 - an unparsable -c string: Flower's own message
        return f"run config {overrides!r} cannot be parsed: {err}"
    try:
        settings = load_settings(run_config)
        check_server(settings)
        if settings.resume_from:  # a checkpoint that cannot be resumed is named before anything starts
            from pflower.checkpoint import load_checkpoint

            load_checkpoint(settings)
        check_data(settings, num_clients)
        check_model(settings)
    except ConfigError as err:
        return str(err)
    return None


def main(argv: list[str] | None = None) -> int:
    p = help_text.parser("pflower-check", __doc__)
    p.add_argument("-c", "--run-config", default="", help="run-config overrides, as for flwr run")
    add_app_argument(p)
    p.add_argument("--num-clients", type=client_count, default=None, help="the federation's size: its partition is checked too")
    args = p.parse_args(argv)
    args.app = chosen_app(p, args)
    if (why := check(args.app, args.run_config, args.num_clients)) is not None:
        print(f"pflower-check: {why}", file=sys.stderr)
        return 2
    print("pflower-check: the run config is valid")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Run a pflower simulation end to end with real Flower: ``pflower-sim -c "key=value ..."``.

It starts a private ``flower-superlink --simulation`` on free loopback ports, with a Ray head
of its own started at the same time (:mod:`pflower.ray_head`), submits the app with ``flwr run
--stream`` (so progress shows while it runs), reads the run's final status from the SuperLink,
stops every process it started, and exits non-zero when the run failed.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

from pflower import help_text
from pflower.check import add_app_argument, at_least_one, chosen_app, client_count
from pflower.processes import console_script, free_port, start_watched, stop, wait_for_port

#: Set for every Flower process. Ray's RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO stays unset: Ray then
#: gives an actor that asked for no GPU CUDA_VISIBLE_DEVICES='' (as under plain ``flwr run``).
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
CONNECTION = "pflower-sim"


class Quiet:
    """What pflower-sim prints of a run's log: Flower's and Ray's notes that do not apply to a
    pflower run (Flower's default federation size and the command to change it, where pflower-sim
    sets it with ``--num-clients``; Ray's FutureWarning about a setting pflower leaves as Flower
    does; Ray's "Found multiple active Ray instances ... Connecting to latest cluster", where the
    cluster is pflower-sim's own head, named by its private RAY_TMPDIR; Flower's "Manually
    terminating ClientAppActor" as the run ends) give way to one accurate line or none; every
    other line as it comes. The log itself keeps them."""

    FLOWER = (
        "Since flwr 1.32, default simulated SuperNodes changed",
        "To change federation size, use the following command",
        "flwr federation simulation-config",
    )
    RAY = "FutureWarning: Tip: In future versions of Ray, Ray will no longer override accelerator"
    RAYS = "Found multiple active Ray instances"
    ACTORS = "Manually terminating ClientAppActor"

    def __init__(self, num_clients: int | None, nodes: int | None = None):
        self.num_clients = num_clients
        self.nodes = nodes or num_clients
        self.after_warning = False

    def __call__(self, line: str) -> str | None:
        if self.after_warning and line.strip() == "warnings.warn(":
            self.after_warning = False
            return None
        self.after_warning = self.RAY in line
        if self.after_warning or any(note in line for note in self.FLOWER):
            return None
        if self.num_clients is not None and "simulated SuperNodes)" in line and "Federation `" in line:
            if self.nodes != self.num_clients:
                return f"pflower-sim: {self.num_clients} simulated clients (--num-clients) on {self.nodes} simulated nodes (--clients-per-node)\n"
            return f"pflower-sim: {self.num_clients} simulated clients (--num-clients)\n"
        if self.ACTORS in line:
            return None
        if self.RAYS in line and (head := re.search(r"Connecting to latest cluster at (\S+?)\.? ", line)):
            return f"pflower-sim: other Ray instances run on this machine; this run uses its own Ray head at {head[1]}\n"
        return line


def flower_env(flwr_home: Path) -> dict[str, str]:
    env = {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(flwr_home)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def write_connection(path: Path, body: str) -> None:
    """Set pflower-sim's connection (``[superlink.pflower-sim]``, ``body`` its keys) in a Flower
    config.toml, keeping every other table and key of it (an exported FLWR_HOME holds the user's
    own connections); SystemExit naming the file if it is not TOML."""
    text = path.read_text() if path.is_file() else ""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SystemExit(f"pflower-sim: {path} is not TOML ({err}); fix it or set --flwr-home") from None
    kept = re.sub(rf"(?ms)^\[superlink\.{re.escape(CONNECTION)}\][^\n]*\n.*?(?=^\[|\Z)", "", text).rstrip()
    if "superlink" not in tomllib.loads(kept):
        kept = f'[superlink]\ndefault = "{CONNECTION}"' + (f"\n\n{kept}" if kept else "")
    path.write_text(f"{kept}\n\n[superlink.{CONNECTION}]\n{body}")
    tomllib.loads(path.read_text())


@contextmanager
def simulation_superlink(flwr_home: Path) -> Iterator[int]:
    """A private SuperLink in simulation mode and its Ray head; yields its Control API port.

    The Ray head starts next to the SuperLink, so Ray's start overlaps the SuperLink's, the
    submission and the ServerApp's, and every simulation of this SuperLink reuses it.
    """
    from pflower.ray_head import ray_head

    flwr_home.mkdir(parents=True, exist_ok=True)
    with ray_head(flower_env(flwr_home), flwr_home / "ray-head.log") as ray_env, _superlink(flwr_home, ray_env) as port:
        yield port


@contextmanager
def _superlink(flwr_home: Path, extra_env: dict[str, str]) -> Iterator[int]:
    port = free_port()
    write_connection(flwr_home / "config.toml", f'address = "127.0.0.1:{port}"\ninsecure = true\n')
    log = open(flwr_home / "superlink.log", "ab")
    cmd = [
        console_script("flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
        "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(port),
        "--fleet-api-address", f"127.0.0.1:{free_port()}", "--control-api-address", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    env = {**flower_env(flwr_home), **extra_env}
    proc = start_watched(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)  # it ends with this process, however this ends
    try:
        wait_for_port(proc, "flower-superlink", "127.0.0.1", port, lambda: f"; see {flwr_home / 'superlink.log'}")
        yield port
    finally:
        stop(proc)
        proc.stdin.close()
        log.close()


def gpu_share(text: str) -> float:
    """A ``--gpus-per-client`` value Flower and Ray both count exactly, else ArgumentTypeError.

    Flower sends the share as a 32-bit float and sizes its actor pool with int(GPUs / share);
    Ray counts resources in steps of 0.0001 and takes whole numbers above 1. So 0.1 would give 9
    actors per GPU where Ray fits 10: only 0, whole numbers and fractions exact in both pass.
    """
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    exact = share >= 0 and struct.unpack("f", struct.pack("f", share))[0] == share and (share * 10_000).is_integer()
    if not exact or (share > 1 and not share.is_integer()):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a GPU share Flower and Ray count exactly: use 0 (CPU only), a whole "
            "number, or a fraction such as 0.5, 0.25, 0.125, 0.0625 or 0.75"
        )
    return share


#: A ``--cpus-per-client`` value.
core_count = at_least_one("a number of CPU cores")


def clients_per_node(text: str) -> int | str:
    """A ``--clients-per-node`` value: 'auto' or a whole number of at least 1."""
    return "auto" if text == "auto" else at_least_one("a number of clients per node, or 'auto'")(text)


def resources_problem(cpus: int, gpus: float) -> str | None:
    """Why no ClientApp could start here with ``cpus`` cores and a ``gpus`` share of a GPU, else
    None. Flower would find out only after the run started ("ActorPool is empty", about a minute
    in). A Ray cluster (``RAY_ADDRESS``) is not checked: its other nodes may have what this one
    lacks."""
    if os.environ.get("RAY_ADDRESS"):
        return None
    cores = os.cpu_count() or 1
    if cpus > cores:
        return f"--cpus-per-client {cpus}: this machine has {cores} cores, so no ClientApp could start"
    if gpus:
        import torch

        visible = torch.cuda.device_count()
        if visible < max(1.0, gpus):
            return (
                f"--gpus-per-client {gpus:g}: this machine has {visible} GPU(s) that torch sees, so no ClientApp could start "
                "(0 trains on the CPU; on a Ray cluster set RAY_ADDRESS)"
            )
    return None


def federation_config(num_nodes: int, cpus: int, gpus: float) -> str:
    """Flower's simulation settings: virtual SuperNodes and resources per ClientApp."""
    return f"num-supernodes={num_nodes} client-resources-num-cpus={cpus} client-resources-num-gpus={gpus}"


#: ``--clients-per-node auto``: this many simulated nodes per ClientApp actor. Two let an actor
#: start a node's message while its other one's reply is handed back; more cost messages: at 100
#: cheap clients on 2 cores (bench/cheap_clients.py), beside the plain loop in the same
#: invocations, 4 nodes gave rounds 1.24 x its round, 8 nodes 1.33-1.39 x, 25 nodes 1.45 x (the
#: ratios move between invocations too: 4 nodes 1.46 x on a slower evening; docs/measurements.md).
NODES_PER_ACTOR = 2
#: ``--clients-per-node auto``: one client a node below this many clients per actor, where a
#: node's share of an actor's work is too coarse to even out (10 clients on 2 cores: 5 nodes of 2
#: took 1.02 s a round, 10 nodes of 1 0.90 s).
MIN_CLIENTS_PER_ACTOR = 8


def actors(cpus: int, gpus: float) -> int:
    """How many ClientApp actors Ray starts on this machine for ``cpus`` cores and a ``gpus`` share each."""
    count = max(1, (os.cpu_count() or 1) // cpus)
    if gpus:
        import torch

        count = min(count, max(1, int(torch.cuda.device_count() / gpus)))
    return count


def auto_clients_per_node(num_clients: int, cpus: int, gpus: float) -> int:
    """``--clients-per-node auto``: :data:`NODES_PER_ACTOR` nodes for each of the machine's actors;
    one client a node below :data:`MIN_CLIENTS_PER_ACTOR` clients an actor, and on a Ray cluster
    (``RAY_ADDRESS``), whose actors this machine cannot count."""
    count = actors(cpus, gpus)
    if os.environ.get("RAY_ADDRESS") or num_clients < MIN_CLIENTS_PER_ACTOR * count:
        return 1
    return -(-num_clients // (NODES_PER_ACTOR * count))


def nodes_for(num_clients: int, clients_per_node: int) -> int:
    """The simulated SuperNodes that serve ``num_clients`` at most ``clients_per_node`` each."""
    return -(-num_clients // clients_per_node)


def run_status(flwr_home: Path, run_id: int, connection: str = CONNECTION, attempts: int = 3) -> str:
    """Final status of a run, as the SuperLink reports it (e.g. ``finished:completed``).

    Asked through the SuperLink's Control API from this process, as ``flwr list`` asks it (a
    ``flwr list`` process costs about 2 s a run, most of it importing the CLI), with the
    connection ``connection`` of ``flwr_home``'s config.toml. Asked up to ``attempts`` times,
    2 s apart: on a loaded machine the SuperLink has once answered "Run ID not found" for a run
    that had just finished.
    """
    problem = ""
    for attempt in range(attempts):
        if attempt:
            time.sleep(2)
        try:
            return _ask_status(flwr_home, run_id, connection)
        except Exception as err:  # noqa: BLE001 - any failure to read it is said, after the last attempt
            problem = f"could not read the status of run {run_id} from the SuperLink ({type(err).__name__}: {err})"
    raise SystemExit(problem)


def _ask_status(flwr_home: Path, run_id: int, connection: str) -> str:
    """One ListRuns request for ``run_id`` (``flwr list``'s client, interceptors and status text)."""
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.common.serde import run_from_proto
    from flwr.proto.control_pb2 import ListRunsRequest

    # Flower reads its config.toml from FLWR_HOME; the CLI's "Using SuperLink: ..." line is not this program's
    with _environment(flower_env(flwr_home)), redirect_stdout(io.StringIO()):
        client = init_http_client_from_connection(read_superlink_connection(connection))
    try:
        runs = [run_from_proto(proto) for proto in client.ListRuns(ListRunsRequest(run_id=run_id)).run_dict.values()]
    finally:
        client.close()
    if not runs:
        raise LookupError(f"run {run_id} not found")
    status = runs[0].status
    return f"{status.status}:{status.sub_status}" if status.sub_status else status.status


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``env`` set, restored after."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _as_glob(pattern: str) -> str:
    """A ``fab-include`` (gitignore-style) pattern as a ``Path.glob`` pattern: one without an
    inner slash matches at any depth, a leading slash anchors it at the app's root."""
    if pattern.startswith("/"):
        return pattern[1:]
    return pattern if "/" in pattern.rstrip("/") else f"**/{pattern}"


def stage_app(app: Path, dest: Path) -> Path:
    """Copy what the app's FAB holds (pyproject.toml and its ``fab-include`` files) to ``dest``.

    ``flwr run DIR`` lists and resolves every file under DIR, a virtual environment inside it
    included, before it applies ``fab-include``: 7 s for the 50,000 files of a checkout with its
    ``.venv``, against milliseconds for this copy. Returns ``app`` itself when it has no
    ``fab-include`` (then Flower's own rules decide what it bundles).
    """
    project = tomllib.loads((app / "pyproject.toml").read_text())
    patterns = project.get("tool", {}).get("flwr", {}).get("app", {}).get("fab-include")
    if not patterns:
        return app
    files = {path for pattern in patterns for path in app.glob(_as_glob(pattern)) if path.is_file()}
    for path in sorted(files | {app / "pyproject.toml"}):
        target = dest / path.relative_to(app)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return dest


def submit(
    app: Path,
    flwr_home: Path,
    run_config: str = "",
    num_clients: int | None = 10,
    cpus: int = 1,
    gpus: float = 0.0,
    echo: bool = True,
    connection: str = CONNECTION,
    on_line: Callable[[str], None] | None = None,
    clients_per_node: int = 1,
) -> tuple[int, str, str]:
    """Submit one run to the running SuperLink and stream it to the end: (run id, status, log).

    ``num_clients`` sets the simulated federation, on :func:`nodes_for` nodes serving at most
    ``clients_per_node`` clients each (the run config's ``simulated-clients``); None for a
    deployment (real SuperNodes). ``on_line`` sees each line of the run's log as it arrives (the
    bench's progress).
    """
    with tempfile.TemporaryDirectory(prefix="pflower-app-") as staged:
        cmd = [console_script("flwr"), "run", str(stage_app(app, Path(staged) / "app")), connection, "--stream"]
        nodes = None
        if num_clients is not None:
            nodes = nodes_for(num_clients, clients_per_node)
            cmd += ["--federation-config", federation_config(nodes, cpus, gpus)]
            if nodes < num_clients:
                run_config = with_simulated_clients(run_config, num_clients, app, Path(staged) / "run-config.toml")
        if run_config:
            cmd += ["--run-config", run_config]
        proc = subprocess.Popen(cmd, env=flower_env(flwr_home), cwd=app, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines, quiet = [], Quiet(num_clients, nodes)
        try:
            for line in proc.stdout:
                lines.append(line)
                if echo and (shown := quiet(line)) is not None:
                    print(shown, end="", flush=True)
                if on_line is not None:
                    on_line(line)
            proc.wait()
        finally:  # interrupted (Ctrl-C, SIGTERM): `flwr run` does not outlive this process
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    text = "".join(lines)
    found = re.search(r"Successfully started run (\d+)", text)
    if not found:
        raise SystemExit(f"flwr run did not start a run:\n{text}")
    run_id = int(found.group(1))
    return run_id, run_status(flwr_home, run_id, connection), text


def with_simulated_clients(run_config: str, num_clients: int, app: Path, copy: Path) -> str:
    """``run_config`` (``-c``: key=value pairs, or a TOML file, which Flower reads only alone and
    relative to the app) with ``simulated-clients`` set: for a file, a copy written to ``copy``."""
    if not run_config.strip().endswith(".toml"):
        return f"{run_config} simulated-clients={num_clients}".strip()
    source = Path(run_config.strip()).expanduser()
    source = source if source.is_absolute() else app / source
    copy.write_text(f"simulated-clients = {num_clients}\n{source.read_text()}")
    return str(copy)


def simulate(app: Path, run_config: str = "", num_clients: int = 10, cpus: int = 1, gpus: float = 0.0, flwr_home: Path | None = None,
             clients_per_node: int = 1) -> tuple[int, str]:  # fmt: skip
    """Run one simulation on a private SuperLink; returns (run id, final status)."""
    app = app.resolve()
    flwr_home = (flwr_home or (Path(os.environ["FLWR_HOME"]) if os.environ.get("FLWR_HOME") else app / ".flwr")).expanduser().resolve()
    with simulation_superlink(flwr_home):
        run_id, status, _ = submit(app, flwr_home, run_config, num_clients, cpus, gpus, clients_per_node=clients_per_node)
        return run_id, status


def _check_apart(app: Path, run_config: str, num_clients: int) -> str | None:
    """:func:`pflower.check.check` in a child process: the check imports torch and opens the data,
    about 350 MiB that this process would otherwise hold for the whole run. In a process that
    has imported torch already (a test calling :func:`main`) it runs here."""
    from pflower.check import check

    if "torch" in sys.modules:
        return check(app, run_config, num_clients)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        return pool.submit(check, app, run_config, num_clients).result()


def _overrides(run_config: str, app: Path) -> dict:
    """The keys ``-c`` sets, as Flower reads them (a TOML file relative to the app); {} where it
    cannot be read (the run-config check says why)."""
    text = run_config.strip()
    if not text.endswith(".toml") and "simulated-clients" not in text:
        return {}  # nothing to look for: Flower's parser (and the 40 MiB of flwr it imports) stays out of this process
    from flwr.common.config import parse_config_args

    if text.endswith(".toml") and not Path(text).expanduser().is_absolute():
        text = str(app / text)
    try:
        return parse_config_args([text]) if text else {}
    except Exception:  # noqa: BLE001 - reported by the check with Flower's own message
        return {}


def _exit_on_sigterm(signum: int, frame) -> None:
    """SIGTERM ends pflower-sim like Ctrl-C: through its clean-up, which stops the SuperLink and Ray."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = help_text.parser("pflower-sim", __doc__)
    p.add_argument("-c", "--run-config", default="", help="run-config overrides, e.g. \"method='fedprox' lr=0.01\"")
    p.add_argument("--num-clients", type=client_count, default=10, help="virtual SuperNodes (clients)")
    p.add_argument("--cpus-per-client", type=core_count, default=1, help="CPU cores reserved per ClientApp")
    p.add_argument("--gpus-per-client", type=gpu_share, default=0.0,
                   help="GPU share per ClientApp: 0 (CPU only; the ClientApps see no GPU), a whole number, or 0.5, 0.25, 0.125, ...")  # fmt: skip
    p.add_argument("--clients-per-node", type=clients_per_node, default="auto",
                   help=f"clients each simulated SuperNode serves (one message carries a phase's work for all of them; the same numbers): "
                        f"a whole number, or 'auto' (default: {NODES_PER_ACTOR} nodes per ClientApp actor; pflower's ClientApp only)")  # fmt: skip
    add_app_argument(p)
    p.add_argument(
        "--flwr-home",
        type=Path,
        default=None,
        help="FLWR_HOME (default: $FLWR_HOME if set, else <app>/.flwr); pflower-sim adds its connection to its config.toml, keeping the others",
    )
    args = p.parse_args(argv)
    args.app = chosen_app(p, args)
    from pflower.check import is_pflower_app

    if "simulated-clients" in _overrides(args.run_config, args.app):
        print("pflower-sim: simulated-clients is set by --clients-per-node (pflower-sim computes it), not in -c", file=sys.stderr)
        return 2

    started = time.monotonic()
    if is_pflower_app(args.app):
        print("pflower-sim: checking the run config and the data every client will open ...", flush=True)
        if (why := _check_apart(args.app, args.run_config, args.num_clients)) is not None:
            print(f"pflower-sim: {why}", file=sys.stderr)  # before any SuperLink, Ray or ServerApp starts
            return 2
    if why := resources_problem(args.cpus_per_client, args.gpus_per_client):
        print(f"pflower-sim: {why}", file=sys.stderr)
        return 2
    print(f"pflower-sim: {'checked in %.0f s; ' % (time.monotonic() - started) if is_pflower_app(args.app) else ''}"
          "starting a SuperLink and a Ray head, then the run (its log follows) ...", flush=True)  # fmt: skip
    per_node = 1
    if is_pflower_app(args.app):
        per_node = (
            auto_clients_per_node(args.num_clients, args.cpus_per_client, args.gpus_per_client) if args.clients_per_node == "auto" else args.clients_per_node
        )
    elif args.clients_per_node not in ("auto", 1):
        print(f"pflower-sim: --clients-per-node {args.clients_per_node}: only pflower's ClientApp serves several clients on a node", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    run_id, status = simulate(args.app, args.run_config, args.num_clients, args.cpus_per_client, args.gpus_per_client, args.flwr_home, per_node)
    print(f"run {run_id}: {status}", flush=True)
    return 0 if status.endswith("completed") else 1


if __name__ == "__main__":
    raise SystemExit(main())

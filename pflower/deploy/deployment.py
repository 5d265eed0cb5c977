"""A deployment's processes: a SuperLink and SuperNodes started, registered, watched, restarted
and stopped, on loopback or in network namespaces (:mod:`pflower.deploy.netns`)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from pflower.deploy import warm
from pflower.deploy.certificates import make_pki, node_key
from pflower.deploy.netns import Network, remove_network
from pflower.launcher import flower_env, submit
from pflower.processes import console_script, free_port, stop, wait_for_port

CONNECTION = "pflower-deploy"
#: The SuperLink's ports in a namespace of its own (Flower's defaults): SuperNodes dial the Fleet
#: API, the ``flwr`` CLI and the executors the HTTP API; the gRPC Control API is bound too.
NETNS_PORTS = {"fleet": 9092, "api": 8000, "control": 9093}
STATE_FILE = "deployment.json"
#: How often a SuperNode's SuperExec asks it for a message to run: every message waits for the
#: next ask. 0.2 s instead of Flower's 1 s takes 0.42 s off a message's launch (median, 0.48 ->
#: 0.06 s) for 0.014 more cores per idle SuperNode; 0.1 s saves 0.02 s more for twice that idle
#: cost (bench/poll_interval.py, docs/deployment.md). The SuperLink's SuperExec keeps Flower's 1 s:
#: it waits once per run, not per message.
POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
NODE_POLL_INTERVAL: float | None = 0.2
#: What a warm node's fork server imports: Flower's defaults (numpy, torch, Flower) and pydantic,
#: which pflower's ClientApp imports next (third-party; pflower itself loads from the FAB).
WARM_PRELOAD = (*warm.PRELOAD, "pydantic")


def visible_gpus(env: dict[str, str]) -> list[str]:
    """The GPUs a process started with ``env`` may use: ``CUDA_VISIBLE_DEVICES``'s entries if set
    (ids or UUIDs; empty: none), else every GPU CUDA counts."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return [g.strip() for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


class Deployment:
    """A SuperLink and ``nodes`` SuperNodes; use as a context manager or call start()/stop()."""

    def __init__(self, workdir: Path, nodes: int = 3, tls: bool = True, auth: bool = True, netns: bool = False,
                 node_config: dict[int, str] | None = None, node_data: Sequence[Path] = (), hide: Sequence[Path] = (),
                 warm: bool | Collection[int] = False, poll_interval: float | None = NODE_POLL_INTERVAL):  # fmt: skip
        """``node_data``: SuperNode i's own data folder (``data-dir`` in its node config, for
        ``dataset='node'``); ``hide``: folders the SuperLink, and the ServerApp it starts, must not
        see (an empty tmpfs over each in a mount namespace of their own; root only); ``warm``:
        every SuperNode (True; those added later too) or those whose index is listed runs its ClientApps from a fork
        server (:mod:`pflower.deploy.warm`), the others start a fresh process per message;
        ``poll_interval``: seconds between a SuperNode's SuperExec's looks for a new message
        (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``; default :data:`NODE_POLL_INTERVAL`; None: Flower's 1 s)."""
        if auth and not tls:
            raise ValueError("SuperNode authentication needs TLS")
        if hide and os.geteuid() != 0:
            raise ValueError("hiding folders from the SuperLink needs root (a mount namespace)")
        self.dir = workdir.resolve()
        self.nodes, self.tls, self.auth = nodes, tls, auth
        self.extra_config = dict(node_config or {})
        for i, folder in enumerate(node_data):
            self.extra_config[i] = f'{self.extra_config.get(i, "")} data-dir="{Path(folder).resolve()}"'.strip()
        self.hide = [Path(p).resolve() for p in hide]
        self.net = Network(f"pf{secrets.token_hex(2)}", ["link", *(f"node{i}" for i in range(nodes))]) if netns else None
        self.flwr_home = self.dir / "flwr-home"
        self.procs: dict[str, subprocess.Popen] = {}
        self.node_ids: dict[int, str] = {}  # SuperNode i -> its registered node id (with authentication)
        self.ports = dict(NETNS_PORTS) if netns else {k: free_port() for k in NETNS_PORTS}
        self._short_warm: Path | None = None
        if poll_interval is not None and not 0.01 <= poll_interval <= 60:
            raise ValueError(f"poll_interval is {poll_interval}; Flower allows 0.01 to 60 seconds")
        self.poll_interval = poll_interval
        self.warm_all = warm is True  # every SuperNode, those added later too
        self.warm_names: set[str] = set()  # the warm SuperNode processes' names (their fork servers' folders)
        self.warm = set(range(nodes)) if warm is True else set(warm or ())
        if bad := sorted(i for i in self.warm if not isinstance(i, int) or i < 0):
            raise ValueError(f"warm lists {bad}: give True, False or SuperNode indices (0, 1, ...)")

    # where things are
    @property
    def link_address(self) -> str:
        return self.net.address("link") if self.net else "127.0.0.1"

    def _env(self) -> dict[str, str]:
        return flower_env(self.flwr_home)

    def _prefix(self, name: str) -> list[str]:
        return self.net.prefix(name) if self.net else []

    def node_env(self, i: int) -> dict[str, str]:
        """SuperNode ``i``'s environment: it sees one GPU, the i-th round robin (none without GPUs)."""
        env = self._env()
        if self.poll_interval is not None:
            env[POLL_ENV] = str(self.poll_interval)
        gpus = visible_gpus(env)
        return {**env, "CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else env

    def switch_warm(self, on: bool) -> None:
        """Switch every warm SuperNode cold (``on=False``: each message a fresh ``flwr-clientapp``
        again, through the shim) or back warm, without restarting it (:func:`warm.switch`)."""
        for name in sorted(self.warm_names):
            warm.switch(self.warm_dir(name), on)

    def warm_dir(self, name: str) -> Path:
        """The private folder (mode 0700) of SuperNode process ``name``'s fork server: its shim and socket."""
        base = self.dir / "warm"
        if len(os.fsencode(base / name / "server.sock")) > warm.MAX_SOCKET_PATH:  # a Unix socket's path is short
            if self._short_warm is None:
                self._short_warm = Path(tempfile.mkdtemp(prefix="pflower-warm-"))
            base = self._short_warm
        return base / name

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``cmd`` as process ``name``; ``<host>-<suffix>`` runs in host's namespace."""
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([*self._prefix(name.split("-")[0]), *cmd], env=env or self._env(), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, cwd=self.dir)  # fmt: skip
        self.procs[name] = proc
        self._save()
        return proc

    def log(self, name: str) -> str:
        path = self.dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _save(self) -> None:
        state = {"pids": {n: p.pid for n, p in self.procs.items()}, "netns": self.net.created if self.net else [],
                 "bridge": self.net.bridge if self.net else None}  # fmt: skip
        (self.dir / STATE_FILE).write_text(json.dumps(state, indent=1))

    # start and stop
    def start(self) -> Deployment:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.tls:
            print("WARNING: insecure deployment: no TLS, no SuperNode authentication. Use only on a trusted network.", file=sys.stderr)
        if self.net:
            self.net.up()
        try:
            if self.tls:
                make_pki(self.dir / "pki", [self.link_address, "127.0.0.1", "localhost"], self.nodes)
            self._write_connection()
            self._start_superlink()
            for i in range(self.nodes):
                if self.auth:
                    self.node_ids[i] = self.register(self.dir / "pki" / "keys" / f"node{i}.pub")
                self.start_node(i)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> Deployment:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for proc in self.procs.values():
            stop(proc)
        self.procs.clear()
        if self.net:
            self.net.down()
        if self._short_warm is not None:
            shutil.rmtree(self._short_warm, ignore_errors=True)
        if (self.dir / STATE_FILE).exists():
            (self.dir / STATE_FILE).unlink()

    def _write_connection(self) -> None:
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        security = f'root-certificates = "{self.dir / "pki" / "ca.crt"}"' if self.tls else "insecure = true"
        (self.flwr_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{self.link_address}:{self.ports["api"]}"\n{security}\n'
        )

    def _start_superlink(self) -> None:
        pki = self.dir / "pki"
        host = "0.0.0.0" if self.net else "127.0.0.1"
        cmd = [console_script("flower-superlink"), "--disable-runtime-dependency-installation", "--database", str(self.dir / "superlink.db"),
               "--fleet-api-address", f"{host}:{self.ports['fleet']}", "--host", host, "--port", str(self.ports["api"]),
               "--control-api-address", f"{host}:{self.ports['control']}"]  # fmt: skip
        if self.tls:
            cmd += ["--ssl-ca-certfile", str(pki / "ca.crt"), "--ssl-certfile", str(pki / "server.pem"), "--ssl-keyfile", str(pki / "server.key")]
        else:
            cmd += ["--insecure"]
        if self.auth:
            cmd += ["--enable-supernode-auth"]
        if self.hide:  # its own mount namespace, an empty tmpfs over every hidden folder, then the SuperLink
            mount = 'n=$1; shift; while [ "$n" -gt 0 ]; do mount -t tmpfs tmpfs "$1" || exit 1; shift; n=$((n-1)); done; exec "$@"'
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", str(len(self.hide)), *map(str, self.hide), *cmd]
        proc = self._spawn("link", cmd)
        wait_for_port(proc, "flower-superlink", self.link_address, self.ports["api"], lambda: f":\n{self.log('link')[-2000:]}")

    def _flwr_json(self, *args: str) -> tuple[dict | None, str]:
        """``flwr <args> <connection> --format json``: (its JSON reply or None, its whole output)."""
        out = subprocess.run([console_script("flwr"), *args, CONNECTION, "--format", "json"],
                             env=self._env(), cwd=self.dir, capture_output=True, text=True, check=False)  # fmt: skip
        text = out.stdout + out.stderr
        if out.returncode != 0 or "{" not in out.stdout:
            return None, text
        try:
            return json.loads(out.stdout[out.stdout.index("{") :]), text
        except json.JSONDecodeError:
            return None, text

    def register(self, public_key: Path) -> str:
        """Register a SuperNode's public key with the SuperLink (``flwr supernode register``); its node id.

        Retried for up to a minute while the SuperLink's API is still starting up.
        """
        deadline = time.monotonic() + 60
        while True:
            reply, out = self._flwr_json("supernode", "register", str(public_key))
            if reply is not None and reply.get("success"):
                return str(reply["node-id"])
            if "unavailable" not in out.lower() or time.monotonic() > deadline:
                raise SystemExit(f"could not register {public_key}: {out}")
            time.sleep(1)

    def node_statuses(self) -> dict[int, str]:
        """What the SuperLink says of every authenticated SuperNode, from one ``flwr supernode ls``
        (one CLI start, seconds on a busy machine): index -> 'online', 'offline', 'registered', ..."""
        reply, out = self._flwr_json("supernode", "ls")
        if reply is None:
            raise RuntimeError(f"flwr supernode ls failed: {out[-500:]}")
        by_id = {n["node-id"]: n["status"] for n in reply["nodes"]}
        return {i: by_id.get(node_id, "unknown") for i, node_id in self.node_ids.items()}

    def node_status(self, i: int) -> str:
        """What the SuperLink says of authenticated SuperNode ``i``: 'online', 'offline', 'registered', ..."""
        return self.node_statuses()[i]

    def wait_statuses(self, nodes: Collection[int], wanted: set[str], timeout: float) -> dict[int, str]:
        """Poll :meth:`node_statuses` until each SuperNode in ``nodes`` is one of ``wanted``; their
        statuses, or TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            statuses = {i: status for i, status in self.node_statuses().items() if i in nodes}
            if all(statuses.get(i) in wanted for i in nodes):
                return statuses
            if time.monotonic() > deadline:
                late = {i: statuses.get(i, "unknown") for i in nodes if statuses.get(i) not in wanted}
                raise TimeoutError(f"SuperNodes {late} after {timeout:.0f} s, not {sorted(wanted)}")
            time.sleep(1)

    def wait_status(self, i: int, wanted: set[str], timeout: float) -> str:
        """Poll until SuperNode ``i`` is one of ``wanted``; the status, or TimeoutError."""
        return self.wait_statuses([i], wanted, timeout)[i]

    def node_config(self, i: int) -> str:
        state = self.dir / "state" / f"node{i}"
        extra = self.extra_config.get(i, "")
        return f'partition-id={i} num-partitions={self.nodes} state-dir="{state}" {extra}'.strip()

    def view_of_link(self, path: Path) -> list[str]:
        """What the SuperLink's process sees in ``path`` (its mount namespace's view)."""
        root = Path(f"/proc/{self.procs['link'].pid}/root")
        target = root / Path(path).resolve().relative_to("/")
        return sorted(p.name for p in target.iterdir()) if target.is_dir() else []

    def add_node(self, i: int, node_config: str) -> subprocess.Popen:
        """Start one more SuperNode, ``i`` (>= ``nodes``), with its own key (registered) and config;
        with network namespaces it runs in the last node's."""
        key = self.dir / "pki" / "keys" / f"node{i}"
        if self.auth and not key.exists():
            node_key(key)
            self.node_ids[i] = self.register(key.with_suffix(".pub"))
        self.extra_config[i] = node_config
        return self.start_node(i, key if self.auth else None, name=f"node{self.nodes - 1}-node{i}" if self.net else None)

    def start_node(self, i: int, key: Path | None = None, name: str | None = None) -> subprocess.Popen:
        """Start SuperNode ``i`` (again); ``key``: another private key (e.g. an unregistered one)."""
        pki = self.dir / "pki"
        config = self.node_config(i) if i < self.nodes else f'state-dir="{self.dir / "state" / f"node{i}"}" {self.extra_config[i]}'
        cmd = [console_script("flower-supernode"), "--superlink", f"{self.link_address}:{self.ports['fleet']}",
               "--node-config", config, "--host", "127.0.0.1", "--port", str(free_port())]  # fmt: skip
        cmd += ["--root-certificates", str(pki / "ca.crt")] if self.tls else ["--insecure"]
        if self.auth:
            cmd += ["--auth-supernode-private-key", str(key or pki / "keys" / f"node{i}")]
        name = name or f"node{i}"
        if self.warm_all:
            self.warm.add(i)
        if i in self.warm:  # the wrapper starts the fork server beside the SuperNode (in its namespace, its process group)
            folder = warm.private_dir(self.warm_dir(name))  # made here too: it exists once start() returns
            self.warm_names.add(name)
            cmd = [sys.executable, warm.__file__, "run", "--dir", str(folder), "--preload", ",".join(WARM_PRELOAD), "--", *cmd]
        return self._spawn(name, cmd, self.node_env(i))

    def restart_node(self, i: int, timeout: float = 240) -> subprocess.Popen:
        """Start crashed SuperNode ``i`` again, as a supervisor would; returns once it is back.

        With authentication the node keeps its node id (its key), and the SuperLink refuses it
        while the crashed process still counts as online (until its heartbeats lapse, about a
        minute): so first wait for the SuperLink to mark it offline, then start it and wait
        until it is online. Without authentication it comes back under a new node id and is
        back when it stays up.
        """
        deadline = time.monotonic() + timeout
        if self.auth:
            self.wait_status(i, {"offline"}, timeout)
        while True:
            proc = self.start_node(i)
            try:
                if self.auth:
                    self.wait_status(i, {"online"}, min(60.0, max(1.0, deadline - time.monotonic())))
                    return proc
                proc.wait(8)
            except (subprocess.TimeoutExpired, TimeoutError):
                if not self.auth:
                    return proc
            if proc.poll() is None:
                stop(proc)
            if time.monotonic() > deadline:
                raise SystemExit(f"SuperNode {i} did not come back within {timeout:.0f} s:\n{self.log(f'node{i}')[-1500:]}")
            time.sleep(5)

    def kill_node(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and its ClientApp processes (a crash, not a shutdown)."""
        proc = self.procs.pop(f"node{i}")
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
        self._save()

    def submit(self, app: Path, run_config: str = "", echo: bool = False) -> tuple[int, str, str]:
        """Run ``app`` on this deployment to the end: (run id, final status, log)."""
        return submit(app, self.flwr_home, run_config, num_clients=None, echo=echo, connection=CONNECTION)


def down(workdir: Path) -> None:
    """Stop what ``pflower-deploy up`` started in ``workdir`` (by the pids it recorded)."""
    path = workdir / STATE_FILE
    if not path.exists():
        raise SystemExit(f"no running deployment in {workdir} ({STATE_FILE} not found)")
    state = json.loads(path.read_text())
    for pid in state["pids"].values():
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
                time.sleep(1)
            except ProcessLookupError:
                break
    if state.get("bridge"):
        remove_network(state["netns"], state["bridge"])
    path.unlink()

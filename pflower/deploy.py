"""Real Flower deployments without docker: one SuperLink and N SuperNodes as processes.

On loopback, or (``--netns``, as root) every process in its own network namespace, joined by
veth pairs to a bridge: one host per process, as on separate machines. TLS with a generated
CA and SuperNode authentication with one key pair per node are the default; ``--insecure``
must be asked for and prints a warning. Each SuperNode gets its client id and a personal
``state-dir`` through ``--node-config``; the SuperLink keeps its state in a database file. On a
machine with GPUs SuperNode i sees one, the i-th of them round robin (``CUDA_VISIBLE_DEVICES``'s
entries if you set it, else every GPU), so the nodes' ClientApps do not all train on ``cuda:0``.

    pflower-deploy up --nodes 3 --dir deploy            # TLS + authentication, loopback
    pflower-deploy up --nodes 3 --dir deploy --netns    # each process in its own namespace
    FLWR_HOME=deploy/flwr-home flwr run . pflower-deploy --stream -c "num-server-rounds=5"
    pflower-deploy down --dir deploy
"""

from __future__ import annotations

from collections.abc import Sequence

import argparse
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from pflower.launcher import _bin, flower_env, stop, submit

CONNECTION = "pflower-deploy"
#: The SuperLink's ports in a namespace of its own (Flower's defaults): SuperNodes dial the Fleet
#: API, the ``flwr`` CLI and the executors the HTTP API; the gRPC Control API is bound too.
NETNS_PORTS = {"fleet": 9092, "api": 8000, "control": 9093}
STATE_FILE = "deployment.json"


# ------------------------------------------------------------------ certificates and keys
def make_pki(out: Path, hosts: list[str], nodes: int) -> None:
    """A CA, a SuperLink certificate valid for ``hosts`` (IPs or names), one EC key pair per node.

    Files: ``ca.crt``, ``server.pem``, ``server.key``, ``keys/node<i>`` and ``keys/node<i>.pub``
    (OpenSSH format, what ``flower-supernode`` and ``flwr supernode register`` read).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = datetime.now(timezone.utc)

    def cert(subject: str, key, issuer: str, signer, extensions) -> x509.Certificate:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=365))
        )
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(signer, hashes.SHA256())

    def pem_key(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca = cert("pflower CA", ca_key, "pflower CA", ca_key, [(x509.BasicConstraints(ca=True, path_length=None), True)])
    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    names = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    server = cert(
        hosts[0], server_key, "pflower CA", ca_key,
        [(x509.SubjectAlternativeName(names), False), (x509.BasicConstraints(ca=False, path_length=None), True),
         (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)],
    )  # fmt: skip
    (out / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (out / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (out / "server.key").write_bytes(pem_key(server_key))
    (out / "server.key").chmod(0o600)
    keys = out / "keys"
    keys.mkdir(exist_ok=True)
    for i in range(nodes):
        node_key(keys / f"node{i}")


def node_key(path: Path) -> None:
    """One SuperNode key pair: ``path`` (private) and ``path.pub``, OpenSSH format, P-384."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    path.chmod(0o600)
    path.with_suffix(".pub").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )


# --------------------------------------------------------------------- network namespaces
@dataclass
class Network:
    """Namespaces ``<tag>-<name>`` joined by veth pairs to one bridge in the root namespace."""

    tag: str
    names: list[str]
    subnet: str = "10.77.0"
    created: list[str] = field(default_factory=list)

    def ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def address(self, name: str) -> str:
        return f"{self.subnet}.{self.names.index(name) + 1}"

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def accept_forwarding(self) -> None:
        """Let traffic cross the bridge where the FORWARD chain drops it (dockerd sets its policy to
        DROP): one rule for this bridge only, removed by :meth:`down`. Without iptables, nothing."""
        if shutil.which("iptables") and subprocess.run(forward_rule(self.bridge, "-I"), capture_output=True, check=False).returncode == 0:
            self.created.append("forward")

    def up(self) -> None:
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self.created.append("bridge")
            self._ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            self.accept_forwarding()
            for i, name in enumerate(self.names):
                ns, outer, inner = self.ns(name), f"{self.tag}v{i}", f"{self.tag}p{i}"
                self._ip("netns", "add", ns)
                self.created.append(ns)
                self._ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                self._ip("link", "set", inner, "netns", ns)
                self._ip("link", "set", outer, "master", self.bridge, "up")
                self._ip("-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", inner)
                self._ip("-n", ns, "link", "set", inner, "up")
                self._ip("-n", ns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as err:
            self.down()
            raise SystemExit(f"could not create network namespaces ({' '.join(err.cmd)}): {err.stderr.strip()}") from None

    def down(self) -> None:
        remove_network(self.created, self.bridge)
        self.created.clear()

    def prefix(self, name: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(name)]


def forward_rule(bridge: str, action: str) -> list[str]:
    """The iptables command that inserts (``-I``) or deletes (``-D``) the bridge's FORWARD rule."""
    return ["iptables", action, "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def remove_network(created: Sequence[str], bridge: str) -> None:
    """Undo :meth:`Network.up`'s steps, newest first: namespaces, the FORWARD rule, the bridge."""
    for item in reversed(created):
        if item == "forward":
            cmd = forward_rule(bridge, "-D")
        else:
            cmd = ["ip", "link", "del", bridge] if item == "bridge" else ["ip", "netns", "del", item]
        subprocess.run(cmd, capture_output=True, check=False)


def visible_gpus(env: dict[str, str]) -> list[str]:
    """The GPUs a process started with ``env`` may use: ``CUDA_VISIBLE_DEVICES``'s entries if set
    (ids or UUIDs; empty: none), else every GPU CUDA counts."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return [g.strip() for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------- the deployment
class Deployment:
    """A SuperLink and ``nodes`` SuperNodes; use as a context manager or call start()/stop()."""

    def __init__(self, workdir: Path, nodes: int = 3, tls: bool = True, auth: bool = True, netns: bool = False,
                 node_config: dict[int, str] | None = None, node_data: Sequence[Path] = (), hide: Sequence[Path] = ()):  # fmt: skip
        """``node_data``: SuperNode i's own data folder (``data-dir`` in its node config, for
        ``dataset='node'``); ``hide``: folders the SuperLink, and the ServerApp it starts, must not
        see (an empty tmpfs over each in a mount namespace of their own; root only)."""
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
        tag, subnet = f"pf{secrets.token_hex(2)}", f"10.77.{secrets.randbelow(250)}"  # a fresh subnet: no stale neighbours
        self.net = Network(tag, ["link", *(f"node{i}" for i in range(nodes))], subnet) if netns else None
        self.flwr_home = self.dir / "flwr-home"
        self.procs: dict[str, subprocess.Popen] = {}
        self.node_ids: dict[int, str] = {}  # SuperNode i -> its registered node id (with authentication)
        self.ports = dict(NETNS_PORTS) if netns else {k: _free_port() for k in NETNS_PORTS}

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
        gpus = visible_gpus(self._env())
        return {**self._env(), "CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else self._env()

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
    def start(self) -> "Deployment":
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

    def __enter__(self) -> "Deployment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for proc in self.procs.values():
            stop(proc)
        self.procs.clear()
        if self.net:
            self.net.down()
        if (self.dir / STATE_FILE).exists():
            (self.dir / STATE_FILE).unlink()

    def _write_connection(self) -> None:
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        security = f'root-certificates = "{self.dir / "pki" / "ca.crt"}"' if self.tls else "insecure = true"
        (self.flwr_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{self.link_address}:{self.ports["api"]}"\n{security}\n'
        )

    def _start_superlink(self) -> None:
        pki = self.dir / "pki"
        host = "0.0.0.0" if self.net else "127.0.0.1"
        cmd = [_bin("flower-superlink"), "--disable-runtime-dependency-installation", "--database", str(self.dir / "superlink.db"),
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
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"flower-superlink exited with code {proc.returncode}:\n{self.log('link')[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex((self.link_address, self.ports["api"])) == 0:
                    return
            if time.monotonic() > deadline:
                raise SystemExit("flower-superlink did not start within 60 s")
            time.sleep(0.2)

    def _flwr_json(self, *args: str) -> tuple[dict | None, str]:
        """``flwr <args> <connection> --format json``: (its JSON reply or None, its whole output)."""
        out = subprocess.run([_bin("flwr"), *args, CONNECTION, "--format", "json"],
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

    def node_status(self, i: int) -> str:
        """What the SuperLink says of authenticated SuperNode ``i``: 'online', 'offline', 'registered', ..."""
        reply, out = self._flwr_json("supernode", "ls")
        if reply is None:
            raise RuntimeError(f"flwr supernode ls failed: {out[-500:]}")
        return next((n["status"] for n in reply["nodes"] if n["node-id"] == self.node_ids[i]), "unknown")

    def wait_status(self, i: int, wanted: set[str], timeout: float) -> str:
        """Poll :meth:`node_status` until it is one of ``wanted``; the status, or TimeoutError."""
        deadline = time.monotonic() + timeout
        while (status := self.node_status(i)) not in wanted:
            if time.monotonic() > deadline:
                raise TimeoutError(f"SuperNode {i} is '{status}' after {timeout:.0f} s, not {sorted(wanted)}")
            time.sleep(1)
        return status

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
        cmd = [_bin("flower-supernode"), "--superlink", f"{self.link_address}:{self.ports['fleet']}",
               "--node-config", config, "--host", "127.0.0.1", "--port", str(_free_port())]  # fmt: skip
        cmd += ["--root-certificates", str(pki / "ca.crt")] if self.tls else ["--insecure"]
        if self.auth:
            cmd += ["--auth-supernode-private-key", str(key or pki / "keys" / f"node{i}")]
        return self._spawn(name or f"node{i}", cmd, self.node_env(i))

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pflower-deploy", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a SuperLink and SuperNodes in the background")
    up.add_argument("--dir", type=Path, required=True, help="working folder: certificates, logs, state, FLWR_HOME")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--netns", action="store_true", help="one network namespace per process (needs root)")
    up.add_argument("--insecure", action="store_true", help="no TLS and no SuperNode authentication (prints a warning)")
    up.add_argument("--no-auth", action="store_true", help="TLS without SuperNode authentication")
    up.add_argument("--node-data", default="", help="comma-separated data folders, one per SuperNode: each node's own data (run with dataset='node')")
    up.add_argument("--format", default="imagefolder", help="the node data's format (node config 'format'): imagefolder, mnist, fashion-mnist, emnist")
    dn = sub.add_parser("down", help="stop a deployment started with up")
    dn.add_argument("--dir", type=Path, required=True)
    certs = sub.add_parser("certs", help="only generate a CA, a SuperLink certificate and node keys")
    certs.add_argument("--dir", type=Path, required=True)
    certs.add_argument("--nodes", type=int, default=3)
    certs.add_argument("--host", action="append", default=[], help="address the SuperNodes dial (repeatable)")
    data = sub.add_parser("node-data", help="write one image folder per node from a pooled data set (for a demo of dataset='node')")
    data.add_argument("--source", type=Path, required=True, help="IDX files (e.g. MNIST's) or an image tree with train/<class>/")
    data.add_argument("--out", type=Path, required=True, help="writes OUT/node0, OUT/node1, ...")
    data.add_argument("--classes", default="0-3/4-6/7-9", help="one class group per node, '/'-separated (default: %(default)s)")
    data.add_argument("--per-class", type=int, default=200, help="images of each class per node, a quarter in test/")
    args = p.parse_args(argv)
    if args.command == "node-data":
        from pflower.datasets.node import parse_groups, write_node_folders
        from pflower.datasets.sources import DataError

        try:
            dirs = write_node_folders(args.source, args.out, parse_groups(args.classes), args.per_class)
        except (DataError, ValueError) as err:
            p.error(str(err))
        print(f"wrote {', '.join(map(str, dirs))}")
        return 0
    if args.command == "down":
        down(args.dir)
        return 0
    if args.command == "certs":
        make_pki(args.dir, [*args.host, "127.0.0.1", "localhost"], args.nodes)
        print(f"wrote {args.dir}/ca.crt, server.pem, server.key and keys/node0..{args.nodes - 1}")
        return 0
    node_data = [Path(p) for p in args.node_data.split(",") if p]
    if node_data and len(node_data) != args.nodes:
        p.error(f"--node-data names {len(node_data)} folders for {args.nodes} nodes")
    if missing := [str(d) for d in node_data if not d.is_dir()]:
        p.error(f"--node-data: no such folder: {', '.join(missing)}")
    if node_data:
        from pflower.datasets.node import FORMATS

        if args.format not in FORMATS:
            p.error(f"--format is {args.format!r}; allowed: {', '.join(FORMATS)}")
    config = {i: f'format="{args.format}"' for i in range(len(node_data))}
    dep = Deployment(args.dir, args.nodes, tls=not args.insecure, auth=not (args.insecure or args.no_auth), netns=args.netns,
                     node_config=config, node_data=node_data)  # fmt: skip
    dep.start()
    print(f"SuperLink at {dep.link_address} (Fleet API :{dep.ports['fleet']}, HTTP API :{dep.ports['api']}), {args.nodes} SuperNodes")
    print(f"Submit a run:  FLWR_HOME={dep.flwr_home} flwr run . {CONNECTION} --stream")
    print(f"Stop:          pflower-deploy down --dir {args.dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

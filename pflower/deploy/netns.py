"""Network namespaces for a deployment: one per process, joined by veth pairs to a bridge in the
root namespace, so each process is a host of its own, as on separate machines (root only)."""

from __future__ import annotations

import random
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Network:
    """Namespaces ``<tag>-<name>`` joined by veth pairs to one bridge in the root namespace.

    :meth:`up` claims a /24 of 10.77.0.0/16 that no interface uses: its bridge is named for it
    (``pf77-<k>``), and creating a link whose name exists fails, so two deployments started at
    once never share a subnet (with one, a client would reach the other's SuperLink).
    """

    tag: str
    names: list[str]
    subnet: str = ""  # "10.77.<k>", set by up()
    created: list[str] = field(default_factory=list)

    def ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def address(self, name: str) -> str:
        return f"{self.subnet}.{self.names.index(name) + 1}"

    @property
    def bridge(self) -> str:
        return f"pf77-{self.subnet.rsplit('.', 1)[-1]}"

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def accept_forwarding(self) -> None:
        """Let traffic cross the bridge where the FORWARD chain drops it (dockerd sets its policy to
        DROP): one rule for this bridge only, removed by :meth:`down`. Without iptables, nothing."""
        if shutil.which("iptables") and subprocess.run(forward_rule(self.bridge, "-I"), capture_output=True, check=False).returncode == 0:
            self.created.append("forward")

    def _claim_subnet(self) -> None:
        """Create the bridge of a free subnet; SystemExit when all 250 are taken."""
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
        for k in random.sample(range(250), 250):
            self.subnet = f"10.77.{k}"
            if f" {self.subnet}." in used:
                continue
            claim = subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], capture_output=True, text=True, check=False)
            if claim.returncode == 0:
                self.created.append("bridge")
                return
            if "exists" not in claim.stderr:
                raise subprocess.CalledProcessError(claim.returncode, claim.args, claim.stdout, claim.stderr)
        raise SystemExit("could not create network namespaces: every subnet 10.77.0-249.0/24 is in use")

    def up(self) -> None:
        try:
            self._claim_subnet()
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

"""Network namespaces: deployments started at once each get a subnet of their own."""

import os
import shutil
import subprocess

import pytest

from pflower.deploy.netns import Network

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2")


def test_networks_up_at_once_never_share_a_subnet_nor_one_in_use(monkeypatch):
    """Every subnet but three is taken by another interface (one of them by a stray address, one
    by a bridge already named for it): three networks claim the three free ones, a fourth is
    refused by name, and down() frees what up() claimed."""
    real = subprocess.run
    free = [17, 18, 19]
    taken = "".join(f"9: x inet 10.77.{k}.254/24 scope global x\n" for k in range(250) if k not in (*free, 20))

    def run(cmd, *args, **kwargs):
        if cmd[:4] == ["ip", "-o", "-4", "addr"]:
            return subprocess.CompletedProcess(cmd, 0, real(cmd, *args, **kwargs).stdout + taken, "")
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    squatter = real(["ip", "link", "add", "pf77-20", "type", "bridge"], capture_output=True, text=True)
    networks = [Network(f"pft{i}", ["link", "node0"]) for i in range(4)]
    try:
        for net in networks[:3]:
            net.up()
        assert sorted(net.subnet for net in networks[:3]) == [f"10.77.{k}" for k in free]
        for net in networks[:3]:
            ns = net.ns("node0")
            addr = real(["ip", "-n", ns, "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
            assert f"{net.address('node0')}/24" in addr
        with pytest.raises(SystemExit, match="every subnet"):
            networks[3].up()
        assert networks[3].created == []
    finally:
        for net in networks:
            net.down()
        if squatter.returncode == 0:
            real(["ip", "link", "del", "pf77-20"], capture_output=True)
    links = real(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert not any(f"pf77-{k}:" in links for k in free)

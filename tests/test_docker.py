"""The docker files, checked without a Docker engine (the fast layer; tests/test_docker_demo.py
runs the demo for real): compose structure and merge, every service command parsed by the pinned
Flower's own argument parsers, volumes mounted where the images' user owns the folder, health
checks and no restart policy, the image built once from this repository's package, and the
certificate script's output."""

import ipaddress
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from cryptography import x509
from flwr.common.config import parse_config_args

DOCKER = ROOT / "docker"
FLWR_PIN = re.search(r'"flwr\[simulation\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
SSL_FLAGS = {"--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certfile"}


def _load(name: str) -> dict:
    return yaml.safe_load((DOCKER / name).read_text())


def _merge(base: dict, overlay: dict) -> dict:
    """Compose's merge for what these files use: command replaced, volumes merged by target."""
    merged = {name: dict(svc) for name, svc in base["services"].items()}
    for name, svc in overlay.get("services", {}).items():
        assert name in merged, f"overlay service {name} is not in the base file"
        for key, value in svc.items():
            if key == "volumes":
                by_target = {v.split(":")[1]: v for v in merged[name].get("volumes", [])}
                by_target.update({v.split(":")[1]: v for v in value})
                merged[name]["volumes"] = list(by_target.values())
            else:
                merged[name][key] = value
    return {**base, "services": merged}


def _parser(image: str):
    if image.startswith("flwr/superlink:"):
        from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink as make
    elif image.startswith("flwr/supernode:"):
        from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode as make
    else:
        from flwr.supercore.cli.flower_superexec import _parse_args as make
    return make()


COMPOSITIONS = {
    "compose.yml": lambda: _load("compose.yml"),
    "compose.yml + compose.tls.yml": lambda: _merge(_load("compose.yml"), _load("compose.tls.yml")),
    "compose.yml + compose.tls.yml + compose.warm.yml": lambda: _merge(_merge(_load("compose.yml"), _load("compose.tls.yml")), _load("compose.warm.yml")),
}


@pytest.mark.parametrize("name", sorted(COMPOSITIONS))
def test_compose_services_are_consistent_and_flower_accepts_every_command(name):
    doc = COMPOSITIONS[name]()
    services = doc["services"]
    volumes = set(doc["volumes"])
    nodes = sorted(s for s in services if s.startswith("supernode-"))
    assert len(nodes) >= 3
    partitions = []
    for svc_name, svc in services.items():
        image = svc["image"]
        assert image.split(":")[1] in (FLWR_PIN, "0.1.0"), f"{svc_name}: {image}"
        for dep in svc.get("depends_on", []):
            assert dep in services, f"{svc_name} depends on unknown {dep}"
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            assert source in volumes or (DOCKER / source).resolve().is_relative_to(DOCKER), f"{svc_name}: {vol}"
        args = _parser(image).parse_args(svc["command"])  # argparse exits on an unknown flag
        flags = {a for a in svc["command"] if a.startswith("--")}
        assert not (flags & SSL_FLAGS) or SSL_FLAGS <= flags, f"{svc_name}: Flower needs all three --ssl-* files"
        tls = "--insecure" not in flags
        assert tls == ("compose.tls.yml" in name), f"{svc_name}: insecure mode must be explicit, TLS in the TLS file"
        if image.startswith("flwr/supernode:"):
            cfg = parse_config_args([args.node_config])
            partitions.append(cfg["partition-id"])
            assert cfg["num-partitions"] == len(nodes) and cfg["state-dir"] == "/app/state" and cfg["data-dir"] == "/app/data"
            assert args.superlink == "superlink:9092"
            if tls:
                assert args.auth_supernode_private_key == f"/app/certs/node{cfg['partition-id']}"
        if image.startswith("pflower-superexec"):
            host = args.runtime_api_address.split(":")[0]
            assert host == "superlink" or host in nodes, f"{svc_name} dials {host}"
    assert sorted(partitions) == list(range(len(nodes)))
    # each node's own data is mounted read-only into its ClientApp executor only
    data = {n: [v for v in s.get("volumes", []) if v.split(":")[1] == "/app/data"] for n, s in services.items()}
    executors = {
        s["command"][s["command"].index("--runtime-api-address") + 1].split(":")[0]: n for n, s in services.items() if "--runtime-api-address" in s["command"]
    }
    assert {n: v for n, v in data.items() if v} == {executors[node]: [f"./node-data/node{i}:/app/data:ro"] for i, node in enumerate(nodes)}
    assert all(services[executors[node]]["environment"]["PFLOWER_CACHE"].startswith("/app/state/") for node in nodes)
    # the nodes' executors poll their SuperNode as pflower-deploy's do; the ServerApp's keeps Flower's 1 s (it waits once per run)
    from pflower.deploy.deployment import NODE_POLL_INTERVAL, POLL_ENV

    assert all(float(services[executors[node]]["environment"][POLL_ENV]) == NODE_POLL_INTERVAL for node in nodes)
    assert POLL_ENV not in services["serverapp"].get("environment", {})
    # the executor image is built by one service and used by every executor
    builders = [n for n, svc in services.items() if "build" in svc]
    assert builders == ["serverapp"] and services["serverapp"]["build"]["dockerfile"] == "docker/Dockerfile"
    assert {svc["image"] for n, svc in services.items() if "--runtime-api-address" in svc["command"]} == {services["serverapp"]["image"]}
    # every process can write its volumes: a named volume is mounted where the image has a folder
    # owned by its user (Flower's images: /app; the executor image: the folders its Dockerfile makes)
    made = set(re.search(r"mkdir -p ([^\n\\&]+)", (DOCKER / "Dockerfile").read_text()).group(1).split())
    for svc_name, svc in services.items():
        for vol in svc.get("volumes", []):
            source, target = vol.split(":")[:2]
            if source in volumes:
                owned = made if svc["image"].startswith("pflower-superexec") else {"/app"}
                assert target in owned, f"{svc_name}: volume {source} on {target}, not on a folder the image's user owns"
    # failures are loud: health checks on the SuperLink and the SuperNodes, dependencies on health, no restarts
    assert not [n for n, svc in services.items() if "restart" in svc]
    for svc_name, svc in services.items():
        if svc["image"].startswith(("flwr/superlink:", "flwr/supernode:")):
            assert svc["healthcheck"]["test"][0] == "CMD", svc_name
        for dep in svc.get("depends_on", {}):
            wanted = "service_healthy" if "healthcheck" in services[dep] else "service_started"
            assert svc["depends_on"][dep]["condition"] == wanted, f"{svc_name} -> {dep}"
    if name != "compose.yml":  # each private key only where it is used
        for svc_name, svc in services.items():
            keys = {v.split(":")[0] for v in svc.get("volumes", []) if v.startswith("./certs/") and not v.startswith("./certs/ca.crt")}
            if svc_name == "superlink":
                assert keys == {"./certs/server.pem", "./certs/server.key"}
            elif svc_name.startswith("supernode-"):
                assert keys == {"./certs/server.pem", "./certs/server.key", f"./certs/keys/node{svc_name[-1]}"}, svc_name
            else:
                assert keys == set(), svc_name
    # one ClientApp executor per SuperNode
    dialed = sorted(s["command"][s["command"].index("--runtime-api-address") + 1] for s in services.values() if "--runtime-api-address" in s["command"])
    assert dialed == sorted(["superlink:8000", *(f"{n}:9094" for n in nodes)])


@pytest.mark.parametrize("base", ["compose.yml", "compose.yml + compose.tls.yml"])
def test_the_warm_override_wraps_every_clientapp_executor_and_nothing_else(base):
    """compose.warm.yml: each ClientApp executor's flower-superexec (the image's entrypoint, with
    the base files' command) runs under `pflower-warm run`, whose parser accepts the arguments;
    it preloads what pflower-deploy --warm preloads; the ServerApp executor and Flower's own
    images are untouched."""
    from pflower.deploy import warm
    from pflower.deploy.deployment import WARM_PRELOAD

    plain = COMPOSITIONS[base]()
    merged = _merge(plain, _load("compose.warm.yml"))
    executors = sorted(n for n, svc in merged["services"].items() if "entrypoint" in svc)
    assert executors == [f"clientapp-{i}" for i in range(3)]
    for name in executors:
        svc = merged["services"][name]
        assert svc["command"] == plain["services"][name]["command"] and svc["environment"] == plain["services"][name]["environment"]
        entry = svc["entrypoint"]
        assert entry[:2] == ["pflower-warm", "run"] and entry[-2:] == ["--", "flower-superexec"]
        folder = Path(entry[entry.index("--dir") + 1])
        assert folder.parent == Path("/tmp") and len(str(warm.socket_path(folder))) <= warm.MAX_SOCKET_PATH
        assert tuple(entry[entry.index("--preload") + 1].split(",")) == WARM_PRELOAD
        args = warm.parser().parse_args([*entry[1:], *svc["command"]])  # argparse exits on an unknown flag
        assert args.command == "run" and args.cmd[1:] == ["flower-superexec", *svc["command"]] and args.preload == WARM_PRELOAD
    text = (DOCKER / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["flower-superexec"]' in text  # what the override's command after -- replaces
    assert "pflower-warm" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_dockerfile_installs_this_repository_on_the_pinned_flower_image():
    text = (DOCKER / "Dockerfile").read_text()
    assert f"ARG FLWR_VERSION={FLWR_PIN}" in text and "FROM flwr/superexec:${FLWR_VERSION}" in text
    # dependencies from pyproject.toml alone, then the package: a code change rebuilds one layer
    copies = re.findall(r"^COPY --chown=app:app (.+) \./(?:pflower)?$", text, re.M)
    assert copies == ["pyproject.toml", "README.md", "pflower"], copies
    assert text.index("-r /tmp/requirements.txt") < text.index("COPY --chown=app:app pflower")
    assert re.search(r"pip install --no-cache-dir --no-deps --no-build-isolation \.$", text, re.M)
    assert 'ENTRYPOINT ["flower-superexec"]' in text
    # a build sends the package and its metadata only (no .venv, results or data)
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert ignore[0] == "*" and {l for l in ignore if l.startswith("!")} == {"!pyproject.toml", "!README.md", "!pflower/"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["pflower"]


def test_certificate_script_covers_every_service_name(tmp_path):
    env = {"PFLOWER_PYTHON": str(ROOT / ".venv" / "bin" / "python")}
    script = tmp_path / "docker"
    script.mkdir()
    (script / "generate-certs.sh").write_text((DOCKER / "generate-certs.sh").read_text())
    subprocess.run(["bash", str(script / "generate-certs.sh")], check=True, env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True)
    certs = script / "certs"
    cert = x509.load_pem_x509_certificate((certs / "server.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) >= {"superlink", "supernode-0", "supernode-1", "supernode-2", "localhost"}
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert all((certs / "keys" / f"node{i}.pub").read_text().startswith("ecdsa-sha2-nistp384 ") for i in range(3))
    # the containers' user (uid 49999) can read the private keys
    for key in [certs / "server.key", *(certs / "keys" / f"node{i}" for i in range(3))]:
        st = key.stat()
        assert (st.st_uid == 49999 and st.st_mode & 0o777 == 0o600) if os.geteuid() == 0 else st.st_mode & 0o004, key

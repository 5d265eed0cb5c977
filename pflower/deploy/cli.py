"""``pflower-deploy``: start and stop a deployment (``up``, ``down``), write its certificates
(``certs``), or write each node a data folder of its own for a demo (``node-data``)."""

from __future__ import annotations

from pathlib import Path

import pflower.deploy
from pflower import help_text
from pflower.deploy.certificates import make_pki
from pflower.deploy.deployment import CONNECTION, Deployment, down


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand ``argv`` names; the exit status."""
    p = help_text.parser("pflower-deploy", pflower.deploy.__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a SuperLink and SuperNodes in the background")
    up.add_argument("--dir", type=Path, required=True, help="working folder: certificates, logs, state, FLWR_HOME")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--netns", action="store_true", help="one network namespace per process (needs root)")
    up.add_argument("--insecure", action="store_true", help="no TLS and no SuperNode authentication (prints a warning)")
    up.add_argument("--no-auth", action="store_true", help="TLS without SuperNode authentication")
    up.add_argument("--warm", action="store_true",
                    help="fork each message's ClientApp from a per-node server with torch, numpy and Flower imported (pflower.deploy.warm)")  # fmt: skip
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
                     node_config=config, node_data=node_data, warm=args.warm)  # fmt: skip
    dep.start()
    warmth = ", warm (a fork server each)" if args.warm else ""
    print(f"SuperLink at {dep.link_address} (Fleet API :{dep.ports['fleet']}, HTTP API :{dep.ports['api']}), {args.nodes} SuperNodes{warmth}")
    print(f"Submit a run:  FLWR_HOME={dep.flwr_home} flwr run . {CONNECTION} --stream")
    print(f"Stop:          pflower-deploy down --dir {args.dir}")
    return 0

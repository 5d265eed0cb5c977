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
    pflower-deploy up --nodes 3 --dir deploy --warm     # each node's ClientApps forked from a fork server
    FLWR_HOME=deploy/flwr-home flwr run . pflower-deploy --stream -c "num-server-rounds=5"
    pflower-deploy down --dir deploy

- :mod:`~pflower.deploy.certificates`: the CA, the SuperLink's certificate, the nodes' keys;
- :mod:`~pflower.deploy.netns`: the network namespaces and their bridge;
- :mod:`~pflower.deploy.deployment`: :class:`Deployment`, the processes, and ``down``;
- :mod:`~pflower.deploy.warm`: warm nodes (``pflower-warm``): a fork server per node and the
  ``flwr-clientapp`` shim that hands it each message;
- :mod:`~pflower.deploy.cli`: the ``pflower-deploy`` command.

Tooling: the FAB the SuperLink ships to the nodes leaves this package out.
"""

from pflower.deploy.deployment import Deployment

__all__ = ["Deployment"]

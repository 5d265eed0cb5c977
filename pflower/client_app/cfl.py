"""Clustered FL client: FedAvg's, trained on and evaluating its cluster's model as the server
sends it (the server keeps the clusters; a client keeps nothing of its own between rounds)."""

from __future__ import annotations

from pflower.client_app.base import ClientMethod


class ClusteredFLClient(ClientMethod):
    EVALUATES = "its cluster's model as the server sends it"

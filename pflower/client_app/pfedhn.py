"""pFedHN client: trains the model the server's hypernetwork generated for it and uploads every
layer (what pFedLA's client does; BN statistics stay with it)."""

from __future__ import annotations

from pflower.client_app.pfedla import PFedLAClient


class PFedHNClient(PFedLAClient):
    EVALUATES = "the model the server's hypernetwork generates for it, as the server sends it"

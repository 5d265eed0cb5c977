"""HeurpFedLA (Ma et al., CVPR 2022): pFedLA where each client keeps its top-k layers of highest
self-weight local, and the server stops sending them."""

from pydantic import Field

from pflower.methods.declaration import Method
from pflower.methods.pfedla import PFedLAParams


class HeurPFedLAParams(PFedLAParams):
    top_k: int = Field(1, ge=0, le=1000, description="layers of highest self-weight each client retains (not sent to it); 0 is pFedLA")


METHOD = Method(
    name="heurpfedla",
    summary="pFedLA with each client's top-k layers of highest self-weight kept local and not sent",
    client="pflower.client_app.pfedla:PFedLAClient",
    strategy="pflower.strategies.pfedla:PFedLA",
    params=HeurPFedLAParams,
)

"""FedeRiCo (decentralized EM): clients choose collaborators epsilon-greedily through a gossip
overlay; the server only relays.

The relayed protocol's record names, which both sides use: a round is the steps ``STEPS``, each a
``train.relay`` message whose config says the step (``phase``).
"""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams
from pflower.reply_metrics import CLIENT_ID, UNIT, Numbers

#: The relayed steps of a round, in order.
STEPS = ("plan", "serve", "use", "update")
PLAN = "plan"  # ConfigRecord a client plans with: "neighbours" (whose models it wants), "gossip-to" (its shuffle partner)
GOSSIP = "gossip"  # ConfigRecord: the shuffle buffer it sends its partner (the overlay's "ids"/"ages" format)
REQUESTS = "requests"  # ConfigRecord the server sends in "serve": "requested-by", "gossip-from"
MODEL = "model"  # ArrayRecord a requested client serves


def gossip_from(i: int) -> str:
    """The shuffle buffer client i sent (forwarded to its partner in "serve")."""
    return f"gossip-{i}"


def gossip_reply(i: int) -> str:
    """A client's answer to client i's shuffle (forwarded to i in "use" as "gossip-reply")."""
    return f"gossip-reply-{i}"


GOSSIP_REPLY = "gossip-reply"


def model_of(j: int) -> str:
    """Client j's model, forwarded to a client that asked for it ("use")."""
    return f"model-{j}"


def update_for(j: int) -> str:
    """A client's weighted update of client j's model (its "use" reply)."""
    return f"update-{j}"


def update_from(i: int) -> str:
    """Client i's weighted update of the receiver's model (forwarded in "update")."""
    return f"update-from-{i}"


class FedericoParams(MethodParams):
    view_size: int = Field(4, ge=1, le=1000, description="peers in each client's partial view (gossip peer sampling)")
    neighbours: int = Field(3, ge=1, le=1000, description="peers whose models a client uses each round (besides its own)")
    epsilon: float = Field(0.3, ge=0, le=1, description="per neighbour slot, the probability of a random view peer instead of the best-weighted one")
    momentum: float = Field(0.5, gt=0, le=1, description="β of the loss EMA, L ← (1 − β) L + β loss")


METHOD = Method(
    name="federico",
    summary="no central model: each client mixes the models of collaborators it picks by EM; the server relays",
    client="pflower.client_app.federico:FedericoClient",
    strategy="pflower.strategies.federico:FedericoRelay",
    params=FedericoParams,
    example={"partition": "label-groups"},
    no_finetune="its prediction is a mixture of models, not one network",
    evaluation_metrics={"weight-ids": Numbers(CLIENT_ID, distinct=True, requires=("weights",)), "weights": Numbers(UNIT, length="weight-ids")},
)

"""pFedMe (T Dinh et al., 2020): personalized models as Moreau envelopes around the clients' local models."""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams


class PFedMeParams(MethodParams):
    lam: float = Field(15.0, gt=0, description="λ of the Moreau envelope f(θ) + λ/2·‖θ − w‖² (the authors' MNIST runs)")
    k: int = Field(5, ge=1, le=1000, description="inner steps on θ per minibatch")
    personal_lr: float = Field(
        0.01, gt=0, description="step of the inner solver on θ (FL-bench's; the authors' 0.1, for their MNIST model, gives NaN with our CNN in round 1)"
    )
    lr: float = Field(
        0.005,
        gt=0,
        description="step η of the local model, w ← w − η·λ·(w − θ), with the run's momentum and weight decay (the authors' MNIST runs; the run's `lr` would make η·λ > 1)",
    )
    beta: float = Field(1.0, gt=0, description="server mixing w ← (1 − β)·w + β·mean(w_i); 1 is FedAvg")


def wrap(model, params):
    from pflower.models.mixing import MixedModel

    return MixedModel(model)


METHOD = Method(
    name="pfedme",
    summary="a personalized model θ solved per minibatch around the local model w (Moreau envelope); the server mixes with β",
    client="pflower.client_app.pfedme:PFedMeClient",
    strategy="pflower.strategies.pfedme:PFedMe",
    params=PFedMeParams,
    wrap=wrap,
    averages=True,
    example={"pfedme.lr": 0.05},  # the paper's 0.005 is for 800 rounds; a few-round demonstration needs a larger step
)

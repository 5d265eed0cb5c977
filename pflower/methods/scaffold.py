"""SCAFFOLD (Karimireddy et al., ICML 2020): FedAvg whose local steps are corrected by control
variates, the server's c and each client's c_i, against the drift of heterogeneous clients.

The control variates live in the model as buffers (:mod:`pflower.models.controls`, which names
the arrays both sides use).
"""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams


class ScaffoldParams(MethodParams):
    global_lr: float = Field(
        1.0, gt=0, description="server step η_g: x ← x + η_g·mean_i(y_i − x) over the round's clients, a plain mean (1: x becomes their mean)"
    )


def wrap(model, params: ScaffoldParams):
    from pflower.models.controls import with_controls

    return with_controls(model)


METHOD = Method(
    name="scaffold",
    summary="FedAvg with local steps corrected by control variates (c − c_i) that the server and each client keep; the global model predicts",
    client="pflower.client_app.scaffold:ScaffoldClient",
    strategy="pflower.strategies.scaffold:Scaffold",
    params=ScaffoldParams,
    wrap=wrap,
)

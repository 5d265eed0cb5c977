"""SCAFFOLD (Karimireddy et al., ICML 2020): FedAvg whose local steps are corrected by control
variates, the server's c and each client's c_i, against the drift of heterogeneous clients.

Array names both sides use: the model's own keys carry x (server to client) and y_i (client to
server); for each parameter ``<k>``, ``C_SERVER + <k>`` carries c (server to client) and
``DELTA_C + <k>`` the client's Δc_i (client to server). ``C_CLIENT + <k>`` holds c_i, which never
leaves the client. The three live in the model as buffers (:func:`pflower.models.controls.with_controls`).
"""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams

#: Prefix of every control-variate array in the model's state.
PREFIX = "scaffold."
#: The server's control variate c, the client's c_i, and the client's last update Δc_i.
C_SERVER, C_CLIENT, DELTA_C = f"{PREFIX}c.", f"{PREFIX}c_i.", f"{PREFIX}delta_c."


class ScaffoldParams(MethodParams):
    global_lr: float = Field(1.0, gt=0, description="server step η_g: x ← x + η_g·mean_i(y_i − x) over the round's clients (1: their mean, as FedAvg's)")


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

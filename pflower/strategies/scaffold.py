"""SCAFFOLD's server: the global model x and the control variate c, both sent to every sampled
client; from the round's valid replies S (of N clients in all), each with y_i and Δc_i:

    x ← x + η_g · mean_{i∈S}(y_i − x),    c ← c + (|S| / N) · mean_{i∈S}(Δc_i)

(Algorithm 1 of the paper, plain means as there; η_g is ``global_lr``). c keeps one array per
parameter; arrays of the model that are not parameters (BatchNorm's running statistics) become
the mean of the clients' values, with no control variate and no server step. Evaluation messages
and ``global_arrays`` carry x alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from flwr.app import ArrayRecord
from torch import nn

from pflower.client_state import ClientState
from pflower.config import ConfigError, Settings
from pflower.models.controls import C_SERVER, DELTA_C, PREFIX
from pflower.records import from_record, to_record
from pflower.strategies.loop import TrainRounds
from pflower.strategies.validation import ArraySpec, Reply


class Scaffold(TrainRounds):
    """SCAFFOLD's server. The initial arrays are the model's (x), with the initial c as
    ``scaffold.c.<key>`` arrays if given (what pflower's client declares it receives); without
    them c starts at zero for each of ``parameters``.

    Parameters
    ----------
    global_lr : float (default: 1.0)
        Server step η_g: x ← x + η_g·mean_i(y_i − x) over the round's clients.
    parameters : list of str or None (default: None)
        Without ``scaffold.c.<key>`` initial arrays: the arrays that get a control variate (the
        model's parameters; its other arrays, BatchNorm's statistics, are averaged). One of the
        two is needed: the server cannot tell parameters from statistics by their arrays.
    **kwargs
        :class:`~pflower.strategies.loop.TrainRounds`' parameters."""

    STATEFUL_CLIENTS = True  # each client keeps its c_i between rounds
    ONE_WAY_ARRAYS = True  # c goes to the clients, Δc_i comes back

    def __init__(self, *, global_lr: float = 1.0, parameters: Sequence[str] | None = None, **kwargs):
        super().__init__(**kwargs)
        if not global_lr > 0:
            raise ValueError(f"global_lr={global_lr} must be > 0")
        self.global_lr = global_lr
        self.parameters = list(parameters) if parameters is not None else None
        self.dtypes: dict[str, torch.dtype] = {}
        self.global_state: dict[str, torch.Tensor] = {}  # x, by the model's keys
        self.control: dict[str, torch.Tensor] = {}  # c, by parameter key
        self._sent: dict[str, ArrayRecord] = {}  # "train" (x and c) and "model" (x), until x or c changes
        self._reference: dict[str, torch.Tensor] | None = None

    @classmethod
    def from_settings(cls, settings: Settings, model: nn.Module, state: ClientState) -> Scaffold:
        if settings.optimizer != "sgd":
            raise ConfigError([("optimizer", settings.optimizer, "SCAFFOLD's control variates (option II) need 'sgd'")])
        strategy = cls(**cls.common_kwargs(settings), global_lr=settings.params.global_lr)
        strategy.initial_arrays = to_record(model.state_dict(), state.received)  # x and c, as the client declares them
        return strategy

    def prepare(self, initial_arrays: ArrayRecord) -> None:
        super().prepare(initial_arrays)
        state = from_record(initial_arrays)
        self.global_state = {k: v for k, v in state.items() if not k.startswith(PREFIX)}
        given = {k[len(C_SERVER) :]: v for k, v in state.items() if k.startswith(C_SERVER)}
        if not given and self.parameters is None:
            raise ValueError(
                "SCAFFOLD keeps a control variate per parameter and none for BatchNorm's statistics: pass "
                "parameters=[k for k, _ in model.named_parameters()], or initial arrays with 'scaffold.c.<key>' arrays "
                "(pflower.models.controls.with_controls)"
            )
        keys = list(given) or list(self.parameters or [])
        if wrong := [k for k in keys if k not in self.global_state or given.get(k, self.global_state[k]).shape != self.global_state[k].shape]:
            raise ValueError(f"control variates without a model array of their shape: {wrong[:3]}")
        self.control = {k: given[k] if k in given else torch.zeros_like(self.global_state[k]) for k in keys}
        self.dtypes = {k: v.dtype for k, v in self.global_state.items()}
        self.upload_spec = {k: ArraySpec.of(v) for k, v in self.global_state.items()} | {DELTA_C + k: ArraySpec.of(v) for k, v in self.control.items()}
        self._changed()

    def _changed(self) -> None:
        self._sent.clear()
        self._reference = None

    def _record(self, what: str) -> ArrayRecord:
        if what not in self._sent:
            arrays = dict(self.global_state) | ({C_SERVER + k: v for k, v in self.control.items()} if what == "train" else {})
            self._sent[what] = to_record(arrays)
        return self._sent[what]

    def train_arrays(self, server_round: int, ids: list[int]) -> dict[int, ArrayRecord]:
        record = self._record("train")
        return {cid: record for cid in ids}

    def evaluate_arrays(self, server_round: int, ids: list[int]) -> dict[int, ArrayRecord]:
        record = self._record("model")
        return {cid: record for cid in ids}

    def global_arrays(self) -> ArrayRecord:
        return self._record("model") if self.global_state else ArrayRecord()

    def update_reference(self, client_id: int) -> Mapping[str, torch.Tensor]:
        """What a client's upload is measured from (``max-update-norm``): x for y_i, zero for
        Δc_i, so the bound is on the norm of (y_i − x, Δc_i), the client's whole update."""
        if self._reference is None:
            self._reference = dict(self.global_state) | {DELTA_C + k: torch.zeros_like(v) for k, v in self.control.items()}
        return self._reference

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        share = len(replies) / max(self.federation.num_clients, len(replies))
        for k, x in self.global_state.items():
            mean = torch.stack([r.arrays[k].double() for r in replies]).mean(0)
            new = x.double() + self.global_lr * (mean - x.double()) if k in self.control else mean
            self.global_state[k] = new.to(self.dtypes[k])
        for k, c in self.control.items():
            mean = torch.stack([r.arrays[DELTA_C + k].double() for r in replies]).mean(0)
            self.control[k] = (c.double() + share * mean).to(c.dtype)
        self._changed()

    def state_dict(self) -> dict:
        return {**super().state_dict(), "global": dict(self.global_state), "control": dict(self.control)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.global_state = {k: state["global"][k].to(self.dtypes[k]) for k in self.dtypes}
        self.control = {k: state["control"][k].to(v.dtype) for k, v in self.control.items()}
        self._changed()

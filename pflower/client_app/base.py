"""Client side of a method: what it uploads and how it trains. The default is FedAvg."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import RecordDict
from torch import nn

from pflower.client_state import ClientState
from pflower.config import Settings
from pflower.datasets.federated import Split
from pflower.training import LossFn, cross_entropy, evaluate, train

#: The record of ``context.state`` that holds a client's whole personal model.
PERSONAL = "personal"


class ClientMethod:
    """FedAvg's client: train every parameter on the local data, upload every float tensor.

    Subclasses override :meth:`client_state` (what leaves the client, what the server sets, what
    stays personal) and :meth:`fit` (the local update, always through
    :func:`pflower.training.train`).
    """

    #: What this method evaluates (metrics.json records it with the fine-tuning epochs).
    EVALUATES = "the global model as the server sends it"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "upload_keys" in vars(cls):  # the hook before client_state: it would be ignored, and a private array uploaded
            raise TypeError(
                f"{cls.__name__} overrides upload_keys, which pflower no longer calls: declare client_state(model) instead (docs/adding-a-method.md)"
            )

    def __init__(self, settings: Settings):
        self.settings = settings
        #: The step-size factor of the round at hand, (1 - ``lr-decay``) ** (round - 1).
        self.lr_factor = 1.0

    def start_round(self, server_round: int) -> None:
        """Called by the ClientApp before a message's training: sets the round's step-size factor."""
        self.lr_factor = (1.0 - self.settings.lr_decay) ** max(server_round - 1, 0)

    @property
    def finetune_epochs(self) -> int:
        """Local epochs on the training split before every evaluation (``finetune-epochs``; 0: as received)."""
        return self.settings.finetune_epochs

    def finetune(self, model: nn.Module, data: Split, seed: int, epochs: int) -> None:
        """Train the model about to be evaluated for ``epochs`` (not kept: evaluation never saves)."""
        self._train(model, data, seed, epochs=epochs)

    def client_state(self, model: nn.Module) -> ClientState:
        """Each array of the method's model and who may see it (default: every float array is
        the model the server sends and the client uploads; integer counters stay private)."""
        return ClientState.of(model)

    def initial_state(self, model: nn.Module, client_id: int) -> dict[str, torch.Tensor]:
        """The personal state of a client that has not trained yet (default: the common init)."""
        return model.state_dict()

    def before_fit(self, model: nn.Module, data: Split, incoming: RecordDict, server_round: int) -> dict:
        """Use what a training message carries besides its arrays (FedFomo: other clients'
        models) before :meth:`fit`; returns extra reply metrics (default: none)."""
        return {}

    def fit(self, model: nn.Module, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        """Train ``model`` (already holding the received arrays) in place; return the mean loss."""
        return self._train_local(model, data, seed)

    def evaluate(self, model: nn.Module, train: Split, test: Split, trained: bool, config: Mapping[str, Any]) -> dict[str, float | int]:
        """Reply metrics of the personalized model on the test split (``trained``: it has trained
        before; ``config``: the evaluate message's config)."""
        return evaluate(model, test).metrics()

    #: The step of :meth:`relay_step` that ends a client's round (its state is saved after it).
    LAST_STEP = ""

    def relay_step(
        self, phase: str, model: nn.Module, data: Split, incoming: RecordDict, state: RecordDict,
        client_id: int, num_clients: int, server_round: int,
    ) -> RecordDict:  # fmt: skip
        """One step of a client-to-client protocol relayed by the server (only FedeRiCo has one)."""
        raise ValueError(f"method '{self.settings.method}' has no relayed protocol (step {phase!r})")

    def predictor(self, model: nn.Module, state: RecordDict) -> nn.Module:
        """What predicts for this client (default: its personalized model)."""
        return model

    def report(self, state: RecordDict) -> dict:
        """Extra evaluation-reply metrics from the personal state (default: none)."""
        return {}

    def _train_local(self, model: nn.Module, data: Split, seed: int, **kw) -> float:
        """A round's local training: ``local-epochs`` epochs, or ``local-steps`` minibatch steps
        when set; ``kw`` as :meth:`_train`'s. Every method's local training goes through here
        (epochs of its own keys and fine-tuning through :meth:`_train`)."""
        return self._train(model, data, seed, epochs=self.settings.local_epochs, steps=self.settings.local_steps, **kw)

    def _train(
        self, model: nn.Module, data: Split, seed: int, *, epochs: int, steps: int = 0, params=None, loss_fn: LossFn = cross_entropy,
        lr: float | None = None, batch_size: int | None = None,
    ) -> float:  # fmt: skip
        """The one training loop with the run's optimizer settings (``lr``, ``batch_size``: another
        value); the step size decays with the round (``lr-decay``); ``steps`` > 0 instead of ``epochs``."""
        s = self.settings
        return train(
            model,
            data,
            epochs=epochs,
            steps=steps,
            batch_size=batch_size or s.batch_size,
            lr=(lr or s.lr) * self.lr_factor,
            momentum=s.momentum,
            optimizer=s.optimizer,
            weight_decay=s.weight_decay,
            seed=seed,
            params=params,
            loss_fn=loss_fn,
        )

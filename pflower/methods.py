"""Which client method and which server strategy make up each ``method`` of the run config."""

from __future__ import annotations

from pflower.client_app.base import ClientMethod
from pflower.client_app.doublehead import DoubleHeadClient
from pflower.client_app.fedavg_ft import FedAvgFTClient
from pflower.client_app.fedbn import FedBNClient
from pflower.client_app.federico import FedericoClient
from pflower.client_app.fedper import FedPerClient
from pflower.client_app.fedprox import FedProxClient
from pflower.client_app.fedrep import FedRepClient
from pflower.client_app.local import LocalClient
from pflower.client_app.pfedla import PFedLAClient
from pflower.client_app.superfed import SuperFedClient
from pflower.config import Settings
from pflower.models import build_model
from pflower.strategies import FedAvg, FedericoRelay, Local, PFedLA, PflStrategy, SuperFed

METHODS: dict[str, tuple[type[ClientMethod], type[PflStrategy]]] = {
    "fedavg": (ClientMethod, FedAvg),
    "fedavg-ft": (FedAvgFTClient, FedAvg),
    "fedprox": (FedProxClient, FedAvg),
    "local": (LocalClient, Local),
    "fedper": (FedPerClient, FedAvg),
    "fedrep": (FedRepClient, FedAvg),
    "fedbn": (FedBNClient, FedAvg),
    "pfedla": (PFedLAClient, PFedLA),
    "heurpfedla": (PFedLAClient, PFedLA),
    "superfed": (SuperFedClient, SuperFed),
    "doublehead": (DoubleHeadClient, FedAvg),
    "federico": (FedericoClient, FedericoRelay),
}


def client_method(settings: Settings) -> ClientMethod:
    return METHODS[settings.method][0](settings)


def build_strategy(settings: Settings) -> PflStrategy:
    """The method's strategy, with the initial model of ``seed`` and the method's upload keys."""
    model = build_model(settings, settings.image_shape, settings.num_classes, settings.seed)
    client = client_method(settings)
    strategy = METHODS[settings.method][1].from_model(settings, model, client.upload_keys(model))
    strategy.evaluation = {"evaluates": client.EVALUATES, "finetune-epochs": client.finetune_epochs}
    return strategy

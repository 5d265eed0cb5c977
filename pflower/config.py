"""Run configuration: validated once at start-up, typed everywhere after.

The keys of ``[tool.flwr.app.config]`` (kebab-case) are the public interface; this module
maps them onto :class:`Settings` and turns every problem into one :class:`ConfigError` that
names the key, the value and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Method = Literal["fedavg", "fedavg-ft", "fedprox", "local", "fedper", "fedrep", "fedbn", "pfedla", "heurpfedla", "superfed", "doublehead", "federico"]
Dataset = Literal["digits", "mnist", "fashion-mnist", "emnist", "cifar10", "cifar100"]
Partition = Literal["iid", "dirichlet", "pathological", "dominant", "label-groups"]
ModelName = Literal["auto", "cnn", "cnn-bn", "mlp"]
Aggregation = Literal["mean", "median", "trimmed-mean"]
LabelNoise = Literal["none", "pair", "symmetric"]
TestMode = Literal["local", "global", "both"]

#: Methods whose server averages the uploaded arrays (where ``aggregation`` applies).
AVERAGING_METHODS = ("fedavg", "fedavg-ft", "fedprox", "fedper", "fedrep", "fedbn", "superfed", "doublehead")

#: Methods that can share their layers gradually (``gradual-interval``).
GRADUAL_METHODS = ("fedavg", "fedavg-ft", "fedprox", "fedper", "fedrep", "fedbn", "doublehead")

#: Methods whose evaluated predictor is one network that local epochs can fine-tune
#: (``finetune-epochs``); SuPerFed evaluates a line of models, FedeRiCo a mixture of models.
FINETUNE_METHODS = ("fedavg", "fedprox", "local", "fedper", "fedrep", "fedbn", "pfedla", "heurpfedla", "doublehead")

#: Image shape (channels, height, width) and number of classes of each data source
#: (EMNIST: the 'balanced' split). The server builds its model from these without data.
DATASET_INFO: dict[str, tuple[tuple[int, int, int], int]] = {
    "digits": ((1, 8, 8), 10),
    "mnist": ((1, 28, 28), 10),
    "fashion-mnist": ((1, 28, 28), 10),
    "emnist": ((1, 28, 28), 47),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
}


class ConfigError(ValueError):
    """A run-config value that is not allowed; the message names key, value and rule."""

    def __init__(self, problems: list[tuple[str, Any, str]]):
        self.problems = problems
        lines = [f"run config key '{k}' = {v!r} is not allowed: {why}" for k, v, why in problems]
        super().__init__("; ".join(lines))


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class Settings(BaseModel):
    """Every run-config key, typed and range-checked."""

    model_config = ConfigDict(
        alias_generator=_kebab, populate_by_name=True, extra="forbid", frozen=True, strict=True
    )

    method: Method = "pfedla"
    dataset: Dataset = "digits"
    data_dir: str = ""
    download: bool = False
    model: ModelName = "auto"
    partition: Partition = "pathological"
    classes_per_client: int = Field(4, ge=1)
    dirichlet_alpha: float = Field(0.5, gt=0)
    dominant_classes: int = Field(2, ge=1)
    dominant_fraction: float = Field(0.8, gt=0, lt=1)
    label_groups: int = Field(2, ge=1)
    samples_per_client: int = Field(0, ge=0)
    test_fraction: float = Field(0.3, gt=0, lt=1)
    label_noise: LabelNoise = "none"
    label_noise_ratio: float = Field(0.0, ge=0, lt=1)
    test_mode: TestMode = "local"
    finetune_epochs: int = Field(0, ge=0)
    num_server_rounds: int = Field(20, ge=1)
    fraction_train: float = Field(1.0, gt=0, le=1)
    local_epochs: int = Field(5, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.1, gt=0)
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    seed: int = Field(0, ge=0)
    results_dir: str = "results"
    resume_from: str = ""
    state_dir: str = ""
    round_timeout: float = Field(600.0, gt=0)
    min_replies: int = Field(1, ge=1)
    max_update_norm: float = Field(0.0, ge=0)
    max_examples_factor: float = Field(2.0, ge=1)
    aggregation: Aggregation = "mean"
    trim_fraction: float = Field(0.2, ge=0, lt=0.5)
    client_threads: int = Field(1, ge=1)
    proximal_mu: float = Field(0.01, ge=0)
    fedrep_body_epochs: int = Field(1, ge=1)
    hn_lr: float = Field(0.05, ge=0)
    hn_embedding_dim: int = Field(100, ge=1)
    hn_hidden_dim: int = Field(100, ge=1)
    hn_key_dim: int = Field(100, ge=1)
    top_k: int = Field(1, ge=0)
    superfed_mixing: Literal["model", "layer"] = "model"
    superfed_mu: float = Field(0.01, ge=0)
    superfed_nu: float = Field(1.0, ge=0)
    superfed_start: float = Field(0.4, ge=0, le=1)
    gradual_interval: int = Field(0, ge=0)
    overlay_view_size: int = Field(4, ge=1)
    federico_neighbours: int = Field(3, ge=1)
    federico_epsilon: float = Field(0.3, ge=0, le=1)
    federico_momentum: float = Field(0.5, gt=0, le=1)

    @property
    def num_classes(self) -> int:
        return DATASET_INFO[self.dataset][1]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return DATASET_INFO[self.dataset][0]

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()

    @property
    def results_path(self) -> Path:
        return Path(self.results_dir).expanduser().resolve()

    @property
    def state_paths(self) -> list[Path]:
        """Where clients save their personal state, then where a resumed run's clients left it.

        ``state-dir`` if set; by default ``<results-dir>/client-state``, falling back to
        ``<resume-from>/client-state``.
        """
        if self.state_dir:
            return [Path(self.state_dir).expanduser().resolve()]
        paths = [self.results_path / "client-state"]
        if self.resume_from:
            paths.append(Path(self.resume_from).expanduser().resolve() / "client-state")
        return paths

    def to_run_config(self) -> dict[str, Any]:
        """The settings as run-config keys (what metrics.json records)."""
        return self.model_dump(by_alias=True)


def _check_consistency(s: Settings) -> list[tuple[str, Any, str]]:
    """Rules that involve more than one key or the file system."""
    problems: list[tuple[str, Any, str]] = []
    if s.dataset != "digits":
        if not s.data_dir:
            problems.append(("data-dir", s.data_dir, f"dataset '{s.dataset}' needs a data directory"))
        elif not s.data_path.is_dir() and not (s.download and s.dataset.startswith("cifar")):
            problems.append(("data-dir", s.data_dir, "must be an existing directory"))
    c = s.num_classes
    if s.partition == "pathological" and s.classes_per_client > c:
        problems.append(("classes-per-client", s.classes_per_client, f"must be <= {c} ({s.dataset} classes)"))
    if s.partition == "dominant" and s.dominant_classes >= c:
        problems.append(("dominant-classes", s.dominant_classes, f"must be < {c} ({s.dataset} classes)"))
    if s.partition == "label-groups" and s.label_groups > c:
        problems.append(("label-groups", s.label_groups, f"must be <= {c} ({s.dataset} classes)"))
    if s.samples_per_client and s.partition not in ("pathological", "dominant"):
        problems.append(("samples-per-client", s.samples_per_client, "only for partition 'pathological' or 'dominant' (0: use the whole pool)"))
    if s.partition == "pathological" and 0 < s.samples_per_client < s.classes_per_client:
        problems.append(("samples-per-client", s.samples_per_client, f"must be >= classes-per-client={s.classes_per_client} (or 0)"))
    if s.finetune_epochs and s.method == "fedavg-ft":
        problems.append(("finetune-epochs", s.finetune_epochs, "must be 0 for 'fedavg-ft', which fine-tunes 1 epoch by definition; for another number use method='fedavg'"))
    elif s.finetune_epochs and s.method not in FINETUNE_METHODS:
        problems.append(("finetune-epochs", s.finetune_epochs, f"must be 0 for '{s.method}', whose evaluated predictor is not one network; fine-tuning is for {', '.join(FINETUNE_METHODS)}"))
    if s.aggregation != "mean" and s.method not in AVERAGING_METHODS:
        problems.append(("aggregation", s.aggregation, f"only for the averaging methods {', '.join(AVERAGING_METHODS)}"))
    if s.gradual_interval and s.method not in GRADUAL_METHODS:
        problems.append(("gradual-interval", s.gradual_interval, f"must be 0 for '{s.method}'; gradual sharing is for {', '.join(GRADUAL_METHODS)}"))
    return problems


def load_settings(run_config: dict[str, Any]) -> Settings:
    """Validate a Flower run config; raise one ConfigError listing every bad key."""
    try:
        settings = Settings.model_validate(dict(run_config))
    except ValidationError as err:
        problems = []
        for e in err.errors():
            key = str(e["loc"][0]) if e["loc"] else "?"
            why = e["msg"]
            if e["type"] == "extra_forbidden":
                why = "unknown key"
            problems.append((key, e.get("input"), why))
        raise ConfigError(problems) from None
    problems = _check_consistency(settings)
    if problems:
        raise ConfigError(problems)
    return settings

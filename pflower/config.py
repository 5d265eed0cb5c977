"""Run configuration: validated once at start-up, typed everywhere after.

The keys of ``[tool.flwr.app.config]`` (kebab-case) are the public interface. Keys every method
shares are fields of :class:`Settings`; each method's own keys live under its name
(``[tool.flwr.app.config.pfedla]`` in pyproject.toml, ``pfedla.hn-lr=0.1`` after ``-c``) and
are checked by its declaration's parameters (:mod:`pflower.methods`): ``settings.params``. A
key of another method is refused when it differs from that method's default. Every problem
becomes one :class:`ConfigError` that names the key, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from pflower.methods import MethodParams, declarations
from pflower.methods.declaration import within_float32
from pflower.run_folder import CHECKPOINT, RESULTS, held_run

if TYPE_CHECKING:  # the data modules import torch, which the configuration does not need
    from pflower.datasets.sources import Source

Dataset = Literal["digits", "mnist", "fashion-mnist", "emnist", "cifar10", "cifar100", "imagefolder", "torchvision", "huggingface", "node"]
Partition = Literal["iid", "dirichlet", "pathological", "dominant", "label-groups", "classes", "shards", "linear", "exponential", "sizes", "natural-id"]
TorchvisionName = Literal["MNIST", "FashionMNIST", "KMNIST", "EMNIST", "SVHN", "CIFAR10", "CIFAR100", "USPS"]
EmnistSplit = Literal["byclass", "bymerge", "balanced", "letters", "digits", "mnist"]
FeatureShift = Literal["none", "rotation", "contrast", "noise", "blur", "colour", "mixed"]
ModelName = Literal["auto", "cnn", "cnn-bn", "mlp", "lenet", "lenet-bn", "twocnn", "cnn2", "leaf-cnn", "resnet18", "lstm"]
ResNetNorm = Literal["batch", "group"]
#: The smallest image side a model takes (its valid convolutions and pools leave nothing below;
#: ResNet-18's last stage is 1x1 below 16x16, where BatchNorm cannot train on a minibatch of one).
MODEL_MIN_SIZE = {"lenet": 16, "lenet-bn": 16, "twocnn": 4, "cnn2": 8, "leaf-cnn": 4, "resnet18": 16, "cnn": 4, "cnn-bn": 4, "auto": 4}
Aggregation = Literal["mean", "median", "trimmed-mean"]
LabelNoise = Literal["none", "pair", "symmetric"]
TestMode = Literal["local", "global", "both"]

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

    model_config = ConfigDict(alias_generator=_kebab, populate_by_name=True, extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    method: str = Field("pfedla", description="the method to run, one of the declared methods; its own keys are `<method>.<key>`")
    dataset: Dataset = Field(
        "digits",
        description="`digits` (scikit-learn's embedded 8×8 digits, no files), `mnist`, `fashion-mnist`, `emnist` (balanced split), `cifar10`, `cifar100`, `imagefolder` (any image tree), `torchvision` (a torchvision data set in its own file layout under `data-dir`, named by `torchvision-name`), `huggingface` (a Hugging Face data set saved on disk: `save_to_disk` folder or parquet files), or `node` (every SuperNode brings its own data, named in its node config); nothing is ever downloaded but with `download` for CIFAR",
    )
    data_dir: str = Field(
        "",
        description="folder with the data files (for `torchvision` the root torchvision was given; for `huggingface` also a `.parquet` file); required for every dataset but `digits` and `node`",
    )
    torchvision_name: TorchvisionName = Field(
        "MNIST", description="`torchvision`: which data set, by its torchvision class name; its files are read from `data-dir` in torchvision's layout"
    )
    emnist_split: EmnistSplit = Field("balanced", description="`torchvision` with `torchvision-name='EMNIST'`: torchvision's EMNIST split")
    hf_image_column: str = Field("image", description="`huggingface`: the column holding the images (`datasets.Image` or arrays)")
    hf_label_column: str = Field(
        "label", description="`huggingface`: the column holding the labels (a `ClassLabel` or plain values; with `hf-text-column`, single characters)"
    )
    hf_text_column: str = Field(
        "",
        description="`huggingface`: the column holding text instead of images (strings of one length, e.g. Shakespeare's `x`, 80 characters): each character becomes its index in LEAF's 80-character vocabulary, the label column holds one character of it per row (the next one; 80 classes), and the model is `lstm`. Empty: the data set holds images (`hf-image-column`)",
    )
    download: bool = Field(False, description="let torchvision download CIFAR into `data-dir`")
    image_size: int = Field(
        0, ge=0, le=1024, description="image folders only: resize every image to this square (0: the files' own size, which must then be one size)"
    )
    model: ModelName = Field(
        "auto",
        description="`cnn`, `cnn-bn` (CNN with BatchNorm), `mlp` (the FedAvg paper's 2NN, SuPerFed's MNIST model); the papers' CNNs: `lenet`, `lenet-bn` (pFedHN's, which pFedLA uses, with BatchNorm on CIFAR), `twocnn` (the FedAvg paper's, SuPerFed's CIFAR-10 model), `cnn2` (Shen et al.'s, FedeRiCo's), `leaf-cnn` (LEAF's FEMNIST CNN, the double-head paper's); `resnet18` (ResNet-18 in its CIFAR form: 3×3 stem, no max-pool; images of at least 16×16; normalization by `resnet-norm`); `lstm` (LEAF's stacked LSTM for next-character prediction, SuPerFed's Shakespeare model: text only, `hf-text-column`); `auto` = `cnn` for 1-channel, `cnn-bn` for colour images, `lstm` for text",
    )
    resnet_norm: ResNetNorm = Field(
        "batch",
        description="`resnet18`: its normalization layers, `batch` (BatchNorm, the published network) or `group` (GroupNorm, 2 groups per layer, as federated ResNet-18s run it: Hsieh et al. 2020, Reddi et al. 2021); FedBN keeps either's layers local (GroupNorm's: its affine parameters, it has no statistics)",
    )
    partition: Partition = Field(
        "pathological",
        description="how the pool is shared out: `iid`, `dirichlet` (label shares drawn from a Dirichlet), `pathological` (a few classes per client, equal samples per class), `dominant` (all classes, a few dominant), `label-groups` (disjoint label groups, each client drawing from one), `classes` (the classes `client-classes` lists for each client); flwr-datasets' `shards` (the FedAvg paper's: label-sorted shards, `shards-per-client` each), `linear` and `exponential` (quantity skew: client i gets a share ∝ i + 1 or e^(i + 1)), `sizes` (`client-sizes` samples each), `natural-id` (one value of `natural-id-column` per client, or several)",
    )
    classes_per_client: int = Field(4, ge=1, le=10000, description="`pathological`: classes per client")
    dirichlet_alpha: float = Field(
        0.5,
        gt=0,
        le=1e6,
        description="`dirichlet`: concentration (smaller: more skewed; at 1e6 the shares are IID's: larger ones overflow the draw, use partition='iid')",
    )
    dominant_classes: int = Field(2, ge=1, le=10000, description="`dominant`: dominant classes per client")
    dominant_fraction: float = Field(0.8, gt=0, lt=1, description="`dominant`: share of a client's samples in its dominant classes")
    label_groups: int = Field(2, ge=1, le=10000, description="`label-groups`: number of disjoint label groups")
    group_assignment: Literal["balanced", "random"] = Field(
        "balanced",
        description="`label-groups`: `balanced` puts clients in the groups round-robin over a random order; `random` draws each client's group uniformly (FedeRiCo's protocol: a group may get one client or none, and an empty group's classes are unused)",
    )
    shards_per_client: int = Field(2, ge=1, le=10000, description="`shards`: shards per client (the FedAvg paper: 2 of 300 images)")
    client_sizes: str = Field("", description="`sizes`: each client's number of samples, comma-separated, one per client (e.g. `'100,200,700'`)")
    client_classes: str = Field(
        "",
        description="`classes`: each client's classes, one group per client separated by `;`, class ids separated by `,` (e.g. `'0,1,2;3,4;5'` for 3 clients); exactly one group per client. Each class's samples are shuffled and split evenly (within one) among the clients that list it; a class no client lists is unused",
    )
    natural_id_column: str = Field("", description="`natural-id` (`huggingface` only): the column whose values (writer, user, domain) define the clients")
    natural_id_min_samples: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="`natural-id`: a natural id (writer, speaking role) with fewer samples than this is dropped, its samples unused (LEAF's `-k`); counted in the `data-fraction` subset. 0: none is dropped",
    )
    natural_id_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="`natural-id`: keep this share of the natural ids left by `natural-id-min-samples`, round(fraction × ids) of them (at least 1), drawn at random by the data seed; the others' samples are unused (LEAF's sampling of writers and roles; LEAF's `--sf` is a share of samples, reached by drawing users). The kept ids are shared out among the clients, one each when they are as many. 1: every id",
    )
    feature_shift: FeatureShift = Field(
        "none",
        description="feature shift: each client's data (train and test) transformed once by its own domain, a seeded transformation: `rotation`, `contrast`, `noise`, `blur`, `colour` (one kind, its strength spread over the clients), `mixed` (the five kinds, one per client in turn, each at full strength); `none` changes nothing",
    )
    samples_per_client: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="`pathological`, `dominant`, `label-groups`, `classes`: every client's number of samples (before its train/test split), equal per class, the same for any number of clients (the pFedLA paper's protocol); refused with the most the pool can give when it is too large. 0: the whole pool (or the label group's share) is shared out, so clients shrink as N grows",
    )
    data_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="use only this share of the pool, under any partition: a seeded subset drawn before partitioning, stratified by class (each class keeps round(fraction × its samples), at least 1, so class proportions are kept). The pool holds every split of the files, so FedeRiCo's 10 % of CIFAR-10's 50,000 training images is 0.0833 of its 60,000 (our reading: the paper's count). The clients' test splits and the global test set come from the subset too. With `samples-per-client` the subset is drawn first and each client's samples are then taken from it (refused when the subset cannot give them). 1: the whole pool",
    )
    test_fraction: float = Field(0.3, gt=0, lt=1, description="share of each client's data held out as its test split")
    label_noise: LabelNoise = Field(
        "none",
        description="flip `label-noise-ratio` of each client's *training* labels: `pair` (class c → c+1) or `symmetric` (to a random other class); `none` flips nothing",
    )
    label_noise_ratio: float = Field(0.0, ge=0, lt=1, description="share of each client's training labels that `label-noise` flips")
    test_mode: TestMode = Field(
        "local",
        description="where clients evaluate: `local` (each its own test split), `global` (the shared test set, the union of all clients' test splits), `both` (local as `accuracy`, global as `global-accuracy`)",
    )
    finetune_epochs: int = Field(
        0,
        ge=0,
        le=1000,
        description="local epochs each client trains the model it is about to evaluate on its training split (never kept); 0 evaluates it as received. For the methods whose prediction is one network; `fedavg-ft` always fine-tunes 1 epoch",
    )
    num_server_rounds: int = Field(20, ge=1, le=100_000, description="rounds")
    fraction_train: float = Field(1.0, gt=0, le=1, description="share of clients sampled for training each round")
    fraction_evaluate: float = Field(
        1.0,
        gt=0,
        le=1,
        description="share of clients sampled for evaluation in a round that evaluates (by seed and round, apart from training's sample); every client evaluates in the last round",
    )
    evaluate_every: int = Field(
        1, ge=1, le=100_000, description="evaluate every this many rounds (and always the last); metrics.json's other rows have `evaluated: 0` and no accuracy"
    )
    single_message: bool = Field(
        True,
        description="one message per client per round: a round's evaluation rides on the next round's training message (the client evaluates first), the last round's goes alone; the same metrics as `false`, which sends every evaluation as a phase of its own",
    )
    local_epochs: int = Field(5, ge=1, le=1000, description="local epochs per round (with `local-steps` = 0)")
    local_steps: int = Field(
        0,
        ge=0,
        le=100_000,
        description="> 0: each round's local training is exactly this many minibatch steps instead of `local-epochs` epochs, cycling over the client's training data (a new random order each pass, the last batch of a pass possibly smaller), e.g. the double-head paper's 2 steps per round; a step is one minibatch of the training loop (Per-FedAvg: one MAML step of its 2 or 3 batches; pFedMe: one outer step with its `pfedme.k` inner steps; FedEM: this many steps for each of its `fedem.components` components). It replaces `local-epochs` only: `finetune-epochs`, `ditto.personal-epochs` and `fedrep.body-epochs` stay epochs (FedRep: `local-steps` head steps, then the body epochs). 0: `local-epochs`",
    )
    batch_size: int = Field(32, ge=1, le=65536, description="minibatch size")
    lr: float = Field(0.1, gt=0, description="step size of the clients' local optimizer")
    optimizer: Literal["sgd", "adam"] = Field(
        "sgd", description="clients' local optimizer (a fresh one per local training, so no optimizer state is kept between rounds)"
    )
    momentum: float = Field(0.0, ge=0, lt=1, description="momentum of the clients' optimizer (SGD only)")
    weight_decay: float = Field(0.0, ge=0, description="weight decay of the clients' optimizer")
    lr_decay: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="the step size of round r is `lr` × (1 − `lr-decay`)^(r − 1), for every method's local training, fine-tuning included (not Per-FedAvg's one-step adaptation before evaluation); SuPerFed's protocol uses 0.01",
    )
    seed: int = Field(
        0,
        ge=0,
        le=2**31 - 1,
        description="seeds the initial model, client sampling and every client's minibatch order, and the data (see `data-seed`) unless `data-seed` is set",
    )
    data_seed: int = Field(
        -1,
        ge=-1,
        le=2**31 - 1,
        description="seeds the data apart from training: the `data-fraction` subset, the partition, each client's train/test split and its validation hold-out (SuPerFed's, FedFomo's), label noise and feature-shift domains (a node's own test split with `dataset='node'`); `seed` still drives the initial model, sampling and training. So FedeRiCo's 5 splits × 3 training seeds are 5 values here × 3 of `seed`. -1: the same as `seed`",
    )
    results_dir: str = Field(
        "",
        description="output folder: metrics.json, figures, checkpoint (relative paths resolve against the SuperLink's working directory); "
        "empty: a folder of the run's own, `results/<start time>-<method>`, named in the log at the start (clients keep their state in `results/client-state`)",
    )
    resume_from: str = Field("", description="a results-dir to continue: its `checkpoint.pt` is loaded and the run goes on after its last round")
    overwrite: bool = Field(
        False,
        description="start in a results-dir that holds another run (its `metrics.json` or `checkpoint.pt`), removing that run's files; false: such a run is refused before it starts",
    )
    state_dir: str = Field(
        "", description="where clients save their personal state; empty: `<results-dir>/client-state`. A SuperNode's node config `state-dir` overrides it"
    )
    round_timeout: float = Field(600.0, gt=0, description="seconds to wait for the replies of one phase")
    min_replies: int = Field(1, ge=1, le=100_000, description="a round with fewer valid training replies stops the run, naming each client's problem")
    max_update_norm: float = Field(
        0.0, ge=0, description="reject a training reply whose update (uploaded − what the client started from) has a larger L2 norm; 0: no bound"
    )
    max_examples_factor: float = Field(
        2.0,
        ge=1,
        description="reject a reply whose `num-examples` exceeds this × what the client reported before (training: when it joined; evaluation: its first report)",
    )
    aggregation: Aggregation = Field(
        "mean",
        description="the averaging methods only: `mean` (sample-weighted), `median`, `trimmed-mean` (coordinate-wise, unweighted; Flower's implementations)",
    )
    trim_fraction: float = Field(0.2, ge=0, lt=0.5, description="`trimmed-mean`: share cut at each end")
    client_threads: int = Field(
        1,
        ge=1,
        le=1024,
        description="torch threads per ClientApp process; fixed rather than inherited because results depend on it (one core per simulated client)",
    )
    server_threads: int = Field(
        1,
        ge=1,
        le=1024,
        description="torch threads of the ServerApp process (aggregation, checks, hypernetworks); fixed rather than inherited: more threads than free cores make its small tensor ops wait on each other while the clients train",
    )
    simulated_clients: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="simulation only: the clients the simulated SuperNodes serve between them, several to a node (node `g` of `G` serves clients `g`, `g + G`, `g + 2G`, ...; one message carries what a phase has for a node's clients, and the reply splits back into theirs); the same numbers as one client per node. 0: one client per node. `pflower-sim --clients-per-node` sets it",
    )
    gradual_interval: int = Field(
        0,
        ge=0,
        le=100_000,
        description="gradual sharing: rounds per released layer, shallow to deep (0: off); for the methods whose declaration allows it",
    )
    tensorboard: bool = Field(
        False, description="write TensorBoard event files into `<results-dir>/tensorboard` (the ServerApp; needs the `tensorboard` extra)"
    )
    mlflow: bool = Field(False, description="log the run to MLflow (the ServerApp; needs the `mlflow` extra): parameters, per-round metrics, figures")
    mlflow_tracking_uri: str = Field(
        "", description="`mlflow`: where the runs go; empty: a local SQLite store, `sqlite:///<results-dir>/mlflow.db` (no server)"
    )
    mlflow_experiment: str = Field("pflower", min_length=1, description="`mlflow`: the experiment the run is logged under")
    #: The method's own keys (``<method>.<key>``), an instance of its declaration's ``params``.
    params: SerializeAsAny[MethodParams] = MethodParams()

    @model_validator(mode="before")
    @classmethod
    def _method_defaults(cls, data: Any) -> Any:
        """Without ``params``, the method's own keys take their defaults."""
        if isinstance(data, dict) and "params" not in data:
            method = data.get("method", "pfedla")
            if isinstance(method, str) and method in declarations():
                data = {**data, "params": declarations()[method].params()}
        return data

    @field_validator("*")
    @classmethod
    def _within_float32(cls, v: Any) -> Any:
        return within_float32(v)

    @field_validator("results_dir")
    @classmethod
    def _a_folder(cls, v: str) -> str:
        if v and not v.strip():
            raise ValueError("must name a folder ('.' for the current one), or be empty for a folder of the run's own under results/")
        return v

    @field_validator("method")
    @classmethod
    def _declared(cls, v: str) -> str:
        if v not in declarations():
            raise ValueError(f"must be one of {', '.join(repr(n) for n in declarations())}")
        return v

    @model_validator(mode="after")
    def _params_of_the_method(self) -> Settings:
        want = declarations()[self.method].params
        if type(self.params) is not want:
            raise ValueError(f"params must be {want.__name__} for method '{self.method}', not {type(self.params).__name__}")
        return self

    @property
    def reads_folder(self) -> bool:
        """Whether the data is an image tree (``imagefolder``, or CIFAR given as one)."""
        from pflower.datasets.folder import is_image_folder

        return self.dataset == "imagefolder" or (self.dataset.startswith("cifar") and bool(self.data_dir) and is_image_folder(self.data_path))

    @property
    def node_data(self) -> bool:
        """Every SuperNode brings its own data (``dataset='node'``): shape and classes come from them."""
        return self.dataset == "node"

    @property
    def num_classes(self) -> int:
        """The data set's, from a table; an image tree's folders; a Hugging Face set's label column."""
        if self.node_data:
            raise ValueError("dataset='node': the classes are the nodes' (the ServerApp asks them)")
        if self.dataset == "imagefolder":
            return _folder_shape(str(self.data_path), self.image_size)[1]
        if self.dataset == "torchvision":
            return _torchvision_info(self.torchvision_name, self.emnist_split)[1]
        if self.dataset == "huggingface":
            return len(_hf_info(str(self.data_path), self.hf_image_column, self.hf_label_column, self.hf_text_column).classes)
        return DATASET_INFO[self.dataset][1]

    @property
    def image_shape(self) -> tuple[int, ...]:
        """(channels, height, width): the data set's, an image tree's first image's (resized to
        ``image-size`` if set), a Hugging Face set's first image's; (length,) for text."""
        if self.node_data:
            raise ValueError("dataset='node': the image shape is the nodes' (the ServerApp asks them)")
        if self.reads_folder:
            return _folder_shape(str(self.data_path), self.image_size)[0]
        if self.dataset == "torchvision":
            return _torchvision_info(self.torchvision_name, self.emnist_split)[0]
        if self.dataset == "huggingface":
            return _hf_info(str(self.data_path), self.hf_image_column, self.hf_label_column, self.hf_text_column).shape
        return DATASET_INFO[self.dataset][0]

    @property
    def source(self) -> Source:
        """The keys that name the data (what a process caches its pool by)."""
        from pflower.datasets.sources import Source

        return Source(
            self.dataset, str(self.data_path) if self.data_dir else "", self.download, self.image_size, self.torchvision_name, self.emnist_split,
            self.hf_image_column, self.hf_label_column, self.natural_id_column if self.partition == "natural-id" else "", self.hf_text_column,
        )  # fmt: skip

    @property
    def text(self) -> bool:
        """The inputs are text (``hf-text-column``): character indices, not images."""
        return self.dataset == "huggingface" and bool(self.hf_text_column)

    @property
    def split_seed(self) -> int:
        """The seed of everything about the data (``data-seed``; -1: ``seed``): the pool subset,
        the partition, the train/test splits and hold-outs, label noise, feature-shift domains."""
        return self.seed if self.data_seed < 0 else self.data_seed

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()

    @property
    def results_path(self) -> Path:
        """The results-dir; with none given, the folder under which each run gets its own (:data:`RESULTS`)."""
        return Path(self.results_dir or RESULTS).expanduser().resolve()

    @property
    def continues_in_place(self) -> bool:
        """The run resumes the run in its own results-dir (and writes on in that folder)."""
        return bool(self.resume_from) and bool(self.results_dir) and Path(self.resume_from).expanduser().resolve() == self.results_path

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
        """The settings as run-config keys (what metrics.json records): the shared keys and the
        method's own, ``<method>.<key>``."""
        own = {f"{self.method}.{k}": v for k, v in self.params.model_dump(by_alias=True).items()}
        return {**self.model_dump(by_alias=True, exclude={"params"}), **own}


def size_text(n: int) -> str:
    """``n`` bytes in GiB or MiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def machine_memory() -> int:
    """Bytes of physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _pool_bytes(s: Settings) -> int:
    """Memory an image folder takes decoded at ``image-size`` in one process: its uint8 cache and
    the float32 pool (5 bytes a value), for every file of the tree."""
    from pflower.datasets.folder import index_folder

    c, h, w = s.image_shape
    return len(index_folder(s.data_path).files) * c * h * w * 5


@lru_cache(maxsize=8)
def _folder_shape(root: str, image_size: int) -> tuple[tuple[int, int, int], int]:
    from pflower.datasets.folder import folder_shape

    return folder_shape(Path(root), image_size)


def _torchvision_info(name: str, emnist_split: str) -> tuple[tuple[int, int, int], int]:
    from pflower.datasets.torchvision_files import info

    return info(name, emnist_split)


def _hf_info(path: str, image: str, label: str, text: str):
    from pflower.datasets.huggingface import hf_info

    return hf_info(path, image, label, text)


def _check_consistency(s: Settings) -> list[tuple[str, Any, str]]:
    """Rules that involve more than one key, the method's declaration or the file system."""
    problems: list[tuple[str, Any, str]] = []
    method = declarations()[s.method]
    if getattr(s.params, "head", "last") == "classifier" and s.model == "mlp":
        problems.append((f"{s.method}.head", "classifier", "needs a model with a convolutional part; model 'mlp' is fully connected throughout"))
    if s.node_data:
        if s.test_mode != "local":
            problems.append(("test-mode", s.test_mode, "must be 'local' with dataset='node': each node has only its own test data, no shared test set"))
        if s.image_size:
            problems.append(("image-size", s.image_size, "with dataset='node' a node's config says its image-size"))
        if s.feature_shift != "none":
            problems.append(("feature-shift", s.feature_shift, "must be 'none' with dataset='node': each node's own data is its domain"))
    elif s.dataset != "digits":
        if not s.data_dir:
            problems.append(("data-dir", s.data_dir, f"dataset '{s.dataset}' needs a data directory"))
        elif s.dataset == "huggingface":
            problems += _huggingface_problems(s)
        elif not s.data_path.is_dir() and not (s.download and s.dataset.startswith("cifar")):
            problems.append(("data-dir", s.data_dir, "must be an existing directory"))
        elif s.reads_folder:
            from pflower.datasets.folder import FolderError

            try:
                _folder_shape(str(s.data_path), s.image_size)  # indexed, and the first image decoded (the shape the model is built for)
            except FolderError as err:
                problems.append(("data-dir", s.data_dir, str(err)))
        elif s.dataset == "torchvision":
            from pflower.datasets.torchvision_files import LayoutError, found

            try:
                found(s.data_path, s.torchvision_name, s.emnist_split)
            except LayoutError as err:
                problems.append(("data-dir", s.data_dir, str(err)))
    problems += _scope_problems(s)
    if problems or s.node_data:  # the data set's classes may be unknown
        return problems
    c = s.num_classes
    if s.partition == "pathological" and s.classes_per_client > c:
        problems.append(("classes-per-client", s.classes_per_client, f"must be <= {c} ({s.dataset} classes)"))
    if s.partition == "dominant" and s.dominant_classes >= c:
        problems.append(("dominant-classes", s.dominant_classes, f"must be < {c} ({s.dataset} classes)"))
    if s.partition == "label-groups" and s.label_groups > c:
        problems.append(("label-groups", s.label_groups, f"must be <= {c} ({s.dataset} classes)"))
    if s.group_assignment != "balanced" and s.partition != "label-groups":
        problems.append(("group-assignment", s.group_assignment, "only for partition 'label-groups'"))
    if s.text:
        problems += _text_problems(s)
    elif s.model == "lstm":
        problems.append(("model", s.model, "reads text: dataset 'huggingface' with hf-text-column (the images here need an image model)"))
    elif (side := min(s.image_shape[1:])) < MODEL_MIN_SIZE.get(s.model, 0):
        problems.append(("model", s.model, f"needs images of at least {MODEL_MIN_SIZE[s.model]}x{MODEL_MIN_SIZE[s.model]} ({s.dataset}'s are {side}x{side})"))
    if s.state_dir and (state := Path(s.state_dir).expanduser()).exists() and not state.is_dir():
        problems.append(("state-dir", s.state_dir, "is a file; name a folder (it is created if missing)"))
    if s.image_size and not s.reads_folder and not s.node_data:
        problems.append(("image-size", s.image_size, "only for image folders (dataset 'imagefolder', or CIFAR given as a folder tree)"))
    elif s.image_size and s.reads_folder and (need := _pool_bytes(s)) > (have := machine_memory()):
        problems.append(
            (
                "image-size",
                s.image_size,
                f"{size_text(need)} to hold the decoded images at this size, the machine has {size_text(have)}; choose a smaller image-size",
            )
        )
    if s.samples_per_client and s.partition not in ("pathological", "dominant", "label-groups", "classes"):
        problems.append(
            ("samples-per-client", s.samples_per_client, "only for partition 'pathological', 'dominant', 'label-groups' or 'classes' (0: use the whole pool)")
        )
    if s.partition == "pathological" and 0 < s.samples_per_client < s.classes_per_client:
        problems.append(("samples-per-client", s.samples_per_client, f"must be >= classes-per-client={s.classes_per_client} (or 0)"))
    if s.partition == "classes" and s.client_classes:
        from pflower.datasets.partition import parse_class_groups

        groups = parse_class_groups(s.client_classes)  # its form was checked with the scoped keys
        if beyond := sorted({k for g in groups for k in g if k >= c}):
            problems.append(("client-classes", s.client_classes, f"class {beyond[0]} is not a class of {s.dataset}: its class ids are 0-{c - 1}"))
        if 0 < s.samples_per_client < (most := max(len(g) for g in groups)):
            problems.append(("samples-per-client", s.samples_per_client, f"must be >= {most}, the most classes a client lists in client-classes (or 0)"))
    if s.finetune_epochs and method.no_finetune:
        problems.append(("finetune-epochs", s.finetune_epochs, f"must be 0 for '{s.method}': {method.no_finetune}"))
    averaging = [n for n, m in declarations().items() if m.averages]
    if s.aggregation != "mean" and not method.averages:
        problems.append(("aggregation", s.aggregation, f"only for the averaging methods {', '.join(averaging)}"))
    gradual = [n for n, m in declarations().items() if m.gradual]
    if s.gradual_interval and not method.gradual:
        problems.append(("gradual-interval", s.gradual_interval, f"must be 0 for '{s.method}'; gradual sharing is for {', '.join(gradual)}"))
    return problems


def _text_problems(s: Settings) -> list[tuple[str, Any, str]]:
    """Keys a text data set cannot honour: an image model, feature shift."""
    problems: list[tuple[str, Any, str]] = []
    if s.model not in ("auto", "lstm"):
        problems.append(("model", s.model, "is an image model; text (hf-text-column) needs 'lstm' (or 'auto')"))
    if s.feature_shift != "none":
        problems.append(("feature-shift", s.feature_shift, "must be 'none' for text (hf-text-column): its transformations are of images"))
    return problems


def _huggingface_problems(s: Settings) -> list[tuple[str, Any, str]]:
    """A Hugging Face data set that is not there, or lacks a column the keys name."""
    from pflower.datasets.huggingface import check_id_column, hf_info, layout_problem, open_dataset
    from pflower.datasets.sources import DataError

    if problem := layout_problem(s.data_path):
        return [("data-dir", s.data_dir, problem)]
    try:
        ds = open_dataset(str(s.data_path))
    except DataError as err:
        return [("data-dir", s.data_dir, str(err))]
    inputs = ("hf-text-column", s.hf_text_column) if s.text else ("hf-image-column", s.hf_image_column)
    keys = {inputs[0]: inputs[1], "hf-label-column": s.hf_label_column}
    if s.partition == "natural-id" and s.natural_id_column:
        keys["natural-id-column"] = s.natural_id_column
    if missing := [(k, v, f"the data set has no column {v!r}; its columns: {', '.join(ds.column_names)}") for k, v in keys.items() if v not in ds.column_names]:
        return missing
    try:
        if "natural-id-column" in keys:
            check_id_column(ds, s.natural_id_column, inputs[1], s.hf_label_column, "text" if s.text else "image")
        hf_info(str(s.data_path), s.hf_image_column, s.hf_label_column, s.hf_text_column)
    except DataError as err:  # named for the column it is about
        key = next((k for k, v in keys.items() if str(err).startswith((f"column {v!r}", f"{k}="))), "data-dir")
        return [(key, keys.get(key, s.data_dir), str(err))]
    return []


#: Keys that mean something only with a dataset or partition: (key, field, when, what it needs).
SCOPED_KEYS = (
    ("torchvision-name", "torchvision_name", lambda s: s.dataset == "torchvision", "dataset 'torchvision'"),
    (
        "emnist-split",
        "emnist_split",
        lambda s: s.dataset == "torchvision" and s.torchvision_name == "EMNIST",
        "dataset 'torchvision' with torchvision-name 'EMNIST'",
    ),
    ("hf-image-column", "hf_image_column", lambda s: s.dataset == "huggingface", "dataset 'huggingface'"),
    ("hf-label-column", "hf_label_column", lambda s: s.dataset == "huggingface", "dataset 'huggingface'"),
    ("hf-text-column", "hf_text_column", lambda s: s.dataset == "huggingface", "dataset 'huggingface'"),
    ("shards-per-client", "shards_per_client", lambda s: s.partition == "shards", "partition 'shards'"),
    ("dirichlet-alpha", "dirichlet_alpha", lambda s: s.partition == "dirichlet", "partition 'dirichlet'"),
    ("classes-per-client", "classes_per_client", lambda s: s.partition == "pathological", "partition 'pathological'"),
    ("dominant-classes", "dominant_classes", lambda s: s.partition == "dominant", "partition 'dominant'"),
    ("dominant-fraction", "dominant_fraction", lambda s: s.partition == "dominant", "partition 'dominant'"),
    ("label-groups", "label_groups", lambda s: s.partition == "label-groups", "partition 'label-groups'"),
    ("label-noise-ratio", "label_noise_ratio", lambda s: s.label_noise != "none", "label-noise other than 'none'"),
    ("trim-fraction", "trim_fraction", lambda s: s.aggregation == "trimmed-mean", "aggregation 'trimmed-mean'"),
    ("momentum", "momentum", lambda s: s.optimizer == "sgd", "optimizer 'sgd'"),
    ("resnet-norm", "resnet_norm", lambda s: s.model == "resnet18", "model 'resnet18'"),
    ("download", "download", lambda s: s.dataset in ("cifar10", "cifar100"), "dataset 'cifar10' or 'cifar100'"),
    ("client-sizes", "client_sizes", lambda s: s.partition == "sizes", "partition 'sizes'"),
    ("client-classes", "client_classes", lambda s: s.partition == "classes", "partition 'classes'"),
    ("data-fraction", "data_fraction", lambda s: not s.node_data, "a pool the run shares out (not dataset 'node', whose nodes bring their own data)"),
    ("local-epochs", "local_epochs", lambda s: s.local_steps == 0, "local-steps=0 (local-steps > 0 sets each round's training in steps instead)"),
    ("natural-id-column", "natural_id_column", lambda s: s.partition == "natural-id", "partition 'natural-id'"),
    ("natural-id-min-samples", "natural_id_min_samples", lambda s: s.partition == "natural-id", "partition 'natural-id'"),
    ("natural-id-fraction", "natural_id_fraction", lambda s: s.partition == "natural-id", "partition 'natural-id'"),
    ("simulated-clients", "simulated_clients", lambda s: not s.node_data, "a pool the run shares out (not dataset 'node', whose nodes bring their own data)"),
    ("mlflow-tracking-uri", "mlflow_tracking_uri", lambda s: s.mlflow, "mlflow=true"),
    ("mlflow-experiment", "mlflow_experiment", lambda s: s.mlflow, "mlflow=true"),
)


def _scope_problems(s: Settings) -> list[tuple[str, Any, str]]:
    """A key set (away from its default) where it does nothing, and a partition's missing key."""
    problems = [(key, getattr(s, name), f"only for {needs}") for key, name, applies, needs in SCOPED_KEYS
                if getattr(s, name) != Settings.model_fields[name].default and not applies(s)]  # fmt: skip
    if s.text and s.hf_image_column != Settings.model_fields["hf_image_column"].default:
        problems.append(("hf-image-column", s.hf_image_column, "only for images; with hf-text-column the data set's input is its text column"))
    if s.partition == "natural-id":
        if s.dataset != "huggingface":
            problems.append(("partition", s.partition, "'natural-id' needs a data set with an id column: dataset 'huggingface' with natural-id-column"))
        elif not s.natural_id_column:
            problems.append(
                ("natural-id-column", s.natural_id_column, "partition 'natural-id' needs the column that names each sample's writer, user or domain")
            )
    if s.partition == "classes":
        from pflower.datasets.partition import parse_class_groups

        try:
            parse_class_groups(s.client_classes)
        except ValueError as err:
            problems.append(("client-classes", s.client_classes, str(err)))
    if s.partition == "sizes":
        from pflower.datasets.partition import parse_sizes

        try:
            parse_sizes(s.client_sizes)
        except ValueError as err:
            problems.append(("client-sizes", s.client_sizes, str(err)))
    return problems


def check_server(s: Settings) -> None:
    """ConfigError unless the ServerApp can run here: ``results-dir`` can be created and written,
    and the trackers turned on are installed (clients need neither). Nothing is left behind: the
    folder is not created (a probe folder is made in it, or in its nearest existing parent, and
    removed), so a check that refuses, or ``pflower-check`` itself, writes nothing."""
    import tempfile

    from pflower.tracking import missing_extras

    if problems := missing_extras(s.to_run_config()):
        raise ConfigError(problems)
    existing = s.results_path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is not a directory")
        Path(tempfile.mkdtemp(prefix=".pflower-write-test-", dir=existing)).rmdir()
    except OSError as err:
        raise ConfigError([("results-dir", s.results_dir, f"must be a directory the server can write ({err.strerror or err})")]) from None
    check_held(s)


def check_held(s: Settings) -> None:
    """ConfigError if ``results-dir`` holds another run and the settings neither continue nor
    replace it; a run without one gets a new folder (nothing to check)."""
    if not s.results_dir:
        return
    path = s.results_path
    if (held := held_run(path)) and not s.overwrite and not s.continues_in_place:
        go_on = f"continue that run with resume-from='{s.results_dir}', or " if CHECKPOINT in held else ""
        raise ConfigError([("results-dir", s.results_dir, f"{path} holds another run ({', '.join(held)}): choose another results-dir, "
                            f"{go_on}replace it with overwrite=true")])  # fmt: skip


def known_keys() -> list[str]:
    """Every run-config key: the shared ones and ``<method>.<key>`` of every method."""
    shared = [f.alias or n for n, f in Settings.model_fields.items() if n != "params"]
    own = [f"{name}.{f.alias or k}" for name, m in declarations().items() for k, f in m.params.model_fields.items()]
    return shared + own


def _unknown(key: str) -> str:
    """'unknown key', with the closest known key (a shared key, or a method's under its name)."""
    known = known_keys()
    match = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not match:  # a method's key given without its method: 'top-k' for 'heurpfedla.top-k'
        tails = {k.partition(".")[2]: k for k in known if "." in k}
        hit = difflib.get_close_matches(key.partition(".")[2] or key, list(tails), n=1, cutoff=0.8)
        match = [tails[hit[0]]] if hit else []
    return f"unknown key; did you mean '{match[0]}'?" if match else "unknown key"


def _validation_problems(err: ValidationError, prefix: str = "") -> list[tuple[str, Any, str]]:
    problems = []
    for e in err.errors():
        key = prefix + (str(e["loc"][0]) if e["loc"] else "?")
        why = _unknown(key) if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        problems.append((key, e.get("input"), why))
    return problems


def load_settings(run_config: dict[str, Any]) -> Settings:
    """Validate a Flower run config; raise one ConfigError listing every bad key.

    Keys ``<method>.<key>`` go to that method's parameters: the chosen method's are validated,
    another method's are refused where they differ from its default (they would do nothing).
    """
    shared: dict[str, Any] = {}
    spaced: dict[str, dict[str, Any]] = {}
    for key, value in run_config.items():
        space, dot, sub = key.partition(".")
        if dot:
            spaced.setdefault(space, {})[sub] = value
        else:
            shared[key] = value
    problems: list[tuple[str, Any, str]] = []
    methods = declarations()
    for space, keys in spaced.items():
        if space not in methods:
            problems += [(f"{space}.{k}", v, f"no method '{space}' (methods: {', '.join(methods)})") for k, v in keys.items()]
    method = shared.get("method", "pfedla")
    params = None
    for space, keys in spaced.items():
        if space not in methods:
            continue
        model = methods[space].params
        if space == method:
            try:
                params = model.model_validate(keys)
            except ValidationError as err:
                problems += _validation_problems(err, f"{space}.")
            continue
        defaults = model().model_dump(by_alias=True)
        for k, v in keys.items():
            if k not in defaults:
                problems.append((f"{space}.{k}", v, _unknown(f"{space}.{k}")))
            elif v != defaults[k]:
                problems.append((f"{space}.{k}", v, f"belongs to method '{space}', but method is '{method}'"))
    try:
        settings = Settings.model_validate({**shared, **({"params": params} if params is not None else {})})
    except ValidationError as err:
        raise ConfigError(problems + _validation_problems(err)) from None
    problems += _check_consistency(settings)
    if problems:
        raise ConfigError(problems)
    return settings

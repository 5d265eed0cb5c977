"""Run-config validation: pyproject defaults are valid, every error names key, value and rule."""

import pytest

from conftest import DEFAULTS, MNIST_DIR, run_config
from pflower.config import ConfigError, Settings, load_settings


def test_pyproject_defaults_are_the_model_defaults():
    assert load_settings(DEFAULTS).to_run_config() == Settings().to_run_config()
    assert set(DEFAULTS) == set(Settings().to_run_config())


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("method", "fedsomething", "'fedavg'"),
        ("optimizer", "rmsprop", "'sgd' or 'adam'"),
        ("test-mode", "everywhere", "'local', 'global' or 'both'"),
        ("gradual-interval", -1, "greater than or equal to 0"),
        ("federico-epsilon", 1.5, "less than or equal to 1"),
        ("lr", -0.1, "greater than 0"),
        ("fraction-train", 0.0, "greater than 0"),
        ("fraction-train", 1.5, "less than or equal to 1"),
        ("partition", "random", "'iid'"),
        ("dataset", "imagenet", "'digits'"),
        ("test-fraction", 1.0, "less than 1"),
        ("num-server-rounds", 0, "greater than or equal to 1"),
        ("batch-size", "32", "valid integer"),
        ("lr", "0.1", "valid number"),
        ("download", 1, "valid boolean"),
    ],
)
def test_bad_value_names_key_value_and_rule(key, value, fragment):
    with pytest.raises(ConfigError) as err:
        load_settings(run_config(**{key.replace("-", "_"): value}))
    msg = str(err.value)
    assert f"'{key}'" in msg and repr(value) in msg and fragment in msg


def test_unknown_key():
    with pytest.raises(ConfigError, match="'learning-rate' .* unknown key"):
        load_settings({**DEFAULTS, "learning-rate": 0.1})


def test_all_problems_in_one_message():
    with pytest.raises(ConfigError) as err:
        load_settings(run_config(lr=-1.0, method="nope"))
    assert {p[0] for p in err.value.problems} == {"lr", "method"}


def test_data_dir_must_exist(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match="'data-dir' .*nowhere.* existing directory"):
        load_settings(run_config(dataset="mnist", data_dir=str(missing)))
    with pytest.raises(ConfigError, match="needs a data directory"):
        load_settings(run_config(dataset="mnist"))


def test_cross_key_rules():
    with pytest.raises(ConfigError, match="'classes-per-client' = 11 .* <= 10"):
        load_settings(run_config(classes_per_client=11))
    with pytest.raises(ConfigError, match="'label-groups' = 11"):
        load_settings(run_config(partition="label-groups", label_groups=11))
    with pytest.raises(ConfigError, match="'dominant-classes' = 10"):
        load_settings(run_config(partition="dominant", dominant_classes=10))
    with pytest.raises(ConfigError, match="'samples-per-client' = 100 .* only for partition 'pathological' or 'dominant'"):
        load_settings(run_config(partition="dirichlet", samples_per_client=100))
    with pytest.raises(ConfigError, match="'samples-per-client' = 3 .* >= classes-per-client=4"):
        load_settings(run_config(samples_per_client=3))
    with pytest.raises(ConfigError, match="'finetune-epochs' = 1 .* 'superfed', whose evaluated predictor is not one network"):
        load_settings(run_config(method="superfed", finetune_epochs=1))
    with pytest.raises(ConfigError, match="'finetune-epochs' = 2 .* 'fedavg-ft', which fine-tunes 1 epoch by definition"):
        load_settings(run_config(method="fedavg-ft", finetune_epochs=2))
    assert load_settings(run_config(hn_lr=0.0)).hn_lr == 0.0  # frozen hypernetworks: the ablation


@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason="shared MNIST test set not present")
def test_valid_mnist_config():
    s = load_settings(run_config(dataset="mnist", data_dir=str(MNIST_DIR), lr=0.01))
    assert s.lr == 0.01 and s.data_path == MNIST_DIR.resolve() and s.image_shape == (1, 28, 28)

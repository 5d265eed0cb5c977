"""Run-config validation: pyproject defaults are valid, every error names key, value and rule."""

import pytest
from conftest import DEFAULTS, run_config

from pflower.config import ConfigError, known_keys, load_settings


def test_pyproject_defaults_are_the_declared_defaults():
    """pyproject.toml lists every key (every method's under its name) with the declared default."""
    from pflower.methods import declarations

    assert set(DEFAULTS) == set(known_keys())
    for name in declarations():
        assert load_settings({**DEFAULTS, "method": name}).to_run_config() == {
            k: v for k, v in DEFAULTS.items() if "." not in k or k.startswith(f"{name}.")} | {"method": name}  # fmt: skip


def test_a_key_of_another_method_is_refused_naming_both_methods():
    with pytest.raises(ConfigError, match=r"'superfed.mu' = 5.0 is not allowed: belongs to method 'superfed', but method is 'fedavg'"):
        load_settings(run_config(method="fedavg", superfed__mu=5.0))
    assert load_settings(run_config(method="fedavg")).params == load_settings(run_config(method="local")).params  # defaults pass
    with pytest.raises(ConfigError, match=r"'foo.bar' .* no method 'foo'"):
        load_settings({**DEFAULTS, "foo.bar": 1})


@pytest.mark.parametrize("key,suggestion", [("num-rounds", "num-server-rounds"), ("hn-lr", "pfedla.hn-lr"), ("top-k", "heurpfedla.top-k"),
                                            ("superfed-mu", "superfed.mu"), ("pfedla.hn_lr", "pfedla.hn-lr")])  # fmt: skip
def test_unknown_key_names_the_closest_known_key(key, suggestion):
    with pytest.raises(ConfigError, match=f"'{key}' = 5 is not allowed: unknown key; did you mean '{suggestion}'"):
        load_settings({**DEFAULTS, key: 5})


def test_method_params_are_the_chosen_methods():
    s = load_settings(run_config(method="fedprox", fedprox__mu=0.5))
    assert s.params.mu == 0.5 and s.to_run_config()["fedprox.mu"] == 0.5 and "pfedla.hn-lr" not in s.to_run_config()
    assert hash(s) == hash(load_settings(run_config(method="fedprox", fedprox__mu=0.5)))  # cached per process by value


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("method", "fedsomething", "'fedavg'"),
        ("optimizer", "rmsprop", "'sgd' or 'adam'"),
        ("test-mode", "everywhere", "'local', 'global' or 'both'"),
        ("gradual-interval", -1, "greater than or equal to 0"),
        ("federico.epsilon", 1.5, "less than or equal to 1"),
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
        ("local-steps", -1, "greater than or equal to 0"),
        ("data-seed", -2, "greater than or equal to -1"),
        ("client-classes", 3, "valid string"),
        ("data-fraction", 0.0, "greater than 0"),
        ("data-fraction", 1.5, "less than or equal to 1"),
    ],
)
def test_bad_value_names_key_value_and_rule(key, value, fragment):
    with pytest.raises(ConfigError) as err:
        method = {"method": key.partition(".")[0]} if "." in key else {}
        load_settings(run_config(**method, **{key.replace(".", "__").replace("-", "_"): value}))
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
    with pytest.raises(ConfigError, match="'samples-per-client' = 100 .* only for partition 'pathological', 'dominant', 'label-groups' or 'classes'"):
        load_settings(run_config(partition="dirichlet", samples_per_client=100))
    with pytest.raises(ConfigError, match="'group-assignment' = 'random' .* only for partition 'label-groups'"):
        load_settings(run_config(group_assignment="random"))
    with pytest.raises(ConfigError, match="'lr-decay' = 1.0"):
        load_settings(run_config(lr_decay=1.0))
    with pytest.raises(ConfigError, match="'samples-per-client' = 3 .* >= classes-per-client=4"):
        load_settings(run_config(samples_per_client=3))
    with pytest.raises(ConfigError, match="'finetune-epochs' = 1 .* must be 0 for 'superfed': its prediction is a line of models"):
        load_settings(run_config(method="superfed", finetune_epochs=1))
    with pytest.raises(ConfigError, match="'finetune-epochs' = 2 .* must be 0 for 'fedavg-ft': it fine-tunes 1 epoch by definition"):
        load_settings(run_config(method="fedavg-ft", finetune_epochs=2))
    assert load_settings(run_config(pfedla__hn_lr=0.0)).params.hn_lr == 0.0  # frozen hypernetworks: the ablation


def test_valid_mnist_config(mnist_dir):
    s = load_settings(run_config(dataset="mnist", data_dir=str(mnist_dir), lr=0.01))
    assert s.lr == 0.01 and s.data_path == mnist_dir.resolve() and s.image_shape == (1, 28, 28)


@pytest.mark.parametrize(
    "keys,message",
    [
        ({"partition": "classes"}, "'client-classes' = '' is not allowed: must be one group of class ids per client, groups separated by ';', ids by ','"),
        ({"partition": "classes", "client_classes": "0,1;2,x"}, "'client-classes' = '0,1;2,x' is not allowed: .*; group 2 \\('2,x'\\) is not a list of whole numbers"),
        ({"partition": "classes", "client_classes": "0,1;"}, "group 2 \\(''\\) is not a list of whole numbers"),
        ({"partition": "classes", "client_classes": "0,-1"}, "group 1 has class -1, class ids start at 0"),
        ({"partition": "classes", "client_classes": "0,1,1;2"}, "group 1 lists class 1 twice"),
        ({"partition": "classes", "client_classes": "0,1;12"}, "'client-classes' = '0,1;12' is not allowed: class 12 is not a class of digits: its class ids are 0-9"),
        ({"partition": "classes", "client_classes": "0,1,2;3", "samples_per_client": 2},
         "'samples-per-client' = 2 is not allowed: must be >= 3, the most classes a client lists in client-classes \\(or 0\\)"),
        ({"client_classes": "0;1"}, "'client-classes' = '0;1' is not allowed: only for partition 'classes'"),
    ],
)  # fmt: skip
def test_client_classes_names_its_key_and_what_is_allowed(keys, message):
    """One line naming the key, the value and what is allowed (the number of groups is checked
    against the clients with the data: tests/test_controls.py)."""
    with pytest.raises(ConfigError, match=message) as err:
        load_settings(run_config(**keys))
    assert len(err.value.problems) == 1 and "\n" not in str(err.value)


def test_client_classes_accepts_groups_with_spaces_and_samples_per_client():
    s = load_settings(run_config(partition="classes", client_classes=" 0, 1,2 ;3;4,5,6,7,8,9", samples_per_client=30))
    assert s.client_classes == " 0, 1,2 ;3;4,5,6,7,8,9"


def test_data_fraction_combines_with_samples_per_client_and_is_refused_for_the_nodes_own_data():
    assert load_settings(run_config(data_fraction=0.1, samples_per_client=8)).data_fraction == 0.1  # the subset first, then each client's samples
    with pytest.raises(ConfigError, match="'data-fraction' = 0.5 is not allowed: only for a pool the run shares out \\(not dataset 'node'") as err:
        load_settings(run_config(dataset="node", data_fraction=0.5))
    assert len(err.value.problems) == 1


def test_the_data_seed_is_the_seed_unless_set():
    assert load_settings(run_config(seed=3)).split_seed == 3 and load_settings(run_config(seed=3, data_seed=0)).split_seed == 0


def test_local_steps_replace_local_epochs_which_is_refused_beside_them():
    assert load_settings(run_config(local_steps=2)).local_steps == 2
    assert load_settings(run_config(local_steps=2, local_epochs=5)).local_epochs == 5  # the default: not set
    with pytest.raises(ConfigError, match="'local-epochs' = 1 is not allowed: only for local-steps=0") as err:
        load_settings(run_config(local_steps=2, local_epochs=1))
    assert len(err.value.problems) == 1


@pytest.mark.parametrize("overrides, key", [({"lr": 1e308}, "lr"), ({"lr": 3.5e38}, "lr"), ({"method": "fedprox", "fedprox__mu": 1e300}, "fedprox.mu")])
def test_a_float_float32_cannot_hold_is_refused_naming_the_key(overrides, key):
    """lr=1e308 passed the check and every client then failed converting it to float32."""
    with pytest.raises(ConfigError, match=rf"'{key}' = .* is not allowed: must be at most 3.403e\+38 in magnitude"):
        load_settings(run_config(**overrides))


def test_a_dirichlet_alpha_whose_draw_overflows_is_refused_naming_the_bound():
    """dirichlet-alpha=1e308 passed, its draw overflowed to all-zero shares, and the advice said to
    raise alpha: refused with the bound (the key's description says to use partition='iid')."""
    with pytest.raises(ConfigError, match=r"'dirichlet-alpha' = 1e\+308 is not allowed: Input should be less than or equal to 1000000"):
        load_settings(run_config(partition="dirichlet", dirichlet_alpha=1e308))

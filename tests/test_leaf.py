"""FEMNIST and Shakespeare as LEAF and the papers use them: clients are writers or speaking roles
(``natural-id``) with LEAF's sampling controls, Shakespeare's lines as character indices, and LEAF's
stacked LSTM. Every data set here is a tiny ``save_to_disk`` folder written by the test, in the
columns of flwr-datasets' published copies."""

import numpy as np
import pytest
import torch
from conftest import in_process_rounds, run_config
from data_files import PLAY, write_femnist, write_shakespeare
from torch import nn

from pflower.build import build_model, check_data
from pflower.config import ConfigError, load_settings
from pflower.datasets import partition as P
from pflower.datasets.federated import client_data, client_domain, federated_indices, pool_for
from pflower.datasets.huggingface import encode_text, text_codes
from pflower.datasets.sources import DataError
from pflower.models import MixedModel, layers, norm_keys
from pflower.models.lstm import VOCABULARY, CharLSTM

#: Five writers (or roles) with 12, 10, 8, 6 and 3 samples.
COUNTS = (12, 10, 8, 6, 3)


def femnist(tmp_path, **keys) -> dict:
    write_femnist(tmp_path / "femnist", COUNTS, size=8, classes=10)  # every class has images (FEMNIST's 62 need 62 of them)
    return run_config(dataset="huggingface", data_dir=str(tmp_path / "femnist"), hf_label_column="character", model="leaf-cnn",
                      partition="natural-id", natural_id_column="writer_id", **keys)  # fmt: skip


def shakespeare(tmp_path, **keys) -> dict:
    write_shakespeare(tmp_path / "shakespeare", COUNTS)
    return run_config(dataset="huggingface", data_dir=str(tmp_path / "shakespeare"), hf_text_column="x", hf_label_column="y",
                      partition="natural-id", natural_id_column="character_id", **keys)  # fmt: skip


# ------------------------------------------------------------------ LEAF's sampling of writers
def test_min_samples_drops_small_ids_and_the_fraction_draws_the_rest_by_seed():
    ids = np.repeat(["a", "b", "c", "d", "e"], COUNTS)  # a: 12 ... e: 3
    assert P.kept_natural_ids(ids).tolist() == ["a", "b", "c", "d", "e"]
    assert P.kept_natural_ids(ids, min_samples=8).tolist() == ["a", "b", "c"]  # 6 and 3 are below 8
    drawn = {tuple(P.kept_natural_ids(ids, 0, 0.5, seed)) for seed in range(20)}
    assert {len(d) for d in drawn} == {2} and len(drawn) > 3  # round(0.5 x 5) = 2 (banker's rounding of 2.5), which two by the seed
    assert P.kept_natural_ids(ids, 0, 0.5, 7).tolist() == P.kept_natural_ids(ids, 0, 0.5, 7).tolist()
    assert len(P.kept_natural_ids(ids, 0, 0.01, 0)) == 1  # at least one
    assert set(P.kept_natural_ids(ids, 6, 0.75, 3)) <= {"a", "b", "c", "d"} and len(P.kept_natural_ids(ids, 6, 0.75, 3)) == 3
    parts = P.natural_id(ids, 2, min_samples=8)  # a and b; c
    assert [sorted(set(ids[p])) for p in parts] == [["a", "b"], ["c"]] and [len(p) for p in parts] == [22, 8]
    assert all(np.array_equal(p, np.sort(p)) for p in parts)
    assert P.natural_ids_of(ids, 2, 1, min_samples=8) == ["c"]
    with pytest.raises(P.PartitionError, match=r"natural-id-min-samples=13: no id has that many samples; the most an id has is 12") as err:
        P.natural_id(ids, 1, min_samples=13)
    assert err.value.key == "natural-id-min-samples"
    with pytest.raises(P.PartitionError, match=r"natural-id-min-samples=8 keeps 3 of 5 ids for 4 clients; every client needs one at least"):
        P.natural_id(ids, 4, min_samples=8)
    with pytest.raises(P.PartitionError, match=r"natural-id-fraction=0.5 keeps 2 of the 5 ids for 3 clients") as err:
        P.natural_id(ids, 3, fraction=0.5)
    assert err.value.key == "natural-id-fraction"


def test_the_sampling_keys_are_validated_with_one_line_errors(tmp_path):
    cfg = femnist(tmp_path)
    for key, value, why in [("natural-id-fraction", 0.0, "Input should be greater than 0"), ("natural-id-fraction", 1.5, "Input should be less than or equal to 1"),
                            ("natural-id-min-samples", -1, "Input should be greater than or equal to 0"), ("natural-id-min-samples", 2.5, "Input should be a valid integer")]:  # fmt: skip
        with pytest.raises(ConfigError) as err:
            load_settings({**cfg, key: value})
        assert str(err.value) == f"run config key '{key}' = {value!r} is not allowed: {why}"
    with pytest.raises(ConfigError, match=r"^run config key 'natural-id-fraction' = 0.5 is not allowed: only for partition 'natural-id'$"):
        load_settings(run_config(natural_id_fraction=0.5))
    s = load_settings({**cfg, "natural-id-min-samples": 8})
    with pytest.raises(
        ConfigError, match=r"^run config key 'natural-id-min-samples' = 8 is not allowed: natural-id-min-samples=8 keeps 3 of 5 ids for 4 clients"
    ):
        check_data(s, 4)
    with pytest.raises(
        ConfigError, match=r"^run config key 'natural-id-fraction' = 0.4 is not allowed: natural-id-fraction=0.4 keeps 2 of the 5 ids for 3 clients"
    ):
        check_data(load_settings({**cfg, "natural-id-fraction": 0.4}), 3)


def test_femnist_clients_are_the_writers_the_sampling_keeps(tmp_path):
    """FEMNIST's layout (a DatasetDict saved to disk): with every writer kept each client is one
    writer; min-samples drops the small ones and their images are nowhere; the fraction draws
    writers by the data seed (``seed`` alone leaves them)."""
    cfg = femnist(tmp_path)
    s = load_settings(cfg)
    assert s.image_shape == (1, 8, 8) and s.num_classes == 10
    check_data(s, 5)
    ids = pool_for(s).ids
    for c in range(5):
        train, test = client_data(s, c, 5)
        assert len(train) + len(test) == COUNTS[c] and client_domain(s, c, 5) == f"f{c:04d}_14"
    s = load_settings({**cfg, "natural-id-min-samples": 6})
    fi = federated_indices(s, 4)
    held = [sorted(set(ids[np.concatenate([tr, te])])) for tr, te in zip(fi.train, fi.test)]
    assert held == [[f"f{k:04d}_14"] for k in range(4)]  # f0004_14 (3 images) is dropped
    assert sum(len(t) for t in fi.train + fi.test) == 36 and not np.isin(np.flatnonzero(ids == "f0004_14"), np.concatenate(fi.train + fi.test)).any()
    drawn = {data_seed: [client_domain(load_settings({**cfg, "natural-id-fraction": 0.6, "data-seed": data_seed, "seed": seed}), c, 3) for c in range(3)]
             for data_seed in range(6) for seed in (0, 1)}  # fmt: skip
    assert all(len(set(d)) == 3 for d in drawn.values()) and len({tuple(d) for d in drawn.values()}) > 1


# ------------------------------------------------------------------ Shakespeare's text
def test_text_is_leafs_character_indices_and_bad_text_is_named_by_row():
    assert len(VOCABULARY) == 80 and len(set(VOCABULARY)) == 80
    codes = encode_text(["To be,", "\n}ab [", "zZ09:;"], "x")
    assert codes.dtype == np.uint8 and codes.shape == (3, 6)
    assert "".join(VOCABULARY[i] for i in codes.ravel()) == "To be,\n}ab [zZ09:;"
    assert codes[0].tolist() == [VOCABULARY.index(c) for c in "To be,"] == [44, 67, 1, 54, 57, 8]
    for texts, message in [(["abc", "abcd"], "row 6 holds 4 characters, row 5 3; one length per data set"), (["abc", None], "row 6 has no text \\(null\\)"),
                           (["abc", "a#c"], "row 6 holds '#', outside LEAF's 80-character vocabulary"), (["abc", "aéc"], "row 6 holds 'é', outside")]:  # fmt: skip
        with pytest.raises(DataError, match=f"^column 'x': {message}"):
            encode_text(texts, "x", first=5)


def test_a_text_column_is_read_from_arrow_at_once_and_its_faults_named_by_row():
    """The column's bytes at once when every line is the same number of vocabulary characters;
    else row by row, naming the row: a character outside the vocabulary (one byte, or one of
    two), a line of another length, a null."""
    import datasets

    lines = ["To be,", "\n}ab [", "zZ09:;"]
    ds = datasets.Dataset.from_dict({"x": lines})
    assert np.array_equal(text_codes(ds, "x"), encode_text(lines, "x"))
    assert np.array_equal(text_codes(ds.select([2, 0]), "x"), encode_text([lines[2], lines[0]], "x"))  # the data set's row order
    for rows, message in [(["abc", "a#c"], "row 1 holds '#'"), (["abc", "aéc"], "row 1 holds 'é'"), (["abc", "ab"], "row 1 holds 2 characters"), (["abc", None], "row 1 has no text")]:  # fmt: skip
        with pytest.raises(DataError, match=f"^column 'x': {message}"):
            text_codes(datasets.Dataset.from_dict({"x": rows}), "x")


def test_shakespeare_pool_is_its_lines_as_indices_and_its_next_characters_as_classes(tmp_path):
    cfg = shakespeare(tmp_path)
    s = load_settings(cfg)
    assert s.text and s.image_shape == (80,) and s.num_classes == 80
    roles, xs, ys = write_shakespeare(tmp_path / "again", COUNTS)
    pool = pool_for(s)
    assert pool.x.dtype == torch.uint8 and tuple(pool.x.shape) == (39, 80) and pool.shape == (80,)
    assert ["".join(VOCABULARY[i] for i in row) for row in pool.x.tolist()] == xs
    assert [VOCABULARY[i] for i in pool.y.tolist()] == ys and pool.ids.tolist() == roles
    check_data(s, 5)
    train, test = client_data(s, 4, 5)
    assert len(train) + len(test) == 3 and train.x.dtype == torch.uint8
    assert set(PLAY) <= set(VOCABULARY)


def test_text_keys_refuse_what_text_cannot_be(tmp_path):
    cfg = shakespeare(tmp_path)
    cases = [
        ({"model": "cnn"}, "model", "is an image model; text \\(hf-text-column\\) needs 'lstm' \\(or 'auto'\\)"),
        ({"feature-shift": "rotation"}, "feature-shift", "must be 'none' for text"),
        ({"hf-image-column": "x"}, "hf-image-column", "only for images; with hf-text-column the data set's input is its text column"),
        ({"hf-text-column": "line"}, "hf-text-column", "the data set has no column 'line'; its columns: character_id, x, y"),
        (
            {"hf-text-column": "character_id", "partition": "iid", "natural-id-column": ""},
            "hf-text-column",
            "column 'character_id': row 0 holds '_', outside LEAF's 80-character vocabulary",
        ),
        ({"hf-label-column": "x"}, "data-dir", "column 'x': row 0 holds 80 characters; the labels of a text data set are single characters"),
        ({"natural-id-column": "x"}, "natural-id-column", "natural-id-column='x': is the text column"),
    ]
    for keys, key, message in cases:
        with pytest.raises(ConfigError, match=f"run config key '{key}' = .* is not allowed: {message}"):
            check_data(load_settings({**cfg, **keys}), 5)
    with pytest.raises(ConfigError, match="^run config key 'model' = 'lstm' is not allowed: reads text: dataset 'huggingface' with hf-text-column"):
        load_settings(run_config(model="lstm"))
    with pytest.raises(ConfigError, match="'hf-text-column' = 'x' is not allowed: only for dataset 'huggingface'"):
        load_settings(run_config(hf_text_column="x"))


# ------------------------------------------------------------------ LEAF's stacked LSTM
def test_the_lstm_is_leafs_stacked_lstm_in_four_layers():
    """8-dim embedding of 80 characters, two LSTM layers of 256 units, a Linear from the last step
    to the 80 characters: 819,920 parameters, counted by hand; the two one-layer LSTMs are
    PyTorch's two-layer LSTM (LEAF's MultiRNNCell of two cells) with the same weights."""
    net = build_model(load_settings(run_config(method="fedavg")), (80,), 80, seed=0)
    assert isinstance(net, CharLSTM)
    by_hand = 80 * 8 + (4 * 256 * (8 + 256) + 2 * 4 * 256) + (4 * 256 * (256 + 256) + 2 * 4 * 256) + (256 * 80 + 80)
    assert sum(p.numel() for p in net.parameters()) == by_hand == 819_920
    assert [layer.name for layer in layers(net)] == ["body.0", "body.1", "body.2", "head"] and norm_keys(net) == []
    x = torch.randint(0, 80, (5, 80), dtype=torch.uint8)
    stacked = nn.LSTM(8, 256, num_layers=2, batch_first=True)
    for k in range(2):
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(stacked, f"{name}_l{k}").data.copy_(getattr(net.body[1 + k], f"{name}_l0"))
    reference = net.head(stacked(net.body[0](x.long()))[0][:, -1])
    assert net(x).shape == (5, 80) and torch.allclose(net(x), reference, atol=1e-6)
    assert torch.equal(build_model(load_settings(run_config(method="fedavg")), (80,), 80, seed=0).state_dict()["body.1.weight_hh_l0"],
                       net.state_dict()["body.1.weight_hh_l0"])  # fmt: skip


def test_superfed_mixes_the_lstms_weights_layer_by_layer():
    """SuPerFed's mixed network runs the LSTM at W(lambda) through torch.func: at 0 the federated
    half, at 1 the local half, in between the LSTM whose every weight is the mix."""
    torch.manual_seed(0)
    model = MixedModel(CharLSTM(80, hidden=16), mode="layer")
    for p in model.local.parameters():
        p.data.normal_()
    x = torch.randint(0, 80, (4, 80))
    lam = torch.tensor([0.0, 0.25, 0.5, 1.0])
    model.set_lambda(lam)
    mixed = CharLSTM(80, hidden=16)
    for layer, lam_l in zip(layers(model.fed), lam):
        for key in layer.keys:
            fed, loc = model.fed.get_parameter(key), model.local.get_parameter(key)
            mixed.get_parameter(key).data.copy_((1 - lam_l) * fed + lam_l * loc)
    assert torch.allclose(model(x), mixed(x), atol=1e-5)
    assert torch.equal(model.at(x, 0.0), model.fed(x)) and torch.equal(model.at(x, 1.0), model.local(x))
    model(x).sum().backward()  # one backward pass reaches both halves
    assert model.fed.body[2].weight_hh_l0.grad is not None and model.local.body[2].weight_hh_l0.grad is not None


def test_a_shakespeare_round_in_process_with_the_lstm(tmp_path, monkeypatch):
    from functools import partial

    from pflower.models import lstm

    monkeypatch.setattr(lstm, "CharLSTM", partial(lstm.CharLSTM, hidden=16))
    rows = in_process_rounds(shakespeare(tmp_path, method="fedavg", num_server_rounds=1, local_epochs=1, batch_size=4), tmp_path / "run", 5)
    assert rows[0]["sampled"] == 5 and 0 <= rows[0]["accuracy"] <= 1 and np.isfinite(rows[0]["train-loss"])

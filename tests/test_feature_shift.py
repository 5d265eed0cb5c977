"""Feature shift: each client a domain (a seeded transformation of its inputs), labels untouched;
the domains and every client's label counts in metrics.json, and the partition figure."""

import json

import numpy as np
import pytest
import torch
from conftest import in_process_rounds, run_config

from pflower.config import ConfigError, load_settings
from pflower.datasets.federated import client_data, client_domain, federated_indices, global_test, label_counts
from pflower.datasets.shift import KINDS, Domain, domain_of

X = torch.randn(6, 3, 12, 12, generator=torch.Generator().manual_seed(0))


def test_domains_are_seeded_and_spread_over_the_clients():
    assert domain_of("noise", 3, 2, 5) == domain_of("noise", 3, 2, 5)
    levels = sorted(domain_of("contrast", 3, c, 5).level for c in range(5))
    assert levels == [0.0, 0.25, 0.5, 0.75, 1.0]  # one client keeps its data as it is
    assert sorted(domain_of("contrast", 4, c, 5).level for c in range(5)) == levels
    assert [domain_of("contrast", 4, c, 5).level for c in range(5)] != [domain_of("contrast", 3, c, 5).level for c in range(5)]
    mixed = [domain_of("mixed", 0, c, 10) for c in range(10)]
    assert sorted(d.kind for d in mixed) == sorted(KINDS * 2) and all(d.level == 1 for d in mixed)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_changes_the_inputs_once_and_reproducibly(kind):
    domain = Domain(kind, 1.0, seed=5)
    out = domain.apply(X)
    assert out.shape == X.shape and not torch.allclose(out, X) and torch.equal(out, Domain(kind, 1.0, 5).apply(X))
    assert torch.equal(Domain(kind, 0.0, 5).apply(X), X)
    assert domain.name(3) != "none"


def test_the_strengths_mean_what_the_names_say():
    assert torch.allclose(Domain("rotation", 1.0, 0).apply(X), torch.rot90(X, 1, dims=(2, 3)), atol=1e-5)  # 90° anticlockwise
    low = Domain("contrast", 1.0, 0).apply(X)
    assert torch.allclose(low.std(dim=(1, 2, 3)), X.std(dim=(1, 2, 3)) / 4, rtol=1e-4)
    noise = Domain("noise", 0.5, 0).apply(X) - X
    assert abs(float(noise.std()) - 0.5) < 0.05
    assert Domain("blur", 1.0, 0).apply(X).std() < X.std() * 0.7
    assert Domain("rotation", 0.5, 0).name() == "rotation 45°" and Domain("contrast", 1.0, 0).name() == "contrast ×0.25"


def test_a_shifted_client_has_the_same_samples_and_labels_in_its_domain():
    plain = load_settings(run_config(partition="iid"))
    shifted = load_settings(run_config(partition="iid", feature_shift="mixed"))
    assert [a.tolist() for a in federated_indices(plain, 5).train] == [a.tolist() for a in federated_indices(shifted, 5).train]
    for c in range(5):
        (tr0, te0), (tr1, te1) = client_data(plain, c, 5), client_data(shifted, c, 5)
        domain = domain_of("mixed", 0, c, 5)
        assert torch.equal(tr1.y, tr0.y) and torch.equal(te1.y, te0.y)
        assert torch.equal(tr1.x, domain.apply(tr0.x)) and torch.equal(te1.x, domain.apply(te0.x))
        assert client_domain(shifted, c, 5) == domain.name(1) and client_domain(plain, c, 5) == ""
        assert sum(label_counts(shifted, c, 5)) == len(tr1) + len(te1)
    union = global_test(shifted, 5)  # every client's test split, each in its domain
    assert torch.equal(union.x, torch.cat([client_data(shifted, c, 5)[1].x for c in range(5)]))


def test_node_data_has_no_feature_shift():
    with pytest.raises(ConfigError, match="'feature-shift' = 'noise'.*each node's own data is its domain"):
        load_settings(run_config(dataset="node", feature_shift="noise"))


SWAP_SUITE = """
[fedbn-shift]
seeds = [0, 1]
[fedbn-shift.common]
model = "cnn-bn"
num-server-rounds = 2
local-epochs = 1
[[fedbn-shift.grid]]
name = "feature-shift"
clients = 3
config = { partition = "iid", feature-shift = "mixed" }
methods = ["fedbn"]
"""


def test_a_run_records_each_clients_domain_and_labels_and_draws_them(tmp_path, monkeypatch):
    """FedBN on feature shift in process; bench/fedbn_shift.py rebuilds each client's final model
    from the run's results-dir (its own normalization layers score what its record says), writes
    a swap record tied to the run's record, and tables it by domain from the records alone; a
    results-dir of another run, a run record changed after its swap record, or a swap record of
    no declared run is refused."""
    from conftest import ROOT

    from pflower.bench import make_record

    cfg = run_config(method="fedbn", model="cnn-bn", partition="iid", feature_shift="mixed", num_server_rounds=2, local_epochs=1)
    results, records, suites = tmp_path / "results", tmp_path / "records", tmp_path / "suites.toml"
    suites.write_text(SWAP_SUITE)
    run = results / "fedbn-shift" / "feature-shift" / "fedbn" / "seed0"  # as pflower-bench lays out its results and records
    in_process_rounds(cfg, run)
    doc = json.loads((run / "metrics.json").read_text())
    s = load_settings(cfg)
    assert doc["client-domains"] == {str(c): domain_of("mixed", 0, c, 3).name(1) for c in range(3)}
    assert doc["client-label-counts"] == {str(c): label_counts(s, c, 3) for c in range(3)}
    assert np.sum(list(doc["client-label-counts"].values())) == 1797  # the whole pool
    assert (run / "partition.png").stat().st_size > 5000
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from fedbn_shift import main, measure, own_and_averaged, tables

    own, averaged, _ = own_and_averaged(s, 3, run)
    assert own == pytest.approx([doc["final"]["per-client-accuracy"][str(c)] for c in range(3)])
    assert tables(records, "fedbn-shift", "fedbn", suites).startswith("No record yet: `pflower-bench fedbn-shift`")
    assert measure(results, records, "fedbn-shift", "fedbn", suites) == (
        0,
        [f"{run}: no record of this run under {records} (`pflower-bench fedbn-shift` writes it)"],
    )
    record = records / "fedbn-shift" / "feature-shift" / "fedbn" / "seed0.json"
    record.parent.mkdir(parents=True)
    made = make_record(doc, 10.0, 3)
    record.write_text(json.dumps({**made, "final": {**made["final"], "per-client-accuracy": {**made["final"]["per-client-accuracy"], "1": 0.5}}}))
    with pytest.raises(SystemExit, match=r"seed0 does not hold the models of .*seed0.json: client 1 scores .* the record says 0.5"):
        measure(results, records, "fedbn-shift", "fedbn", suites)
    record.write_text(json.dumps(made))
    page = tmp_path / "fedbn.md"
    page.write_text("# FedBN\n<!-- mechanism:fedbn-shift:start -->\nstale\n<!-- mechanism:fedbn-shift:end -->\nafter\n")
    args = ["--records", str(records), "--page", str(page), "--file", str(suites)]
    assert main(["--from-results", str(results), *args]) == 0
    swap = json.loads((record.parent / "swap-seed0.json").read_text())
    assert swap["own"] == own and swap["mean"] == averaged and swap["machine"]["flwr"] == "1.39.0"
    table = tables(records, "fedbn-shift", "fedbn", suites)
    assert "seeds: 1 of 2" in table  # seed 1 has no record: the table says so
    domains = [doc["client-domains"][str(c)] for c in range(3)]
    for domain in set(domains):  # a row per domain: its clients' mean with their own layers and with the mean
        mine = [c for c in range(3) if domains[c] == domain]
        assert f"| {domain} | {len(mine)} | {np.mean([own[c] for c in mine]):.4f} | {np.mean([averaged[c] for c in mine]):.4f} |" in table
    assert page.read_text() == f"# FedBN\n<!-- mechanism:fedbn-shift:start -->\n{table}<!-- mechanism:fedbn-shift:end -->\nafter\n"
    assert main(args) == 0 and page.read_text().count(table) == 1  # again from the records alone: the same page
    (record.parent / "swap-seed7.json").write_text("{}")
    with pytest.raises(SystemExit, match="swap-seed7.json has no record of a run of 'fedbn-shift' as declared now beside it"):
        tables(records, "fedbn-shift", "fedbn", suites)
    (record.parent / "swap-seed7.json").unlink()
    record.write_text(json.dumps(made, indent=2))
    with pytest.raises(SystemExit, match="swap-seed0.json was measured against another version of seed0.json"):
        tables(records, "fedbn-shift", "fedbn", suites)

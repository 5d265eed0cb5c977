"""The benchmark harness: suite files, resumable execution on real Flower, records, tables and the docs block."""

import json
import re
import tomllib
from itertools import takewhile

import pytest
from conftest import in_process_rounds
from data_files import write_femnist, write_shakespeare

from pflower.bench import (
    RECORDS,
    ROOT,
    data_fingerprint,
    execute,
    finished,
    load_record,
    load_suite,
    machines_sentence,
    main,
    make_record,
    ordering_sentence,
    provenance_gaps,
    provenance_sentence,
    report,
    suite_page,
)
from pflower.check import app_run_config
from pflower.config import load_settings
from pflower.method_records import method_records_markdown
from pflower.plots import draw_mechanisms
from pflower.results import write_json

PROJECT_SUITES = ROOT / "bench" / "suites.toml"

SUITE = """
[tiny]
seeds = [0, 1]
[tiny.common]
num-server-rounds = 1
local-epochs = 1
[[tiny.grid]]
name = "g"
title = "digits, 3 clients"
clients = 3
config = { partition = "iid" }
methods = ["local", { label = "fedavg-slow", method = "fedavg", lr = 0.01 }]
paper = { text = "numbers of the paper.", order = ["fedavg-slow", "local"] }
"""


@pytest.fixture(autouse=True)
def _committed_code(monkeypatch):
    """The suite runs as from a clean checkout, whatever the working tree holds (a test of the
    refusal below sets its own version)."""
    monkeypatch.setattr("pflower.bench.code_version", lambda: "0.1.0 0123456789ab")


def test_suite_file_expands_to_runs(tmp_path):
    (tmp_path / "suites.toml").write_text(SUITE)
    suite, runs = load_suite(tmp_path / "suites.toml", "tiny")
    assert [(r.label, r.seed) for r in runs] == [("local", 0), ("local", 1), ("fedavg-slow", 0), ("fedavg-slow", 1)]
    assert runs[2].config == {"num-server-rounds": 1, "local-epochs": 1, "partition": "iid", "method": "fedavg", "lr": 0.01, "seed": 0}
    assert runs[0].clients == 3
    with pytest.raises(SystemExit, match="suite 'huge' not in"):
        load_suite(tmp_path / "suites.toml", "huge")
    # two runs, or two grids, under one name would share their records
    (tmp_path / "suites.toml").write_text(SUITE.replace('label = "fedavg-slow"', 'label = "local"'))
    with pytest.raises(SystemExit, match=r"suite 'tiny', grid 'g': labels \['local'\] are given more than once"):
        load_suite(tmp_path / "suites.toml", "tiny")
    (tmp_path / "suites.toml").write_text(SUITE + SUITE[SUITE.index("[[tiny.grid]]") :])
    with pytest.raises(SystemExit, match=r"suite 'tiny': grid names \['g'\] are given more than once"):
        load_suite(tmp_path / "suites.toml", "tiny")
    (tmp_path / "suites.toml").write_text(SUITE.replace("seeds = [0, 1]", "seeds = [0, 1, 0]"))
    with pytest.raises(SystemExit, match=r"suite 'tiny': seeds \[0\] are given more than once"):
        load_suite(tmp_path / "suites.toml", "tiny")
    (tmp_path / "suites.toml").write_text(SUITE[: SUITE.index("[[tiny.grid]]")])
    with pytest.raises(SystemExit, match=r"suite 'tiny' has no \[\[tiny.grid\]\]"):
        load_suite(tmp_path / "suites.toml", "tiny")


#: The suites that read LEAF's data sets: their configs are validated on fixtures, whose ids they count.
LEAF_SUITES = ("femnist", "femnist-small", "shakespeare", "shakespeare-small")


@pytest.mark.parametrize("name", list(tomllib.loads(PROJECT_SUITES.read_text())))
def test_every_run_of_the_projects_suites_is_a_valid_config(name, tmp_path):
    """Against a data root with each folder the suites name (validation needs the folders, not their
    files; a Hugging Face data set is opened, so FEMNIST and Shakespeare are tiny fixtures in
    flwr-datasets' columns, writers and roles of 30, 24 and 20 samples)."""
    for folder in ("mnist", "cifar10-jpg", "torchvision"):
        (tmp_path / folder).mkdir()
    if name in LEAF_SUITES:
        write_femnist(tmp_path / "femnist", (30, 24, 20), size=8)
        write_shakespeare(tmp_path / "shakespeare", (30, 24, 20))
    suite, runs = load_suite(PROJECT_SUITES, name, tmp_path)
    assert runs and len({(r.grid, r.label, r.seed) for r in runs}) == len(runs)
    assert {r.grid for r in runs} == {g["name"] for g in suite["grid"]}
    for run in runs:
        load_settings(dict(run.config))


@pytest.mark.parametrize("name", LEAF_SUITES)
def test_the_leaf_suites_run_on_fixtures_one_client_per_writer_or_role(name, tmp_path, monkeypatch):
    """Each LEAF suite's first run, one round in process on the fixture (its keys as the suite
    gives them: LEAF's sampling, the model, the optimizer): a client per id the sampling keeps.
    The models are narrower (their layers the same): LEAF's CNN on 8x8 images (0.6 million
    parameters, not 6.6), the LSTM with 16 units."""
    from functools import partial

    from pflower.models import lstm

    (tmp_path / "data").mkdir()
    if name.startswith("femnist"):
        write_femnist(tmp_path / "data" / "femnist", (30, 24, 20), size=8)
    else:
        monkeypatch.setattr(lstm, "CharLSTM", partial(lstm.CharLSTM, hidden=16))
        write_shakespeare(tmp_path / "data" / "shakespeare", (30, 24, 20))
    _, runs = load_suite(PROJECT_SUITES, name, tmp_path / "data")
    fraction = runs[0].config.get("natural-id-fraction", 1.0)
    assert {r.clients for r in runs} == {max(1, round(fraction * 3))}  # 3 ids of 20 or more samples
    rows = in_process_rounds({**runs[0].config, "num-server-rounds": 1}, tmp_path / "run", runs[0].clients)
    assert rows[0]["sampled"] >= 1 and 0 <= rows[0]["accuracy"] <= 1
    # reading records (a docs build, a headline) leaves the count at 0 and does not open the data
    monkeypatch.setattr("pflower.datasets.federated.natural_id_count", lambda settings: pytest.fail("the data was read"))
    assert {r.clients for r in load_suite(PROJECT_SUITES, name, tmp_path / "data", count_ids=False)[1]} == {0}


@pytest.mark.parametrize("name", LEAF_SUITES)
def test_a_leaf_suite_without_its_data_names_pflower_data(name, tmp_path):
    with pytest.raises(
        SystemExit,
        match=f"suite '{name}' reads {tmp_path / name.split('-')[0]}, which is not there: `pflower-data {name.split('-')[0]} --root {tmp_path}` fetches it",
    ):
        main([name, "--data-root", str(tmp_path), "--results", str(tmp_path / "r"), "--records", str(tmp_path / "rec")])


def test_ordering_sentence_marks_the_papers_pairs_by_the_spread_and_gives_one_seed_no_verdict():
    one = [{"method": "a", "accuracy": [0.9]}, {"method": "b", "accuracy": [0.8]}, {"method": "c", "accuracy": [0.95]}]
    assert ordering_sentence(one, ["c", "a", "b"]) == "Ours by mean: c > a > b; the paper's: c > a > b. One seed: no verdict on the ordering."
    rows = [
        {"method": "a", "accuracy": [0.90, 0.91, 0.92]},
        {"method": "b", "accuracy": [0.80, 0.81, 0.82]},
        {"method": "c", "accuracy": [0.905, 0.93, 0.95]},  # ahead of a by less than the spread
    ]
    assert ordering_sentence(rows, ["c", "a", "b"]) == (
        "Ours by mean: c > a > b; the paper's: c > a > b. Of the paper's 3 pairwise orderings, 2 hold here beyond the seeds' spread, "
        "1 within it only (a gap that does not count) and 0 do not hold."
    )
    assert ordering_sentence(rows, ["b", "a"]).endswith("0 hold here beyond the seeds' spread, 0 within it only (a gap that does not count) and 1 do not hold.")
    assert ordering_sentence(rows, ["a"]) == ""


def test_a_table_says_which_machines_made_its_records_and_how_many_runs_each():
    def doc(machine):
        return {"bench": {"wall-seconds": 1.0, **({"machine": machine} if machine else {})}}

    xeon = {"cpu": "Xeon", "cpus": 2, "gpus": [], "torch": "2.14.1"}
    h200 = {"cpu": "EPYC", "cpus": 16, "gpus": ["NVIDIA H200"], "torch": "2.14.1"}
    rows = [{"method": "a", "docs": [doc(xeon), doc(h200), doc(None)]}, {"method": "b", "docs": [doc(xeon), doc({**xeon, "torch": "2.15.0"})]}]
    assert machines_sentence(rows[1:]) == "This table mixes machines, runs made on: Xeon, 2 cores, torch 2.14.1 (1 run); Xeon, 2 cores, torch 2.15.0 (1 run)."
    assert machines_sentence([{"method": "a", "docs": [doc(xeon), doc(xeon)]}]) == "Runs made on: Xeon, 2 cores, torch 2.14.1 (2 runs)."
    assert machines_sentence(rows) == (
        "This table mixes machines, runs made on: Xeon, 2 cores, torch 2.14.1 (2 runs); EPYC, 16 cores, NVIDIA H200, torch 2.14.1 (1 run); "
        "Xeon, 2 cores, torch 2.15.0 (1 run); a machine not recorded (1 run)."
    )


def test_a_bad_run_config_stops_the_suite_before_any_run(tmp_path):
    (tmp_path / "suites.toml").write_text(SUITE.replace("lr = 0.01 }", "lr = 0.01, fedprox.mu = 0.1 }"))
    _, runs = load_suite(tmp_path / "suites.toml", "tiny")
    with pytest.raises(SystemExit, match="run g/fedavg-slow/seed0: .*'fedprox.mu' = 0.1 is not allowed: belongs to method 'fedprox'"):
        execute(runs, tmp_path / "results", "tiny", tmp_path / "records")
    assert not (tmp_path / "results" / "tiny").exists()


def test_a_suites_clientapps_get_the_cores_and_gpu_share_asked_for_and_the_record_says_so(tmp_path, monkeypatch):
    """``--cpus-per-client``, ``--gpus-per-client`` and ``--clients-per-node`` reach Flower's
    federation config, and each record names them beside the machine (a GPU host's records tell
    how the GPU was shared)."""
    import contextlib
    from pathlib import Path

    import pflower.bench as bench

    (tmp_path / "suites.toml").write_text(SUITE.replace("seeds = [0, 1]", "seeds = [0]").replace('"local", { label', "{ label"))
    _, runs = load_suite(tmp_path / "suites.toml", "tiny")
    asked = []

    def submit(app, home, config, num_clients, cpus=1, gpus=0.0, echo=True, on_line=None, clients_per_node=1):
        asked.append((num_clients, cpus, gpus, clients_per_node))
        folder = Path(re.search(r"results-dir='([^']*)'", config).group(1))
        _fake_run_files(folder, runs[0].config, 0.5)
        return 1, "finished:completed", ""

    monkeypatch.setattr(bench, "submit", submit)
    monkeypatch.setattr(bench, "simulation_superlink", lambda home: contextlib.nullcontext())
    monkeypatch.setattr(bench, "resources_problem", lambda cpus, gpus: None)  # a GPU host's flags, here
    main(["tiny", "--file", str(tmp_path / "suites.toml"), "--results", str(tmp_path / "r"), "--records", str(tmp_path / "rec"),
          "--cpus-per-client", "2", "--gpus-per-client", "0.25", "--clients-per-node", "2", "--page", str(_page(tmp_path))])  # fmt: skip
    assert asked == [(3, 2, 0.25, 2)]
    machine = json.loads(runs[0].record(tmp_path / "rec", "tiny").read_text())["bench"]["machine"]
    assert (machine["cpus-per-client"], machine["gpus-per-client"], machine["clients-per-node"]) == (2, 0.25, 2)


def test_records_kept_elsewhere_write_no_page_and_no_readme(tmp_path, monkeypatch, capsys):
    """``--records DIR`` (say a GPU host's runs) reports its tables on stdout only, unless --page
    or --readme names where they go: the project's pages follow the project's records."""
    import pflower.bench as bench

    written = []
    monkeypatch.setattr(bench, "write_headlines", lambda *a: written.append(a) or [])
    monkeypatch.setattr(bench, "suite_page", lambda suite: pytest.fail("no page for records elsewhere"))
    (tmp_path / "suites.toml").write_text(SUITE.replace("seeds = [0, 1]", "seeds = [0]"))
    _, runs = load_suite(tmp_path / "suites.toml", "tiny")
    for run in runs:
        folder = run.directory(tmp_path / "results", "tiny")
        _fake_run_files(folder, run.config, 0.5)
        (folder / "bench.json").write_text(json.dumps({"wall-seconds": 1.0, "clients": 3, "lineage": "0" * 32}))
    main(["tiny", "--file", str(tmp_path / "suites.toml"), "--results", str(tmp_path / "results"), "--records", str(tmp_path / "rec"), "--report-only"])
    out = capsys.readouterr().out
    assert "| local | 0.5000 |" in out and "tables written into" not in out and written == []


def test_a_gpu_share_on_a_host_without_gpus_stops_the_suite_before_any_run(tmp_path, monkeypatch):
    import torch

    import pflower.bench as bench

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(bench, "execute", lambda *a: pytest.fail("a run started"))
    (tmp_path / "suites.toml").write_text(SUITE)
    with pytest.raises(SystemExit, match="pflower-bench: --gpus-per-client 0.25: this machine has 0 GPU"):
        main(
            ["tiny", "--file", str(tmp_path / "suites.toml"), "--results", str(tmp_path / "r"), "--records", str(tmp_path / "rec"), "--gpus-per-client", "0.25"]
        )


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("--gpus-per-client", "0.1", "is not a GPU share Flower and Ray count exactly"),
        ("--cpus-per-client", "0", "is not a number of CPU cores: a whole number of at least 1"),
    ],
)
def test_a_bad_resource_flag_stops_pflower_bench_before_any_run(tmp_path, capsys, flag, value, why):
    (tmp_path / "suites.toml").write_text(SUITE)
    with pytest.raises(SystemExit) as stopped:
        main(["tiny", "--file", str(tmp_path / "suites.toml"), "--results", str(tmp_path / "r"), flag, value])
    assert stopped.value.code == 2 and f"argument {flag}: '{value}' {why}" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def _page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- bench:tiny:start -->\n<!-- bench:tiny:end -->\n")
    return page


def _metrics(config, accuracy, rounds=1, clients=3, **extra):
    """metrics.json of a finished run of ``config`` (a suite's keys; the run records them all):
    every round evaluated by all ``clients``, as the loop's last round is."""
    final = {"accuracy": accuracy, "weighted-accuracy": accuracy, "bytes-down": 2**20, "bytes-up": 2**20, **extra}
    steps = [{"round": k + 1, "accuracy": accuracy, "evaluated": clients, "cumulative-bytes-down": 2**20, "cumulative-bytes-up": 2**20} for k in range(rounds)]
    recorded = load_settings({**app_run_config(ROOT), **config}).to_run_config()  # what a run of `flwr run` records
    return {"config": recorded, "num-clients": clients, "lineage": "0" * 32, "final": final, "rounds": steps}


def _fake_run_files(directory, config, accuracy):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.json").write_text(json.dumps(_metrics(config, accuracy)))


def _fake_run(directory, accuracy, rounds=1, **extra):
    """A finished results-dir of the tiny suite's run in ``directory`` (.../LABEL/seedK)."""
    label, seed = directory.parent.name, int(directory.name[4:])
    config = next(r.config for r in load_suite_text(SUITE)[1] if (r.label, r.seed) == (label, seed))
    directory.mkdir(parents=True)
    (directory / "metrics.json").write_text(json.dumps(_metrics(config, accuracy, rounds, **extra)))
    (directory / "bench.json").write_text(json.dumps({"wall-seconds": 10.0, "clients": 3, "lineage": "0" * 32}))


def load_suite_text(text):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "suites.toml").write_text(text)
        return load_suite(Path(d) / "suites.toml", "tiny")


def test_report_only_tables_the_runs_finished_so_far(tmp_path, capsys):
    """A suite half run: the table has the finished runs (the seeds column says how many), no
    row for a method with none, and an unfinished run (fewer rounds, no bench.json) is left out."""
    (tmp_path / "suites.toml").write_text(SUITE)
    results = tmp_path / "results"
    _fake_run(results / "tiny" / "g" / "local" / "seed0", 0.5)
    _fake_run(results / "tiny" / "g" / "local" / "seed1", 0.7)
    (results / "tiny" / "g" / "fedavg-slow" / "seed0").mkdir(parents=True)  # started, not finished
    execute_none = ["--records", str(tmp_path / "records"), "--page", str(tmp_path / "page.md")]
    (tmp_path / "page.md").write_text("<!-- bench:tiny:start -->\n<!-- bench:tiny:end -->\n")
    for run in load_suite(tmp_path / "suites.toml", "tiny")[1]:  # the finished results-dirs get their records
        finished(run, results, tmp_path / "records", "tiny")
    assert main(["tiny", "--file", str(tmp_path / "suites.toml"), "--results", str(results), "--report-only", *execute_none]) == 0
    out = capsys.readouterr().out
    assert "| local | 0.6000 ± 0.1414 | 0.6000 ± 0.1414 | 2.0 | 10 | 2 |" in out and "fedavg-slow" not in out.split("Paper:")[0]
    assert (results / "tiny" / "table.csv").read_text().splitlines()[1:] == ["g,local,2,0.6000,0.1414,0.6000,,2.00,10.0"]


def test_a_page_that_cannot_take_the_tables_stops_the_suite_before_any_run(tmp_path):
    (tmp_path / "suites.toml").write_text(SUITE)
    (tmp_path / "other.md").write_text("<!-- bench:other:start -->\n<!-- bench:other:end -->\n")
    args = ["tiny", "--file", str(tmp_path / "suites.toml"), "--results", str(tmp_path / "results"), "--records", str(tmp_path / "records")]
    for page, why in (
        (tmp_path / "missing.md", "is not a file"),
        (tmp_path / "other.md", "has no '<!-- bench:tiny:start -->' ... '<!-- bench:tiny:end -->' block"),
    ):
        with pytest.raises(SystemExit, match=re.escape(f"--page: {page} {why}")):
            main([*args, "--page", str(page)])
    assert not (tmp_path / "results").exists() and not (tmp_path / "records").exists()


def test_status_and_time_left_come_from_the_records_wall_times_per_round(tmp_path, capsys):
    """`--status` runs nothing: runs done and left per grid, and the time left from the records
    (a round of the same label, else of a run of any suite that trains the same rounds, else of
    the grid, else of the suite, times the run's rounds); a
    run under way counts its own elapsed time per round; no record at all: no estimate."""
    from pflower.bench import Eta, Run, duration, machine, resolved_config

    (tmp_path / "suites.toml").write_text(SUITE)
    results, records = tmp_path / "results", tmp_path / "records"
    args = ["tiny", "--file", str(tmp_path / "suites.toml"), "--results", str(results), "--records", str(records), "--status"]
    assert main(args) == 0
    assert "0 of 4 runs finished, 4 left; time left unknown until a run of this suite has a record" in capsys.readouterr().out
    _fake_run(results / "tiny" / "g" / "local" / "seed0", 0.5)  # 10 s, 1 round
    assert main(args) == 0
    assert capsys.readouterr().out == "suite 'tiny': 1 of 4 runs finished, 3 left; about 30 s left\n  g: 1 of 4\n"
    runs = load_suite(tmp_path / "suites.toml", "tiny")[1]
    eta = Eta(runs, records, "tiny")
    eta.add(runs[2], 40.0)  # fedavg-slow seed 0: 40 s a round
    assert [eta.of(r) for r in runs] == [10.0, 10.0, 40.0, 40.0]
    assert eta.left(runs[1:]) == "about 2 min left"  # 10 + 40 + 40 s
    assert eta.left(runs[3:], (1, 5.0)) == "about 0 s left"  # its one round done: nothing left
    assert [duration(s) for s in (40, 720, 3 * 3600 + 300)] == ["40 s", "12 min", "3 h 05 min"]
    # a run with no record of its label takes the rounds of a record of any suite that trains the
    # same rounds with as many clients on a machine like this one (here 4 rounds of another seed,
    # 20 s each), not the grid's other label's
    slow, here = resolved_config(runs[2].config), machine()

    def other(name: str, config: dict, wall: float, clients: int = 3, made_on: dict = here) -> None:
        write_json(records / "other" / "h" / name / "seed0.json", {"config": config, "bench": {"wall-seconds": wall, "clients": clients, "machine": made_on}})

    other("alike", {**slow, "seed": 5, "num-server-rounds": 4}, 80.0)
    other("other-lr", {**slow, "lr": 0.5}, 1000.0)  # other rounds
    other("more-clients", slow, 1000.0, clients=30)
    other("elsewhere", slow, 1000.0, made_on={**here, "cpu": "another CPU"})
    older = {k: v for k, v in slow.items() if k != "local-steps"}  # made before pflower had local-steps: at its default
    other("older", {**older, "num-server-rounds": 2}, 40.0)
    assert [Eta(runs, records, "tiny").of(r) for r in runs] == [10.0, 10.0, 20.0, 20.0]
    steps = Run(runs[2].grid, "fedavg-steps", 0, 3, {**runs[2].config, "local-steps": 7})  # neither record trains its rounds
    assert Eta(runs, records, "tiny").of(steps) == 10.0  # the grid's


def test_the_test_chosen_accuracy_is_a_column_beside_the_held_out_one(tmp_path, capsys):
    """SuPerFed's accuracy at the λ chosen on the test split (the paper's protocol) gets its own
    column; methods without one show a dash."""
    (tmp_path / "suites.toml").write_text(SUITE)
    results = tmp_path / "results"
    _fake_run(results / "tiny" / "g" / "local" / "seed0", 0.5)
    _fake_run(results / "tiny" / "g" / "fedavg-slow" / "seed0", 0.6, **{"oracle-accuracy": 0.75})
    for run in load_suite(tmp_path / "suites.toml", "tiny")[1]:
        finished(run, results, tmp_path / "records", "tiny")
    main(["tiny", "--file", str(tmp_path / "suites.toml"), "--results", str(results), "--records", str(tmp_path / "records"), "--report-only"])
    out = capsys.readouterr().out
    assert "| method | final mean acc. | weighted acc. | acc. at test-chosen λ | MiB (down + up) | wall s | seeds |" in out
    assert "| local | 0.5000 | 0.5000 | — | 2.0 | 10 | 1 of 2 |" in out and "| fedavg-slow | 0.6000 | 0.6000 | 0.7500 | 2.0 | 10 | 1 of 2 |" in out


def test_a_record_or_results_dir_of_another_config_or_cut_short_is_not_finished(tmp_path):
    """A suite entry changed since a run (here fedavg-slow's lr) runs again; so do a results-dir
    whose bench.json a crash cut short and one without all its rounds."""
    (tmp_path / "suites.toml").write_text(SUITE)
    results, records = tmp_path / "results", tmp_path / "records"
    _fake_run(results / "tiny" / "g" / "fedavg-slow" / "seed0", 0.6)
    _fake_run(results / "tiny" / "g" / "local" / "seed0", 0.5)
    _fake_run(results / "tiny" / "g" / "local" / "seed1", 0.5, rounds=0)
    (tmp_path / "changed.toml").write_text(SUITE.replace("lr = 0.01", "lr = 0.02"))
    _, changed = load_suite(tmp_path / "changed.toml", "tiny")
    _, runs = load_suite(tmp_path / "suites.toml", "tiny")
    assert [finished(r, results, records, "tiny") for r in changed if r.seed == 0] == [True, False]
    assert [finished(r, results, records, "tiny") for r in runs if r.seed == 0] == [True, True]
    (results / "tiny" / "g" / "local" / "seed0" / "bench.json").write_text('{"wall-sec')
    assert finished(runs[0], results, records, "tiny")  # its record was written before
    assert not finished(runs[1], results, records, "tiny")  # local seed1: no round


def test_a_run_whose_clients_crashed_is_no_record_and_runs_again(tmp_path):
    """Error replies (a client's exception, a worker Ray killed for memory) in any round: the
    results-dir gets no record, and a record that has them (made before this rule) is not
    finished either; replies the gate rejected for what they held still count."""
    (tmp_path / "suites.toml").write_text(SUITE)
    results, records = tmp_path / "results", tmp_path / "records"
    _, runs = load_suite(tmp_path / "suites.toml", "tiny")
    crashed, judged = runs[0], runs[1]
    for run, rejected in ((crashed, {"client-error": 2}), (judged, {"non-finite": 1})):
        d = run.directory(results, "tiny")
        _fake_run(d, 0.5)
        doc = json.loads((d / "metrics.json").read_text())
        doc["rounds"][0]["rejected"] = rejected
        (d / "metrics.json").write_text(json.dumps(doc))
    assert not finished(crashed, results, records, "tiny") and not crashed.record(records, "tiny").exists()
    assert finished(judged, results, records, "tiny")
    doc = json.loads(judged.record(records, "tiny").read_text())
    doc["rounds"][0]["rejected"] = {"client-error": 1}
    judged.record(records, "tiny").write_text(json.dumps(doc))
    assert load_record(judged, records, "tiny") is None


def test_a_grid_without_records_shows_its_command_and_no_table(tmp_path, capsys):
    """Only records are published: a page's block is rebuilt from them every time, a grid without
    any shows its title and the command that runs it, and nothing of the tables before survives."""
    (tmp_path / "suites.toml").write_text(SUITE + SUITE.split("[[tiny.grid]]")[1].join(["[[tiny.grid]]", ""]).replace('name = "g"', 'name = "h"'))
    results = tmp_path / "results"
    _fake_run(results / "tiny" / "g" / "local" / "seed0", 0.5)
    page = tmp_path / "page.md"
    page.write_text("<!-- bench:tiny:start -->\nold tables\n<!-- bench:tiny:end -->\n")
    args = ["--file", str(tmp_path / "suites.toml"), "--records", str(tmp_path / "records"), "--results", str(results), "--page", str(page)]
    assert main(["tiny", "--report-only", *args]) == 0
    text = page.read_text()
    assert "old tables" not in text and "| local | 0.5000 |" in text
    assert text.endswith("#### digits, 3 clients\n\nNo record yet: `pflower-bench tiny` runs it.\n<!-- bench:tiny:end -->\n")


def test_a_suite_without_records_shows_only_its_commands(tmp_path):
    (tmp_path / "suites.toml").write_text(SUITE)
    page = tmp_path / "page.md"
    page.write_text("<!-- bench:tiny:start -->\ntables of runs made before records\n<!-- bench:tiny:end -->\n")
    args = ["--file", str(tmp_path / "suites.toml"), "--records", str(tmp_path / "records"), "--results", str(tmp_path / "results")]
    with pytest.raises(SystemExit, match="suite 'tiny' has no records in .*: nothing to report"):  # no page: nothing to write
        main(["tiny", "--report-only", *args])
    assert main(["tiny", "--report-only", *args, "--page", str(page)]) == 0
    assert page.read_text() == (
        '<!-- bench:tiny:start -->\n<a id="tiny-g"></a>\n\n#### digits, 3 clients\n\nNo record yet: `pflower-bench tiny` runs it.\n<!-- bench:tiny:end -->\n'
    )


HEADLINES = """
[t]
columns = [{ title = "ours", suite = "tiny", grid = "g" }, { title = "paper" }, { title = "MiB", suite = "tiny", grid = "g", value = "mib" },
           { title = "oracle", suite = "tiny", grid = "g", value = "oracle-accuracy" }]
rows = [{ title = "Local", label = "local", paper = ["50 %"] }, { title = "FedAvg", label = "fedavg-slow", paper = ["40 %"] },
        { title = "Ditto", label = "ditto" }]
"""


def test_the_readmes_headline_tables_come_from_the_records(tmp_path):
    """A headline table puts the paper's numbers beside the records' mean ± sd; a cell says when
    it has fewer seeds than declared, none, or is not run by that grid, and a method without the
    column's value (oracle-accuracy is SuPerFed's) gets a dash; without any record the table is
    the command that runs it."""
    from pflower.bench import write_headlines

    (tmp_path / "suites.toml").write_text(SUITE)
    (tmp_path / "headlines.toml").write_text(HEADLINES)
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- headline:t:start -->\nold\n<!-- headline:t:end -->\nafter\n")
    results, records = tmp_path / "results", tmp_path / "records"
    paths = (tmp_path / "suites.toml", records, readme, tmp_path / "headlines.toml")
    assert write_headlines("other-suite", *paths) == [] and "old" in readme.read_text()
    assert write_headlines("tiny", *paths) == ["t"]
    assert readme.read_text() == "intro\n<!-- headline:t:start -->\nNo record yet: `pflower-bench tiny` runs it.\n<!-- headline:t:end -->\nafter\n"
    _fake_run(results / "tiny" / "g" / "local" / "seed0", 0.5)
    _fake_run(results / "tiny" / "g" / "local" / "seed1", 0.7)
    _fake_run(results / "tiny" / "g" / "fedavg-slow" / "seed0", 0.6, **{"oracle-accuracy": 0.9})
    for run in load_suite(tmp_path / "suites.toml", "tiny")[1]:
        finished(run, results, records, "tiny")
    write_headlines(None, *paths)
    assert readme.read_text().split("start -->\n")[1].split("<!--")[0] == (  # Local has no oracle-accuracy: a dash
        "| method | ours | paper | MiB | oracle |\n| --- | --- | --- | --- | --- |\n"
        "| Local | 0.6000 ± 0.1414 | 50 % | 2.0 | — |\n"
        "| FedAvg | 0.6000 (1 of 2 seeds) | 40 % | 2.0 (1 of 2 seeds) | 0.9000 (1 of 2 seeds) |\n"
        "| Ditto | — | — | — | — |\n"
    )


def test_every_headline_table_in_the_readme_is_the_one_its_records_make(tmp_path):
    """The README's headline tables, rebuilt from the committed records alone, are what it holds."""
    from pflower.bench import HEADLINES, README, write_headlines

    copy = tmp_path / "README.md"
    copy.write_text(README.read_text())
    names = write_headlines(None, PROJECT_SUITES, RECORDS, copy, HEADLINES)
    assert names and all(f"<!-- headline:{n}:start -->" in README.read_text() for n in names)
    assert copy.read_text() == README.read_text()


def test_a_record_keeps_the_large_per_round_entries_whole_for_the_last_round_and_client_0_before():
    metrics = {"config": {"method": "pfedla"}, "final": {"accuracy": 0.5},
               "rounds": [{"round": k, "accuracy": 0.1 * k, "alpha": {"0": [[k]], "1": [[-k]]}, "alpha-structure": {"ratio": k}} for k in (1, 2, 3)]}  # fmt: skip
    record = make_record(metrics, 12.5, 4)
    assert [(r["alpha"], r["alpha-structure"]["ratio"], r["accuracy"]) for r in record["rounds"]] == [
        ({"0": [[1]]}, 1, 0.1),
        ({"0": [[2]]}, 2, 0.2),
        ({"0": [[3]], "1": [[-3]]}, 3, 0.30000000000000004),
    ]
    assert record["bench"] == {"wall-seconds": 12.5, "clients": 4}
    assert metrics["rounds"][0]["alpha"] == {"0": [[1]], "1": [[-1]]}  # the run's own metrics are left as they were
    without_0 = make_record({**metrics, "rounds": [{"round": k, "alpha": {"1": [[k]]}} for k in (1, 2)]}, 1.0, 2)
    assert [r.get("alpha") for r in without_0["rounds"]] == [None, {"1": [[2]]}]


def test_a_grid_s_mechanism_labels_get_their_first_recorded_seed_s_figures_on_the_page(tmp_path):
    """``mechanism = [LABEL]`` draws what that method learned (pFedLA's weights, client 0's over
    the rounds, from a record) beside the grid's figures, from the lowest seed with a record."""
    (tmp_path / "suites.toml").write_text(SUITE.replace("paper = {", 'mechanism = ["fedavg-slow"]\npaper = {'))
    suite, runs = load_suite(tmp_path / "suites.toml", "tiny")
    records = tmp_path / "records"
    for run in runs:
        metrics = _metrics(run.config, 0.5, rounds=3)
        for k, r in enumerate(metrics["rounds"]):
            r["alpha"] = {str(i): [[0.2 + 0.1 * k * (i == j) for j in range(3)] for _ in range(2)] for i in range(3)}
        if run.seed == 1:
            write_json(run.record(records, "tiny"), make_record(metrics, 10.0, 3))
    page = _page(tmp_path)
    report("tiny", suite, runs, records, tmp_path / "out", page)
    drawn = ["g-accuracy", "g-bytes", "g-fedavg-slow-alpha-heatmap", "g-fedavg-slow-alpha-evolution"]
    assert " ".join(f"![{f}](figures/tiny/{f}.png)" for f in drawn) in page.read_text()
    assert all((tmp_path / "figures" / "tiny" / f"{f}.png").stat().st_size > 1000 for f in drawn)
    assert "g-local-alpha" not in page.read_text()
    old = make_record({**metrics, "rounds": metrics["rounds"][-1:]}, 10.0, 3)  # weights of one round: no figure over rounds
    assert [p.name for p in draw_mechanisms(old, tmp_path, "old-")] == ["old-alpha-heatmap.png"]
    (tmp_path / "suites.toml").write_text(SUITE.replace("paper = {", 'mechanism = "local"\npaper = {'))
    with pytest.raises(SystemExit, match=r"grid 'g': mechanism must be a list of its labels, e.g. \[\"local\"\]"):
        load_suite(tmp_path / "suites.toml", "tiny")
    (tmp_path / "suites.toml").write_text(SUITE.replace("paper = {", 'mechanism = ["fedavg"]\npaper = {'))
    with pytest.raises(SystemExit, match=r"suite 'tiny', grid 'g': mechanism \['fedavg'\] is not among its labels \(local, fedavg-slow\)"):
        load_suite(tmp_path / "suites.toml", "tiny")


def _block(text: str, suite: str) -> str:
    return text.split(f"<!-- bench:{suite}:start -->", 1)[1].split(f"<!-- bench:{suite}:end -->", 1)[0]


PUBLISHED = sorted(tomllib.loads(PROJECT_SUITES.read_text()))


@pytest.mark.parametrize("suite", [s for s in PUBLISHED if suite_page(s) is not None])
def test_the_docs_tables_come_from_the_committed_records_alone(tmp_path, suite):
    """What a fresh clone has (the suite file, the suite's records, the docs page): `pflower-bench
    SUITE --report-only` writes exactly the block the docs page holds, and its figures; for every
    suite a page shows, so no table there is older than its records."""
    page = suite_page(suite)
    assert page is not None, f"no docs page holds '<!-- bench:{suite}:start -->'"
    import shutil

    if (RECORDS / suite).is_dir():
        shutil.copytree(RECORDS / suite, tmp_path / "records" / suite)
    copy = tmp_path / "docs" / page.name
    copy.parent.mkdir()
    copy.write_text(page.read_text().replace(_block(page.read_text(), suite), "\nstale\n"))
    args = ["--file", str(PROJECT_SUITES), "--records", str(tmp_path / "records"), "--results", str(tmp_path / "results"), "--page", str(copy)]
    assert main([suite, "--report-only", *args]) == 0
    _, runs = load_suite(PROJECT_SUITES, suite)
    assert copy.read_text() == page.read_text()
    for grid in dict.fromkeys(r.grid for r in runs if (RECORDS / suite / r.grid).is_dir()):
        for figure in (f"{grid}-accuracy.png", f"{grid}-bytes.png"):
            made, kept = copy.parent / "figures" / suite / figure, page.parent / "figures" / suite / figure
            assert made.is_file() and kept.is_file()
            if _drawn_by(kept) == _drawn_by(made):  # the same matplotlib draws the same bytes
                assert made.read_bytes() == kept.read_bytes(), f"{kept} is not what its records draw"


#: The suites whose figures the README shows (its headline tables and the suites its text names):
#: every one of their runs has its record.
README_SUITES = {c["suite"] for table in tomllib.loads((ROOT / "bench" / "headlines.toml").read_text()).values() for c in table["columns"] if "suite" in c}
README_SUITES |= set(re.findall(r"`pflower-bench ([a-z0-9-]+)`", (ROOT / "README.md").read_text()))


def test_the_suites_the_readme_shows_are_the_papers_five_and_more():
    assert {"cifar10-pfedla", "cifar10-federico", "cifar10-superfed", "cifar10-superfed-checks", "cifar10-doublehead"} <= README_SUITES
    assert README_SUITES <= {s for s in PUBLISHED if suite_page(s) is not None}


@pytest.mark.parametrize("suite", [s for s in PUBLISHED if suite_page(s) is not None])
def test_a_published_suite_has_a_record_of_every_run_or_of_none_and_each_names_its_machine(suite):
    """A suite a page shows is whole (a record of every run as the suite declares it now) or
    marked "no record yet" (none); the suites the README shows (the five CIFAR-10 suites among
    them) are whole. Every record says
    what machine made it (CPU model and count, torch and flwr) and how long its run took."""
    _, runs = load_suite(PROJECT_SUITES, suite, count_ids=False)
    docs = [load_record(run, RECORDS, suite) for run in runs]
    missing = [str(run.record(RECORDS, suite).relative_to(RECORDS)) for run, doc in zip(runs, docs, strict=True) if doc is None]
    assert missing in ([], [str(run.record(RECORDS, suite).relative_to(RECORDS)) for run in runs]), f"{suite}: no record of {missing}"
    assert not (suite in README_SUITES and missing), f"{suite}: no record of {missing}"
    for run, doc in zip(runs, docs, strict=True):
        made, where = (doc or {}).get("bench", {}), run.record(RECORDS, suite).relative_to(RECORDS)
        assert doc is None or made.get("wall-seconds", 0) > 0, f"{where}: no wall time"
        machine = made.get("machine") or {}
        assert doc is None or (machine.get("cpu") and machine.get("cpus", 0) >= 1 and machine.get("torch") and machine.get("flwr") == "1.39.0"), (
            f"{where}: made on {machine or 'a machine it does not name'}"
        )


def test_fedbns_per_client_tables_come_from_the_committed_swap_records(monkeypatch):
    """The FedBN page's per-client tables (own against averaged normalization layers) are what
    bench/fedbn_shift.py makes from the committed records alone, byte for byte."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from fedbn_shift import tables

    page = (ROOT / "docs" / "reproductions" / "fedbn.md").read_text()
    block = page.split("<!-- mechanism:fedbn-shift:start -->\n", 1)[1].split("<!-- mechanism:fedbn-shift:end -->", 1)[0]
    assert block == tables(RECORDS, "fedbn-shift", "fedbn")


def test_the_committed_records_hold_no_part_written_file():
    """A record is written whole or not at all (a temporary file, then a rename): none is left."""
    assert [p for p in RECORDS.rglob("*") if p.is_file() and p.suffix != ".json"] == []


def _drawn_by(png):
    """The matplotlib version a PNG's Software chunk names (figures from another version differ in their bytes)."""
    from PIL import Image

    with Image.open(png) as image:
        return image.text.get("Software")


def test_a_record_says_what_machine_made_it():
    """bench.json carries the machine; the record made from it keeps it (CPU, count, GPUs, each
    ClientApp's cores and GPU share, versions)."""
    from pflower.bench import machine

    info = machine()
    assert set(info) == {"cpu", "cpus", "gpus", "cpus-per-client", "gpus-per-client", "python", "torch", "flwr", "pflower"}
    from importlib.metadata import version

    commit = r" [0-9a-f]{12}(\+modified)?" if (ROOT / ".git").exists() else ""  # a git checkout's commit
    assert re.fullmatch(re.escape(version("pflower")) + commit, info["pflower"])
    assert info["cpus"] >= 1 and info["flwr"] == "1.39.0" and (info["cpus-per-client"], info["gpus-per-client"]) == (1, 0.0)
    record = make_record({"config": {}, "final": {}, "rounds": []}, 3.0, 2, info)
    assert record["bench"] == {"wall-seconds": 3.0, "clients": 2, "machine": info}


def test_a_suites_data_is_found_under_the_data_root_and_its_absence_is_named(tmp_path, monkeypatch):
    """A relative data-dir is a folder under --data-root, else $PFLOWER_DATA, else ~/pflower-data;
    a suite whose folder is not there stops before any run, naming the folder and both ways on."""
    from pflower.bench import DATA_ENV, main

    (tmp_path / "suites.toml").write_text(SUITE.replace("[tiny.common]", '[tiny.common]\ndata-dir = "mnist"'))
    monkeypatch.delenv(DATA_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert {r.config["data-dir"] for r in load_suite(tmp_path / "suites.toml", "tiny")[1]} == {str(tmp_path / "home" / "pflower-data" / "mnist")}
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "env"))
    assert {r.config["data-dir"] for r in load_suite(tmp_path / "suites.toml", "tiny")[1]} == {str(tmp_path / "env" / "mnist")}
    runs = load_suite(tmp_path / "suites.toml", "tiny", tmp_path / "given")[1]
    assert {r.config["data-dir"] for r in runs} == {str(tmp_path / "given" / "mnist")}
    with pytest.raises(SystemExit, match=f"suite 'tiny' reads {tmp_path / 'given' / 'mnist'}, which is not there: .*--data-root DIR \\(or \\${DATA_ENV}\\)"):
        main(
            [
                "tiny",
                "--file",
                str(tmp_path / "suites.toml"),
                "--data-root",
                str(tmp_path / "given"),
                "--results",
                str(tmp_path / "r"),
                "--records",
                str(tmp_path / "rec"),
            ]
        )


def _unrecorded_tables(text: str) -> list[str]:
    """The results tables of a page outside the blocks pflower-bench and the docs build write from
    the records (a table with a decimal number in its body) whose preceding paragraph does not
    say "No record yet"."""
    import re

    text = re.sub(r"<!-- (bench|headline|mechanism):([a-z0-9-]+):start -->.*?<!-- \1:\2:end -->", "", text, flags=re.S)
    # the docs build's sections generated from the records (tests/test_docs.py keeps them current)
    text = re.sub(r"<!-- pflower:(claims|claim-counts|twin-runs)\b[^>]*-->.*?<!-- /pflower:\1 -->", "", text, flags=re.S)
    found, lines = [], text.split("\n")
    for k, line in enumerate(lines):
        if line.startswith("|") and k + 1 < len(lines) and re.fullmatch(r"\|[\s:|-]+\|", lines[k + 1]) and not lines[k - 1].startswith("|"):
            body = "\n".join(takewhile(lambda s: s.startswith("|"), lines[k + 2 :]))
            before = "\n".join(lines[max(0, k - 6) : k])
            index = line.startswith("| page |")  # the reproductions index: a line per page, its figures from recorded suites
            if re.search(r"\d\.\d", body) and not index and "No record yet" not in before.split("\n\n")[-1]:
                found.append(line)
    return found


PAGES_WITH_RESULTS = [ROOT / "README.md", *sorted((ROOT / "docs" / "reproductions").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES_WITH_RESULTS, ids=lambda p: p.name)
def test_every_results_table_comes_from_records_or_says_it_has_none(page):
    """A results table on the README or a reproduction page is written by pflower-bench from
    records, or says "No record yet" with its command just before it."""
    assert _unrecorded_tables(page.read_text()) == []


def test_an_unmarked_results_table_is_found():
    page = "intro\n\n| method | acc. |\n| --- | --- |\n| a | 0.5 |\n\n**No record yet:** `x`.\n\n| m | acc. |\n| --- | --- |\n| b | 0.7 |\n"
    assert _unrecorded_tables(page) == ["| method | acc. |"]
    assert _unrecorded_tables("<!-- bench:s:start -->\n| m | a |\n| --- | --- |\n| b | 0.7 |\n<!-- bench:s:end -->\n") == []


def test_records_made_on_other_data_under_the_same_folder_stop_the_suite(tmp_path):
    """A record keeps the digest of the pool its run read: a suite whose data root now holds other
    data under the same name, or whose records disagree, stops naming the record; records from
    before digests were kept pass."""
    from pflower.bench import check_same_data, data_key

    (tmp_path / "suites.toml").write_text(SUITE)
    results, records = tmp_path / "results", tmp_path / "records"
    runs = load_suite(tmp_path / "suites.toml", "tiny")[1]
    for run, digest in zip(runs, ["a" * 32, None, "a" * 32], strict=False):
        _fake_run(run.directory(results, "tiny"), 0.5)
        if digest:
            bench = run.directory(results, "tiny") / "bench.json"
            bench.write_text(json.dumps({**json.loads(bench.read_text()), "data": digest}))
        finished(run, results, records, "tiny")
    key = data_key(runs[0].config)
    check_same_data(runs, records, "tiny")
    check_same_data(runs, records, "tiny", {key: "a" * 32})
    with pytest.raises(SystemExit, match=r"local/seed0.json was made on other data than the default data set holds now \(digest a{32}, now b{32}\)"):
        check_same_data(runs, records, "tiny", {key: "b" * 32})
    record = runs[2].record(records, "tiny")
    record.write_text(json.dumps({**json.loads(record.read_text()), "bench": {**json.loads(record.read_text())["bench"], "data": "c" * 32}}))
    with pytest.raises(SystemExit, match="were made on different data under the same keys"):
        check_same_data(runs, records, "tiny")
    assert data_fingerprint(runs[0].config) == data_fingerprint(runs[1].config)  # the same pool: the same digest


def test_a_record_is_of_the_run_by_its_whole_config_and_client_count(tmp_path):
    """Records match on the run's whole config, the keys the suite leaves at their defaults and
    a method's own keys too, and on its client count; a key pflower gained after the record was
    made matches only at its default, and a key pflower no longer has is not compared."""
    from pflower.bench import matches

    (tmp_path / "suites.toml").write_text(SUITE)
    local = load_suite(tmp_path / "suites.toml", "tiny")[1][0]
    good = _metrics(local.config, 0.5)
    assert matches(local, good)
    assert not matches(local, {**good, "config": {**good["config"], "lr": 0.5}})  # a key the suite does not name
    assert not matches(local, _metrics(local.config, 0.5, clients=2))
    lacking = {**good, "config": {k: v for k, v in good["config"].items() if k != "server-threads"}}
    assert matches(local, lacking) and matches(local, {**good, "config": {**good["config"], "a-removed-key": 1}})
    (tmp_path / "threads.toml").write_text(SUITE.replace("local-epochs = 1", "local-epochs = 1\nserver-threads = 2"))
    threaded = load_suite(tmp_path / "threads.toml", "tiny")[1][0]
    assert not matches(threaded, lacking) and matches(threaded, _metrics(threaded.config, 0.5))
    (tmp_path / "superfed.toml").write_text(SUITE.replace('methods = ["local",', 'methods = ["superfed",'))
    superfed = load_suite(tmp_path / "superfed.toml", "tiny")[1][0]
    doc = _metrics(superfed.config, 0.5)
    assert doc["config"]["superfed.nu"] == 1.0 and matches(superfed, doc)
    assert not matches(superfed, {**doc, "config": {**doc["config"], "superfed.nu": 2.0}})


def test_a_run_whose_last_round_not_every_client_evaluated_is_not_finished(tmp_path):
    """The last round is evaluated by every client: a record whose final evaluation lost a
    client (a timeout), or has no accuracy, is of a run cut short and runs again."""
    from pflower.bench import matches

    (tmp_path / "suites.toml").write_text(SUITE)
    local = load_suite(tmp_path / "suites.toml", "tiny")[1][0]
    doc = _metrics(local.config, 0.5, rounds=1)
    for key, value in (("evaluated", 2), ("accuracy", None)):
        short = json.loads(json.dumps(doc))
        short["rounds"][-1][key] = value
        assert not matches(local, short)


@pytest.mark.parametrize("content", [b"[]", b'"text"', b"\xff\xfe", b'{"config": {', b"", b'{"config": [], "rounds": ["x"], "final": {}}', None])
def test_an_unreadable_record_is_no_record_and_the_suite_goes_on(tmp_path, content, capsys):
    (tmp_path / "suites.toml").write_text(SUITE)
    runs = load_suite(tmp_path / "suites.toml", "tiny")[1]
    records = tmp_path / "records"
    runs[0].record(records, "tiny").parent.mkdir(parents=True)
    if content is None:  # a folder where the record should be
        runs[0].record(records, "tiny").mkdir()
    else:
        runs[0].record(records, "tiny").write_bytes(content)
    assert load_record(runs[0], records, "tiny") is None
    args = ["tiny", "--file", str(tmp_path / "suites.toml"), "--results", str(tmp_path / "results"), "--records", str(records), "--status"]
    assert main(args) == 0 and "0 of 4 runs finished" in capsys.readouterr().out


def test_a_results_dir_is_recorded_only_with_the_bench_json_of_that_very_run(tmp_path, monkeypatch):
    """bench.json names the run (its lineage) it timed: a rerun into the folder of an earlier run
    removes the earlier bench.json and run.log first, and a rerun that fails after writing all
    its rounds leaves a results-dir that makes no record (not the earlier run's wall time, machine and data)."""
    import contextlib
    from pathlib import Path

    import pflower.bench as bench

    (tmp_path / "suites.toml").write_text(SUITE.replace("lr = 0.01", "lr = 0.02"))  # the suite changed since
    results, records = tmp_path / "results", tmp_path / "records"
    earlier = results / "tiny" / "g" / "fedavg-slow" / "seed0"
    _fake_run(earlier, 0.6)  # finished with lr 0.01: its bench.json and metrics.json
    (earlier / "run.log").write_text("the earlier run's log")
    runs = [r for r in load_suite(tmp_path / "suites.toml", "tiny")[1] if r.label == "fedavg-slow" and r.seed == 0]
    assert not finished(runs[0], results, records, "tiny")

    def submit(app, home, config, num_clients, cpus=1, gpus=0.0, echo=True, on_line=None, clients_per_node=1):
        folder = Path(re.search(r"results-dir='([^']*)'", config).group(1))
        assert not (folder / "bench.json").exists() and not (folder / "run.log").exists()
        (folder / "metrics.json").write_text(json.dumps({**_metrics(runs[0].config, 0.7), "lineage": "1" * 32}))
        (folder / "bench.json").write_text(json.dumps({"wall-seconds": 10.0, "clients": 3, "lineage": "0" * 32}))  # as if left over
        return 1, "finished:failed", "log"

    monkeypatch.setattr(bench, "submit", submit)
    monkeypatch.setattr(bench, "simulation_superlink", lambda home: contextlib.nullcontext())
    monkeypatch.setattr(bench, "data_fingerprint", lambda config: "d" * 32)
    with pytest.raises(SystemExit, match="ended 'finished:failed'"):
        execute(runs, results, "tiny", records)
    assert not finished(runs[0], results, records, "tiny") and not runs[0].record(records, "tiny").exists()


def test_a_run_cut_short_goes_on_from_its_checkpoint_and_is_timed_whole(tmp_path, monkeypatch, capsys):
    """A run the bench started here, with this code and data, and cut short after a round (its
    checkpoint and a metrics.json of the run as the suite declares it, the last round's included)
    goes on from the checkpoint (resume-from, the folder kept); its record's wall time counts both
    parts and says it was resumed once. A cut-short folder of another config, machine (here another
    GPU share) or code, or without a checkpoint starts again from an empty folder."""
    import contextlib
    from pathlib import Path

    import pflower.bench as bench

    (tmp_path / "suites.toml").write_text(SUITE.replace("num-server-rounds = 1", "num-server-rounds = 3").replace("seeds = [0, 1]", "seeds = [0, 1, 2]"))
    results, records = tmp_path / "results", tmp_path / "records"
    runs = {(r.label, r.seed): r for r in load_suite(tmp_path / "suites.toml", "tiny")[1]}
    folders = {key: run.directory(results, "tiny") for key, run in runs.items()}
    here = {"machine": {k: v for k, v in bench.machine(1, 0.0).items() if k != "pflower"}, "code": bench.code_digest(), "data": "d" * 32}
    cut = {  # the run: (its config as it ran, its last round, a checkpoint, the part the bench started)
        ("local", 0): (runs["local", 0].config, 2, True, here),
        ("local", 1): (runs["local", 1].config, 2, False, here),
        ("local", 2): (runs["local", 2].config, 3, True, here),  # cut short after its last round
        ("fedavg-slow", 0): ({**runs["fedavg-slow", 0].config, "lr": 0.02}, 2, True, here),
        ("fedavg-slow", 1): (runs["fedavg-slow", 1].config, 2, True, {**here, "machine": {**here["machine"], "gpus-per-client": 0.5}}),
        ("fedavg-slow", 2): (runs["fedavg-slow", 2].config, 2, True, {**here, "code": "another pflower"}),
    }
    for key, (config, last, checkpoint, part) in cut.items():
        folders[key].mkdir(parents=True)
        (folders[key] / "metrics.json").write_text(json.dumps({**_metrics(config, 0.5, rounds=last), "lineage": "1" * 32}))
        (folders[key] / "bench-progress.json").write_text(json.dumps({"wall-seconds": 1000.0, "resumed": 0, **part}))
        if checkpoint:
            (folders[key] / "checkpoint.pt").write_bytes(b"the state after the last round")
    seen = {}

    def submit(app, home, config, num_clients, cpus=1, gpus=0.0, echo=True, on_line=None, clients_per_node=1):
        folder = Path(re.search(r"results-dir='([^']*)'", config).group(1))
        key = next(k for k, f in folders.items() if f == folder)
        going_on = re.search(r"resume-from='([^']*)'", config)
        seen[key] = (going_on and going_on.group(1), (folder / "checkpoint.pt").exists(), (folder / "metrics.json").exists())
        on_line("INFO :      [round 3/3] accuracy 0.7")
        assert json.loads((folder / "bench-progress.json").read_text()) == {
            "wall-seconds": pytest.approx(1000.0 if going_on else 0.0, abs=60),
            "resumed": 1 if going_on else 0,
            **here,
        }
        metrics = _metrics(runs[key].config, 0.7, rounds=3)
        if going_on:  # the resumed run records where it went on from
            metrics["config"]["resume-from"] = str(folder)
        (folder / "metrics.json").write_text(json.dumps({**metrics, "lineage": "1" * 32}))
        return 0, "finished:completed", "log"

    monkeypatch.setattr(bench, "submit", submit)
    monkeypatch.setattr(bench, "simulation_superlink", lambda home: contextlib.nullcontext())
    monkeypatch.setattr(bench, "data_fingerprint", lambda config: "d" * 32)
    execute(list(runs.values()), results, "tiny", records)
    out = capsys.readouterr().out
    assert (
        "[1/6] g / local / seed 0; goes on from its checkpoint after round 2; " in out
        and "[3/6] g / local / seed 2; goes on from its checkpoint after round 3; " in out
    )
    going_on = {("local", 0), ("local", 2)}
    assert seen == {key: (str(folders[key]), True, True) if key in going_on else (None, False, False) for key in runs}
    for key, run in runs.items():
        bench_part = json.loads(run.record(records, "tiny").read_text())["bench"]
        assert (bench_part["wall-seconds"] >= 1000.0) == (key in going_on) and bench_part.get("resumed") == (1 if key in going_on else None)
        assert bench_part["machine"] == {**bench.machine(1, 0.0), "clients-per-node": 1} and not (folders[key] / "bench-progress.json").exists()


def test_a_run_that_fails_going_on_from_its_checkpoint_runs_from_its_first_round_next_time(tmp_path, monkeypatch):
    """A checkpoint that cannot be gone on from (unreadable, of a pflower since changed) would stop
    the suite at every start: a resumed part that fails before its first round removes it, and the
    next start runs the run anew. One that fails after going on keeps the rounds it added."""
    import contextlib

    import pflower.bench as bench

    (tmp_path / "suites.toml").write_text(SUITE.replace("num-server-rounds = 1", "num-server-rounds = 3").replace("seeds = [0, 1]", "seeds = [0]"))
    results, records = tmp_path / "results", tmp_path / "records"
    run = load_suite(tmp_path / "suites.toml", "tiny")[1][0]
    folder = run.directory(results, "tiny")
    here = {"machine": {k: v for k, v in bench.machine(1, 0.0).items() if k != "pflower"}, "code": bench.code_digest(), "data": "d" * 32}

    def cut_short():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_text(json.dumps(_metrics(run.config, 0.5, rounds=2)))
        (folder / "checkpoint.pt").write_bytes(b"")
        (folder / "bench-progress.json").write_text(json.dumps({"wall-seconds": 10.0, "resumed": 0, **here}))

    configs, lines = [], []

    def submit(app, home, config, num_clients, cpus=1, gpus=0.0, echo=True, on_line=None, clients_per_node=1):
        configs.append(config)
        for line in lines:
            on_line(line)
        return 1, "finished:failed", "checkpoint.pt is not a readable pflower checkpoint"

    monkeypatch.setattr(bench, "submit", submit)
    monkeypatch.setattr(bench, "simulation_superlink", lambda home: contextlib.nullcontext())
    monkeypatch.setattr(bench, "data_fingerprint", lambda config: "d" * 32)
    cut_short()
    with pytest.raises(SystemExit, match="went on from its checkpoint, now removed: the next start runs it from round 1; log in"):
        execute([run], results, "tiny", records)
    assert not (folder / "checkpoint.pt").exists() and (folder / "run.log").read_text().endswith("readable pflower checkpoint")
    with pytest.raises(SystemExit, match=r"ended 'finished:failed'; log in"):
        execute([run], results, "tiny", records)
    assert ["resume-from" in c for c in configs] == [True, False]
    cut_short()
    lines.append("[round 3/3] accuracy 0.7")  # it went on, then failed: what it added stays
    with pytest.raises(SystemExit, match=r"ended 'finished:failed'; log in"):
        execute([run], results, "tiny", records)
    assert "resume-from" in configs[-1] and (folder / "checkpoint.pt").exists()


def test_another_suite_file_keeps_out_of_the_projects_records(tmp_path, monkeypatch, capsys):
    """A suite of the same name in another file would write over the project's records and its
    docs page: it needs --records DIR; the project's own file, named by a relative path, is the
    project's file."""
    (tmp_path / "suites.toml").write_text(SUITE.replace("[tiny", "[small") + SUITE.replace("[tiny", "[mine-only"))
    with pytest.raises(SystemExit, match=r"--file .*suites.toml: bench/suites.toml has a suite 'small' too, whose records .* --records DIR"):
        main(["small", "--file", str(tmp_path / "suites.toml"), "--results", str(tmp_path / "results"), "--status"])
    assert main(["mine-only", "--file", str(tmp_path / "suites.toml"), "--results", str(tmp_path / "results"), "--status"]) == 0  # no clash
    assert "suite 'mine-only': 0 of 4 runs finished" in capsys.readouterr().out
    monkeypatch.chdir(ROOT)
    assert main(["small", "--file", "bench/suites.toml", "--results", str(tmp_path / "results"), "--status"]) == 0
    assert "suite 'small': 14 of 14 runs finished" in capsys.readouterr().out


def test_the_suite_figures_draw_the_evaluated_rounds_only_each_line_its_own_style():
    """A grid's figures plot the mean over seeds of the rounds every seed evaluated (a suite that
    evaluates every 10th round has no zeros in between), and no two of 40 lines look alike."""
    from pflower.plots import line_style, mean_series

    def doc(accuracies, mib_per_round):
        return {"rounds": [{"round": k + 1, "accuracy": a, "cumulative-bytes-down": (k + 1) * mib_per_round * 2**20, "cumulative-bytes-up": 0}
                           for k, a in enumerate(accuracies)]}  # fmt: skip

    rounds, mib, acc = mean_series([doc([None, 0.5, None, 0.7], 1), doc([None, 0.3, 0.4, 0.9], 3)])
    assert rounds == [2, 4] and acc.tolist() == pytest.approx([0.4, 0.8]) and mib.tolist() == [4.0, 8.0]
    assert len({tuple(sorted(line_style(i).items())) for i in range(40)}) == 40


def test_a_record_matches_the_apps_defaults_and_a_mismatch_is_named(tmp_path, monkeypatch):
    """A run's config beneath the suite's keys is the app's pyproject.toml (what `flwr run`
    submits): a user who raises a default there gets runs of that value, and the records made
    before do not match them; why a metrics.json is not of its run is said key by key."""
    import pflower.bench as bench
    from pflower.bench import app_defaults, mismatch

    (tmp_path / "suites.toml").write_text(SUITE)
    local = load_suite(tmp_path / "suites.toml", "tiny")[1][0]
    before = _metrics(local.config, 0.5)
    monkeypatch.setattr(bench, "app_defaults", lambda: {**app_defaults(), "round-timeout": 1200.0})
    assert mismatch(local, before) == "round-timeout = 600.0, the suite's run has 1200.0"
    assert mismatch(local, {**before, "config": {**before["config"], "round-timeout": 1200.0}}) is None
    last = {**before["rounds"][-1], "evaluated": 2}
    assert mismatch(local, {**before, "rounds": [last]}) == "its last round evaluated by 2 of its 3 clients"
    assert mismatch(local, {**before, "rounds": []}) == "0 of its 1 rounds"


def test_records_on_other_data_stop_the_suite_even_where_they_are_not_of_the_run_now(tmp_path):
    """A natural-id grid's client count comes from its data: other data under the same folder
    can make a record another run's, which rerunning would write over; its digest still stops
    the suite."""
    from pflower.bench import check_same_data, data_key

    (tmp_path / "suites.toml").write_text(SUITE)
    results, records = tmp_path / "results", tmp_path / "records"
    run = load_suite(tmp_path / "suites.toml", "tiny")[1][0]
    _fake_run(run.directory(results, "tiny"), 0.5)
    bench_json = run.directory(results, "tiny") / "bench.json"
    bench_json.write_text(json.dumps({**json.loads(bench_json.read_text()), "data": "a" * 32}))
    finished(run, results, records, "tiny")
    record = run.record(records, "tiny")
    record.write_text(json.dumps({**json.loads(record.read_text()), "num-clients": 5}))  # as if drawn from other data
    assert load_record(run, records, "tiny") is None
    with pytest.raises(SystemExit, match="was made on other data than"):
        check_same_data([run], records, "tiny", {data_key(run.config): "b" * 32})


# A method page's table of recorded runs: written from the records, for every label of the method.
METHOD_SUITES = (
    SUITE.replace("seeds = [0, 1]", "seeds = [0, 1, 2]").replace(
        'methods = ["local", { label = "fedavg-slow", method = "fedavg", lr = 0.01 }]',
        'methods = ["local", { label = "avg", method = "fedavg" }, "fedprox", { label = "fedprox-mu1", method = "fedprox", fedprox.mu = 1.0 },'
        ' { label = "avg-fast", method = "fedavg", lr = 0.5 }]',
    )
    + """
[other]
seeds = [0]
[other.common]
num-server-rounds = 1
[[other.grid]]
name = "h"
clients = 3
methods = ["fedprox"]
"""
)
#: Final accuracy by label and seed; fedprox-mu1 has no seed 2 yet, `other` has no record.
#: FedAvg at its declared keys is labelled "avg"; avg-fast is FedAvg too, at another lr.
METHOD_ACCURACY = {
    "local": [0.80, 0.90, 0.70],
    "avg": [0.60, 0.70, 0.80],
    "fedprox": [0.70, 0.70, 0.90],
    "fedprox-mu1": [0.90, 0.95],
    "avg-fast": [0.80, 0.90, 0.70001],
}


def test_a_methods_rows_follow_its_records_in_every_grid(tmp_path):
    suites = tmp_path / "suites.toml"
    suites.write_text(METHOD_SUITES)
    _, runs = load_suite(suites, "tiny")
    for run in runs:
        if run.seed < len(METHOD_ACCURACY[run.label]):
            folder = run.directory(tmp_path / "results", "tiny")
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text(json.dumps(_metrics(run.config, METHOD_ACCURACY[run.label][run.seed])))
            (folder / "bench.json").write_text(json.dumps({"wall-seconds": 1.0, "clients": 3, "lineage": "0" * 32}))
    docs = tmp_path / "docs"
    (docs / "reproductions").mkdir(parents=True)
    (docs / "reproductions" / "tiny.md").write_text("<!-- bench:tiny:start -->\n<!-- bench:tiny:end -->\n")
    args = ["--file", str(suites), "--results", str(tmp_path / "results"), "--records", str(tmp_path / "records")]
    assert main(["tiny", "--report-only", *args, "--page", str(docs / "reproductions" / "tiny.md")]) == 0

    text = method_records_markdown("fedprox", suites, tmp_path / "records", docs)
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    assert rows == [
        # mean 0.7667 over 0.70 / 0.70 / 0.90: third of the four rows with all their seeds (local and
        # avg-fast both show 0.8000 and share the first place); level with avg on seed 1
        "| [tiny / g](../reproductions/tiny.md) | `fedprox` | 3 | 0.7667 ± 0.1155 | 2.0 | 3 of 4 | +0.067 (2 of 3 above, 1 level) | -0.033 (1 of 3 above) |",
        # two of three seeds: not ranked, compared over seeds 0 and 1 only (avg 0.65, local 0.85 there)
        "| [tiny / g](../reproductions/tiny.md) | `fedprox-mu1` | 2 of 3 | 0.9250 ± 0.0354 | 2.0 | — | +0.275 (2 of 2 above) | +0.075 (2 of 2 above) |",
    ]
    assert "`avg` |" not in text and "other / h" not in text  # another method's row; a grid without records
    assert "| — | — |" not in text
    fedavg = [line for line in method_records_markdown("fedavg", suites, tmp_path / "records", docs).splitlines() if line.startswith("| [")]
    assert fedavg == [
        # the reference is FedAvg at its declared keys, whatever its label; another FedAvg row is compared with it
        "| [tiny / g](../reproductions/tiny.md) | `avg` | 3 | 0.7000 ± 0.1000 | 2.0 | 4 of 4 | — | -0.100 (1 of 3 above) |",
        "| [tiny / g](../reproductions/tiny.md) | `avg-fast` | 3 | 0.8000 ± 0.1000 | 2.0 | =1 of 4 | +0.100 (2 of 3 above) | 0.000 (1 of 3 above, 2 level) |",
    ]
    assert method_records_markdown("ditto", suites, tmp_path / "records", docs) == "No benchmark suite has a record of `ditto` yet.\n"


def test_a_checkout_with_uncommitted_code_makes_no_record_unless_told_and_then_the_record_says_so(tmp_path, monkeypatch):
    (tmp_path / "suites.toml").write_text(SUITE)
    _, runs = load_suite(tmp_path / "suites.toml", "tiny")
    monkeypatch.setattr("pflower.bench.code_version", lambda: "0.1.0 0123456789ab+modified")
    with pytest.raises(SystemExit, match=r"uncommitted changes .*0123456789ab\+modified.*--allow-modified"):
        execute(runs, tmp_path / "results", "tiny", tmp_path / "records")
    assert not (tmp_path / "results" / "tiny").exists()
    with pytest.raises(SystemExit, match=r"uncommitted changes"):
        main(
            [
                "tiny",
                "--file",
                str(tmp_path / "suites.toml"),
                "--results",
                str(tmp_path / "r"),
                "--records",
                str(tmp_path / "rec"),
                "--data-root",
                str(tmp_path),
            ]
        )


def test_provenance_gaps_name_what_a_record_does_not_say():
    whole = {"bench": {"machine": {"pflower": "0.1.0 0123456789ab"}, "data": "d" * 32}}
    assert provenance_gaps(whole) == []
    assert provenance_gaps({"bench": {"machine": {"pflower": "0.1.0 0123456789ab+modified"}, "data": "d"}}) == ["modified tree"]
    assert provenance_gaps({"bench": {"wall-seconds": 1.0}}) == ["code version", "data digest"]
    rows = [{"docs": [whole, {"bench": {"machine": {"pflower": "unreleased"}, "data": "d"}}]}]
    assert provenance_sentence(rows).startswith("Of these 2 records, 1 name no code version (")
    assert provenance_sentence([{"docs": [whole]}]) == ""


#: The records that lack a code version or a data digest, or came from a modified tree: made
#: before records named them, kept and listed (their pages count them); no new one may join.
UNNAMED = ROOT / "bench" / "records-unnamed.txt"


def _unnamed() -> list[str]:
    out = []
    for records in sorted(ROOT.glob("bench/records*")):
        for path in sorted(records.rglob("*.json")):
            doc = json.loads(path.read_text())
            if isinstance(doc.get("bench"), dict) and (gaps := provenance_gaps(doc)):  # a suite's record (flbench's and the swaps' have their own form)
                out.append(f"{path.relative_to(ROOT)}: {', '.join(gaps)}")
    return out


def test_every_suite_record_names_its_code_and_data_or_is_listed_as_made_before_they_were():
    listed = [line for line in UNNAMED.read_text().splitlines() if line and not line.startswith("#")]
    found = _unnamed()
    assert not sorted(set(found) - set(listed)), "records without a code version or data digest: make them again from a committed checkout"
    assert found == listed, "bench/records-unnamed.txt lists records that are gone or now whole: remove those lines"

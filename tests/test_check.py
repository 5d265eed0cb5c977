"""Errors before anything starts: pflower-check and pflower-sim validate the run config (and the
results-dir) without starting a SuperLink, Ray or a ServerApp."""

import json

import pytest
from conftest import ROOT

from pflower import launcher
from pflower.check import check, main


@pytest.mark.parametrize("overrides,message", [
    ("num-rounds=5", "'num-rounds' = 5 is not allowed: unknown key; did you mean 'num-server-rounds'?"),
    ("method='fedavgg'", "'method' = 'fedavgg' is not allowed: must be one of 'apfl'"),
    ("method='fedavg' superfed.mu=5.0", "'superfed.mu' = 5.0 is not allowed: belongs to method 'superfed', but method is 'fedavg'"),
    ("lr=-0.1", "'lr' = -0.1 is not allowed: Input should be greater than 0"),
    ("results-dir='/proc/pflower-results'", "'results-dir' = '/proc/pflower-results' is not allowed: must be a directory the server can write"),
    ("dataset = 'mnist'", "\"dataset = 'mnist'\" is not a key=value pair (no spaces around '='"),
    ("lr=0.2 num-server-rounds= 5", "'num-server-rounds= 5' is not a key=value pair"),
    ("lr=0.2 fedprox", "'fedprox' is not a key=value pair"),
])  # fmt: skip
def test_a_bad_run_config_is_named_before_anything_starts(monkeypatch, capsys, overrides, message):
    assert message in check(ROOT, overrides)
    monkeypatch.setattr(launcher, "simulate", lambda *a, **k: pytest.fail("pflower-sim started a simulation"))
    assert launcher.main(["-c", overrides]) == 2
    assert message in capsys.readouterr().err


def test_a_valid_run_config_passes(tmp_path, capsys):
    assert check(ROOT, f"method='fedprox' fedprox.mu=0.1 results-dir='{tmp_path}'") is None
    assert main(["-c", f"num-server-rounds=3 results-dir='{tmp_path}'"]) == 0
    assert "valid" in capsys.readouterr().out


def test_a_check_writes_nothing_whether_it_passes_or_refuses(tmp_path, monkeypatch, capsys):
    """pflower-check of a valid config, and pflower-sim refused for a bad key: the results-dir
    (two levels below an existing folder) is not created, and the folder holds nothing new."""
    results = tmp_path / "runs" / "first"
    assert main(["-c", f"results-dir='{results}'"]) == 0
    monkeypatch.setattr(launcher, "simulate", lambda *a, **k: pytest.fail("pflower-sim started a simulation"))
    assert launcher.main(["-c", f"results-dir='{results}' lr=-1.0"]) == 2
    assert list(tmp_path.iterdir()) == []


def test_the_serverapp_refuses_an_unwritable_results_dir_before_any_message(grid_factory):
    from conftest import run_config
    from flwr.app import Context, RecordDict

    from pflower.config import ConfigError
    from pflower.server_app import app

    cfg = run_config(results_dir="/proc/pflower-results")
    grid = grid_factory(cfg, 2)
    with pytest.raises(ConfigError, match="'results-dir' = '/proc/pflower-results' is not allowed: must be a directory the server can write"):
        app._main(grid, Context(1, 0, {}, RecordDict(), cfg))
    assert grid.sent == []


# ------------------------------------------------------------------ one run per results-dir
def _serve(cfg: dict) -> None:
    """The ServerApp's main with 3 in-process clients."""
    from conftest import InProcessGrid
    from flwr.app import Context, RecordDict

    from pflower.client_app.app import app as client_app
    from pflower.server_app import app as server_app

    server_app._main(InProcessGrid(client_app, cfg, 3), Context(1, 0, {}, RecordDict(), cfg))


def _small(results, **kw) -> dict:
    from conftest import run_config

    return run_config(**{"num_server_rounds": 2, "local_epochs": 1, "samples_per_client": 60, "results_dir": str(results), **kw})


@pytest.mark.parametrize("held", [("metrics.json",), ("checkpoint.pt",), ("metrics.json", "checkpoint.pt")])
def test_a_run_into_a_folder_holding_another_run_is_refused_and_changes_nothing(tmp_path, monkeypatch, capsys, grid_factory, held):
    """pflower-check, pflower-sim and the ServerApp refuse it naming the folder and the three ways
    on; not a byte of the old run changes, and no message is sent."""
    from flwr.app import Context, RecordDict

    from pflower.config import ConfigError
    from pflower.server_app import app

    old = {name: f"old {name}".encode() for name in held}
    for name, data in old.items():
        (tmp_path / name).write_bytes(data)
    go_on = f"continue that run with resume-from='{tmp_path}', or " if "checkpoint.pt" in held else ""  # no checkpoint: nothing to resume
    why = f"{tmp_path} holds another run ({', '.join(held)}): choose another results-dir, {go_on}replace it with overwrite=true"
    assert f"'results-dir' = '{tmp_path}' is not allowed: {why}" in check(ROOT, f"results-dir='{tmp_path}'")
    monkeypatch.setattr(launcher, "simulate", lambda *a, **k: pytest.fail("pflower-sim started a simulation"))
    assert launcher.main(["-c", f"results-dir='{tmp_path}'"]) == 2 and why in capsys.readouterr().err
    cfg = _small(tmp_path)
    grid = grid_factory(cfg, 3)
    with pytest.raises(ConfigError, match="holds another run"):
        app._main(grid, Context(1, 0, {}, RecordDict(), cfg))
    assert grid.sent == []
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == old


def test_runs_naming_no_results_dir_each_get_a_folder_of_their_own_and_resume_from_it(tmp_path, monkeypatch, caplog):
    """Two runs in a row with the default keys (the second was refused: 'results holds another
    run'): each writes results/<start time>-<method>, named in the log; a third resumes the first
    from its folder into a folder of its own, its clients' states found under results/client-state."""
    import logging

    from pflower.run_folder import new_run_folder

    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    cfg = {k: v for k, v in _small("unused", method="ditto").items() if k != "results-dir"}
    _serve(cfg)
    _serve(cfg)
    first, second = sorted((tmp_path / "results").glob("*-ditto*"))
    assert [p.name[:15] <= q.name[:15] for p, q in [(first, second)]] == [True]  # they sort by start time
    assert all((d / "metrics.json").is_file() for d in (first, second)) and (tmp_path / "results" / "client-state").is_dir()
    assert f"Results of this run: {first}" in caplog.text and f"Results of this run: {second}" in caplog.text
    doc = json.loads((first / "metrics.json").read_text())
    assert doc["config"]["results-dir"] == f"results/{first.name}"
    _serve({**cfg, "num-server-rounds": 3, "resume-from": f"results/{first.name}"})
    third = max((tmp_path / "results").glob("*-ditto*"), key=lambda d: d.stat().st_mtime_ns)
    assert [r["round"] for r in json.loads((third / "metrics.json").read_text())["rounds"]] == [1, 2, 3]
    assert new_run_folder(tmp_path / "b", "x", now=0).name.endswith("-x") and new_run_folder(tmp_path / "b", "x", now=0).name.endswith("-x-2")


def test_a_run_refused_for_its_data_writes_no_folder(tmp_path, monkeypatch):
    """The ServerApp checks the data and the model before it makes the run's folder: a refused
    run left an empty results/<start>-<method> (or a named results-dir) behind."""
    from pflower.config import ConfigError

    monkeypatch.chdir(tmp_path)
    cfg = {k: v for k, v in _small("unused").items() if k != "results-dir"}
    for bad in (
        {"dataset": "mnist", "data-dir": str(tmp_path / "empty")},
        {"model": "leaf-cnn", "dataset": "imagefolder", "data-dir": str(tmp_path / "empty")},
    ):
        (tmp_path / "empty").mkdir(exist_ok=True)
        with pytest.raises(ConfigError):
            _serve({**cfg, **bad})
        with pytest.raises(ConfigError):
            _serve({**cfg, **bad, "results-dir": str(tmp_path / "named")})
    assert not (tmp_path / "results").exists() and not (tmp_path / "named").exists()


@pytest.mark.parametrize("method", ["superfed", "federico", "pfedla"])
def test_overwrite_replaces_the_old_runs_files_and_only_those(tmp_path, method):
    """A run of ``method`` (its figures, checkpoint, client states, TensorBoard events), then a
    FedAvg run with overwrite=true: the folder holds the new run's files alone, a file of the
    user's stays; every figure a run draws is among those overwrite removes."""
    from conftest import run_config

    from pflower.config import ConfigError
    from pflower.methods import declarations
    from pflower.run_folder import FIGURES

    _serve({**_small(tmp_path, method=method), **declarations()[method].example})
    old_figures = {p.name for p in tmp_path.glob("*.png")}
    assert old_figures and old_figures <= set(FIGURES)
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events.out").write_text("old events")
    (tmp_path / "notes.txt").write_text("mine")
    assert (tmp_path / "client-state").is_dir()
    with pytest.raises(ConfigError, match="holds another run"):
        _serve(_small(tmp_path, method="fedavg"))
    _serve(_small(tmp_path, method="fedavg", overwrite=True))
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert doc["config"]["method"] == "fedavg" and doc["config"]["overwrite"] is True and len(doc["rounds"]) == 2
    assert {p.name for p in tmp_path.glob("*.png")} == {"accuracy.png", "partition.png"}
    assert not (tmp_path / "tensorboard").exists() and (tmp_path / "notes.txt").read_text() == "mine"
    assert run_config()["overwrite"] is False


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_run_resumed_in_its_own_folder_goes_on_there(tmp_path, overwrite):
    """resume-from naming the results-dir itself continues that run in place (with overwrite=true
    too: the checkpoint it resumes from is not removed)."""
    _serve(_small(tmp_path, method="fedavg"))
    _serve(_small(tmp_path, method="fedavg", num_server_rounds=3, resume_from=str(tmp_path), overwrite=overwrite))
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert [r["round"] for r in doc["rounds"]] == [1, 2, 3]


def test_a_run_into_a_folder_another_run_is_writing_now_is_refused(tmp_path):
    """Two runs started at once into one folder both passed the check for another run's files
    (neither had written one yet) and wrote over each other: the second finished "completed"
    with its metrics lost. The ServerApp holds its results-dir while it runs; a run that finds it
    held is refused and writes nothing. The claim ends with the run (or its process)."""
    from pflower.run_folder import FolderBusyError, claimed

    with claimed(tmp_path):
        with pytest.raises(FolderBusyError, match="being written by another run"):
            _serve(_small(tmp_path, method="fedavg"))
        assert list(tmp_path.iterdir()) == []
    _serve(_small(tmp_path, method="fedavg"))
    assert (tmp_path / "metrics.json").is_file()
    with claimed(tmp_path):  # released when the run ended
        pass


@pytest.mark.parametrize("n", ["0", "-1", "two"])
def test_a_number_of_clients_below_one_is_refused_by_its_option(n, capsys):
    """--num-clients 0 or -1 ended in a traceback of the partition (min() of an empty sequence,
    negative dimensions) in pflower-check and pflower-sim: argparse now refuses it."""
    for entry in (main, launcher.main):
        with pytest.raises(SystemExit) as exit_:
            entry(["--num-clients", n])
        assert exit_.value.code == 2 and "not a number of clients" in capsys.readouterr().err


def test_the_data_check_leaves_no_pool_in_the_servers_memory():
    """The ServerApp checks the data but trains on none of it: the pool the check loaded was
    kept in its process for the whole run (CIFAR-10: 737 MB); a pool already loaded stays."""
    from pflower.build import check_data
    from pflower.config import load_settings
    from pflower.datasets import federated

    federated._pool.cache_clear()
    settings = load_settings({"dataset": "digits", "partition": "iid"})
    check_data(settings, 3)
    assert federated._pool.cache_info().currsize == 0
    pool = federated.pool_for(settings)
    check_data(settings)
    assert federated.pool_for(settings) is pool


def test_resuming_a_finished_run_or_an_unreadable_checkpoint_is_refused_by_the_check(tmp_path):
    """pflower-check names a resume-from that cannot go on before anything starts: a run that
    finished all its rounds (it ran 0 rounds, rewriting metrics.json and the figures), a cut-short
    checkpoint (found once SuperLink and Ray had started); a run given more rounds passes."""
    from pflower.checkpoint import CHECKPOINT

    first = tmp_path / "first"
    _serve(_small(first))
    assert json.loads((first / "metrics.json").read_text())["complete"] is True
    same = f"resume-from='{first}' results-dir='{tmp_path / 'second'}' num-server-rounds=2 local-epochs=1 samples-per-client=60"
    why = check(ROOT, same)
    assert why is not None and f"the run in {first} finished all its 2 rounds: nothing is left to run (raise num-server-rounds to go on)" in why
    assert check(ROOT, same.replace("num-server-rounds=2", "num-server-rounds=3")) is None
    data = (first / CHECKPOINT).read_bytes()
    (first / CHECKPOINT).write_bytes(data[: len(data) // 2])
    why = check(ROOT, same.replace("num-server-rounds=2", "num-server-rounds=3"))
    assert why is not None and "is not a readable pflower checkpoint" in why
    assert not (tmp_path / "second").exists()


def test_a_checkpoint_with_nan_weights_is_refused_by_the_check(tmp_path):
    """A checkpoint whose server state holds a NaN (a disk fault, a diverged run saved by hand):
    named by pflower-check before anything starts, not found after a round of training."""
    import torch

    from pflower.checkpoint import CHECKPOINT

    first = tmp_path / "first"
    _serve(_small(first))
    raw = torch.load(first / CHECKPOINT, weights_only=True)

    def poison(state) -> bool:
        for value in state.values() if isinstance(state, dict) else []:
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
                value.view(-1)[0] = float("nan")
                return True
            if poison(value):
                return True
        return False

    assert poison(raw["strategy"])
    torch.save(raw, first / CHECKPOINT)
    why = check(ROOT, f"resume-from='{first}' results-dir='{tmp_path / 'second'}' num-server-rounds=3 local-epochs=1 samples-per-client=60")
    assert why is not None and "holds NaN or infinite values in the server state's" in why


def test_a_run_whose_figures_failed_is_not_complete_and_resumes_to_draw_them(tmp_path, monkeypatch):
    """The last round done, drawing the figures fails: metrics.json does not say complete, so a
    resume with the same rounds is allowed (and draws them); refused once they are drawn."""
    from pflower import results

    def broken(*args, **kwargs):
        raise OSError("No space left on device")

    first = tmp_path / "first"
    monkeypatch.setattr(results, "draw_run", broken)
    with pytest.raises(OSError, match="No space left"):
        _serve(_small(first))
    assert "complete" not in json.loads((first / "metrics.json").read_text())
    monkeypatch.undo()
    again = f"resume-from='{first}' results-dir='{first}' num-server-rounds=2 local-epochs=1 samples-per-client=60"
    assert check(ROOT, again) is None


def test_the_check_of_a_run_on_the_nodes_own_data_passes_without_a_shape(tmp_path):
    """dataset='node': the shape is the nodes' (known once they answer), so pflower-check counts
    no model (it raised a traceback asking for the image shape)."""
    assert check(ROOT, f"dataset='node' results-dir='{tmp_path / 'out'}'") is None


def test_the_app_is_positional_as_for_flwr_run_or_named(capsys, monkeypatch):
    """`pflower-check .` and `pflower-sim .` take the app as `flwr run .` does (it was refused as
    an unknown argument); `--app` still works, and two different ones are refused."""
    from pflower import check as C

    assert C.main([str(ROOT), "-c", "num-server-rounds=2"]) == 0
    assert C.main(["--app", str(ROOT), "-c", "num-server-rounds=2"]) == 0
    with pytest.raises(SystemExit):
        C.main([str(ROOT), "--app", "/tmp", "-c", "num-server-rounds=2"])
    assert "two app directories" in capsys.readouterr().err
    seen = []
    monkeypatch.setattr(launcher, "simulate", lambda app, *a, **k: (seen.append(app), (1, "finished:completed"))[1])
    monkeypatch.setattr(launcher, "_check_apart", lambda *a: None)
    assert launcher.main([str(ROOT), "-c", "num-server-rounds=1"]) == 0 and seen == [ROOT]

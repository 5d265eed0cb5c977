"""Checkpoints and resume: a resumed run continues exactly; bad resume-from values are refused."""

import json

import pytest
import torch
from conftest import assert_same_state, representatives, run_config
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from pflower.build import build_strategy
from pflower.checkpoint import CHECKPOINT, load_checkpoint
from pflower.client_app.store import KEEP, StateError, StateStore, decode, encode
from pflower.config import ConfigError, load_settings
from pflower.records import from_record, to_record

pytestmark = pytest.mark.usefixtures("no_figures")


def _run(grid_factory, results, rounds, resume="", extra=None, **kw):
    """A run of 3 clients of 60 samples in process (no figures drawn): its strategy and metrics.json."""
    kw = {"samples_per_client": 60, **kw}
    cfg = {**run_config(num_server_rounds=rounds, local_epochs=1, results_dir=str(results), resume_from=resume, **kw), **(extra or {})}
    settings = load_settings(cfg)
    checkpoint = load_checkpoint(settings) if resume else None
    strategy = build_strategy(settings)
    strategy.start(grid=grid_factory(cfg, 3), checkpoint=checkpoint)
    return strategy, json.loads((results / "metrics.json").read_text())


#: A first leg's last round sends its evaluation alone, where the uninterrupted run's rides on
#: the next round's messages (tests/test_single_message.py checks a resumption mid-run byte for byte).
SCHEDULE = {"wall-seconds", "bytes-down", "bytes-up", "cumulative-bytes-down", "cumulative-bytes-up", "relayed-bytes"}


def _without_time(rounds):
    return [{k: v for k, v in r.items() if k not in SCHEDULE} for r in rounds]


#: SuPerFed starts mixing at a share of num-server-rounds, so a 2-round first leg is another
#: schedule than the first half of a 4-round run; from round 1 on (start 0) the two are one run.
RESUMED = {**representatives(), "superfed": {**representatives()["superfed"], "superfed.start": 0.0}}


#: The data and step controls: a data seed apart from the seed, half the pool, 2 local steps.
CONTROLS = {"data-seed": 5, "data-fraction": 0.5, "local-steps": 2, "local-epochs": 5}


@pytest.mark.parametrize("method,extra", [*RESUMED.items(), ("heurpfedla", {"heurpfedla.top-k": 2}), ("superfed", {**RESUMED["superfed"], **CONTROLS})])
def test_resumed_run_equals_the_uninterrupted_run(tmp_path, grid_factory, method, extra):
    """2 rounds, then a new federation (fresh client contexts) resumes to 4: same metrics, same state.
    One method per server strategy (their example configs), HeurpFedLA retaining 2 layers, and
    SuPerFed (its hold-out drawn by the data seed) with the data and step controls."""
    kw = dict(method=method, fraction_train=0.67, extra=extra)
    full, full_doc = _run(grid_factory, tmp_path / "full", 4, **kw)
    _run(grid_factory, tmp_path / "first", 2, **kw)
    resumed, doc = _run(grid_factory, tmp_path / "second", 4, resume=str(tmp_path / "first"), **kw)
    assert [r["round"] for r in doc["rounds"]] == [1, 2, 3, 4]
    assert _without_time(doc["rounds"]) == _without_time(full_doc["rounds"])
    assert_same_state(full.state_dict(), resumed.state_dict())


def test_chained_resumption_is_exact(tmp_path, grid_factory):
    kw = dict(method="heurpfedla", fraction_train=0.34, heurpfedla__top_k=1)
    _, full = _run(grid_factory, tmp_path / "full", 5, **kw)
    _run(grid_factory, tmp_path / "a", 2, **kw)
    _run(grid_factory, tmp_path / "b", 3, resume=str(tmp_path / "a"), **kw)
    _, doc = _run(grid_factory, tmp_path / "c", 5, resume=str(tmp_path / "b"), **kw)
    assert _without_time(doc["rounds"]) == _without_time(full["rounds"])


def test_checkpoint_written_every_round(tmp_path, grid_factory):
    _run(grid_factory, tmp_path, 2, method="pfedla")
    raw = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    assert raw["round"] == 2 and raw["strategy"]["theta"].shape[0] == 3
    assert set(raw["strategy"]["hn"]) == {"emb", "w1", "b1", "w2", "b2", "w3", "b3", "hw", "hb"}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"lr": 0.05}, "run config key 'lr' = 0.05 is not allowed: differs from the checkpoint"),
        ({"num_server_rounds": 1}, "run config key 'num-server-rounds' = 1 is not allowed: must be >= 2"),
        ({"state_dir": "/elsewhere"}, "run config key 'state-dir' = '/elsewhere' is not allowed: differs from the checkpoint"),
        ({"data_seed": 3}, "run config key 'data-seed' = 3 is not allowed: differs from the checkpoint in .* \\(-1\\)"),
    ],
)
def test_incompatible_resume_is_refused(tmp_path, grid_factory, change, message):
    _run(grid_factory, tmp_path / "a", 2)
    cfg = run_config(**{"num_server_rounds": 3, "local_epochs": 1, "results_dir": str(tmp_path / "b"), "resume_from": str(tmp_path / "a"), **change})
    with pytest.raises(ConfigError, match=message):
        load_checkpoint(load_settings(cfg))


def test_a_checkpoint_older_than_a_key_resumes_only_with_its_default(tmp_path, grid_factory):
    """A checkpoint written before ``data-seed`` existed: its run had the default, which a resumed
    run must keep."""
    _run(grid_factory, tmp_path / "a", 2)
    raw = torch.load(tmp_path / "a" / CHECKPOINT, weights_only=True)
    raw["config"] = json.dumps({k: v for k, v in json.loads(raw["config"]).items() if k != "data-seed"})
    torch.save(raw, tmp_path / "a" / CHECKPOINT)
    cfg = run_config(num_server_rounds=3, local_epochs=1, samples_per_client=60, results_dir=str(tmp_path / "b"), resume_from=str(tmp_path / "a"))
    assert load_checkpoint(load_settings(cfg)).round == 2
    with pytest.raises(ConfigError, match="'data-seed' = 3 is not allowed: the checkpoint in .* predates this key, so its run had the default -1"):
        load_checkpoint(load_settings({**cfg, "data-seed": 3}))


def test_missing_or_corrupt_checkpoint_is_refused(tmp_path):
    settings = load_settings(run_config(resume_from=str(tmp_path)))
    with pytest.raises(ConfigError, match="no checkpoint.pt in that directory"):
        load_checkpoint(settings)
    (tmp_path / CHECKPOINT).write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="is not a readable pflower checkpoint"):
        load_checkpoint(settings)


def test_state_store_keeps_the_newest_rounds_and_loads_before_a_round(tmp_path):
    store = StateStore(7, tmp_path)
    for rnd in (1, 2, 4):
        state = RecordDict({"personal": to_record({"w": torch.full((2,), float(rnd))}), "meta": ConfigRecord({"r": rnd})})
        store.save("abc", rnd, state)
    files = sorted(p.name for p in (tmp_path / "abc" / "client-7").iterdir())
    assert files == [f"round-{r:06d}.state" for r in (2, 4)][-KEEP:]
    got = store.load("abc", before_round=4)
    assert torch.equal(from_record(got["personal"])["w"], torch.full((2,), 2.0)) and got["meta"]["r"] == 2
    assert store.load("abc", before_round=2) is None and store.load("other", before_round=9) is None
    for rnd in (5, 6, 7):  # the server has had no reply since round 2's: it names round 2 in each message
        store.save("abc", rnd, state, pinned=2)
    files = sorted(p.name for p in (tmp_path / "abc" / "client-7").iterdir())
    assert files == [f"round-{r:06d}.state" for r in (2, 4, 5, 6, 7)]
    store.save("abc", 8, state, pinned=7)
    assert sorted(p.name for p in (tmp_path / "abc" / "client-7").iterdir()) == [f"round-{r:06d}.state" for r in (7, 8)]


def _a_state() -> RecordDict:
    """Every kind of record a client keeps, arrays of several dtypes and shapes included."""
    arrays = {"w": torch.arange(6.0).reshape(2, 3), "d": torch.tensor([1.5], dtype=torch.float64), "n": torch.tensor(7), "e": torch.zeros(0, 4)}
    return RecordDict({"personal": to_record(arrays), "tables": ConfigRecord({"ids": [3, 1], "name": "x"}), "m": MetricRecord({"a": 0.25})})


def test_a_state_file_reads_back_exactly_and_any_cut_or_changed_byte_is_named(tmp_path):
    """Every prefix of a state file and every file with one byte changed is refused with the
    file's name (never read short, never as another state); the whole file reads back equal."""
    state = _a_state()
    data = encode(state)
    back = decode(data)
    assert set(back.keys()) == set(state.keys()) and dict(back["tables"]) == dict(state["tables"]) and dict(back["m"]) == dict(state["m"])
    assert_same_state(from_record(back["personal"]), from_record(state["personal"]))
    store = StateStore(1, tmp_path)
    path = store.save("L", 1, state)
    damaged = [data[:cut] for cut in range(len(data))] + [data[:i] + bytes([data[i] ^ 0x41]) + data[i + 1 :] for i in range(len(data))]
    for bad in damaged:
        path.write_bytes(bad)
        with pytest.raises(StateError, match=f"the saved client state {path} cannot be read"):
            store.load_round("L", 1)


def test_state_files_of_earlier_versions_are_read_and_pruned_with_the_new_ones(tmp_path):
    """``round-<r>.pt`` (``torch.save`` of each record's kind and plain values, as versions before
    this one wrote) resumes; a round saved both ways reads the new file; pruning takes both."""
    import io

    d = tmp_path / "L" / "client-2"
    d.mkdir(parents=True)
    for rnd in (1, 2):
        buf = io.BytesIO()
        torch.save({"personal": ("arrays", {"w": torch.full((2,), float(rnd))}), "meta": ("config", {"r": rnd})}, buf)
        (d / f"round-{rnd:06d}.pt").write_bytes(buf.getvalue())
    store = StateStore(2, tmp_path)
    old = store.load("L", before_round=3)
    assert torch.equal(from_record(old["personal"])["w"], torch.full((2,), 2.0)) and old["meta"]["r"] == 2
    assert torch.equal(from_record(store.load_round("L", 1)["personal"])["w"], torch.full((2,), 1.0))
    store.save("L", 2, RecordDict({"personal": to_record({"w": torch.full((2,), 9.0)})}))
    assert torch.equal(from_record(store.load_round("L", 2)["personal"])["w"], torch.full((2,), 9.0))
    store.save("L", 3, RecordDict({"personal": to_record({"w": torch.full((2,), 3.0)})}))
    assert sorted(p.name for p in d.iterdir()) == ["round-000002.pt", "round-000002.state", "round-000003.state"]
    store.save("L", 4, RecordDict({"personal": to_record({"w": torch.full((2,), 4.0)})}))
    assert sorted(p.name for p in d.iterdir()) == ["round-000003.state", "round-000004.state"]


@pytest.mark.parametrize("method", ["fedavg", "federico"])
def test_a_running_client_whose_saved_state_is_gone_stops_the_run(tmp_path, grid_factory, method):
    """Its context names the file (it keeps no copy): the file deleted between two rounds stops
    the run with the client's line, and no client trains from another state."""
    import shutil

    from pflower.state_round import MissingStateError

    cfg = {
        **run_config(method=method, num_server_rounds=3, local_epochs=1, samples_per_client=60, results_dir=str(tmp_path / "r")),
        **representatives().get(method, {}),
    }
    grid = grid_factory(cfg, 3)
    push = grid.push_messages

    def wipe_before_round_2(messages):
        messages = list(messages)
        if any(m.content.config_records.get("config", {}).get("server-round") == 2 for m in messages if m.has_content()):
            shutil.rmtree(tmp_path / "r" / "client-state", ignore_errors=True)
        return push(messages)

    grid.push_messages = wipe_before_round_2
    with pytest.raises(MissingStateError, match=r"^client \d has no saved state of round 1 \(lineage"):
        build_strategy(load_settings(cfg)).start(grid=grid)
    rounds = json.loads((tmp_path / "r" / "metrics.json").read_text())["rounds"] if (tmp_path / "r" / "metrics.json").exists() else []
    assert [r["round"] for r in rounds] == [1]


def test_state_store_loads_exactly_the_round_named_or_says_what_it_searched(tmp_path):
    """``load_round`` takes the round's file from the chain of roots (copied forward), never a
    neighbour's; without it, one line names the client, lineage, round, folders and what it found."""
    from pflower.state_round import MissingStateError

    old = StateStore(4, tmp_path / "old")
    for rnd in (2, 3):
        old.save("L", rnd, RecordDict({"personal": to_record({"w": torch.full((1,), float(rnd))})}))
    store = StateStore(4, tmp_path / "new", tmp_path / "old")
    assert torch.equal(from_record(store.load_round("L", 2)["personal"])["w"], torch.full((1,), 2.0))
    assert (tmp_path / "new" / "L" / "client-4" / "round-000002.state").is_file()
    with pytest.raises(MissingStateError) as err:
        store.load_round("L", 5)
    assert str(err.value).startswith("client 4 has no saved state of round 5 (lineage L)")
    assert f"searched {tmp_path / 'new' / 'L' / 'client-4'}, {tmp_path / 'old' / 'L' / 'client-4'}; found only rounds [2, 3]" in str(err.value)
    with pytest.raises(MissingStateError, match="found none. It does not train from another state: put state-dir on a shared filesystem"):
        StateStore(9, tmp_path / "new").load_round("L", 1)


def test_a_saved_pointer_reads_its_own_file_and_a_save_links_the_run_it_resumed(tmp_path):
    """What a context's pointer names is read from the primary root directly (a damaged file is
    named; a missing one is searched for as ``load_round`` does); a store that resumed another
    run names that run in its lineage folder on its first save, so a run resumed from it later
    finds the states of clients that trained only before (a chain)."""
    from pflower.client_app.store import LINK
    from pflower.state_round import MissingStateError

    store = StateStore(4, tmp_path / "new", tmp_path / "old")
    assert not (tmp_path / "new" / "L" / LINK).exists()
    path = store.save("L", 3, RecordDict({"personal": to_record({"w": torch.full((2,), 3.0)})}))
    assert json.loads((tmp_path / "new" / "L" / LINK).read_text()) == [str(tmp_path / "old")]
    assert torch.equal(from_record(store.load_saved("L", 3)["personal"])["w"], torch.full((2,), 3.0))
    StateStore(4, tmp_path / "old").save("L", 2, RecordDict({"personal": to_record({"w": torch.full((2,), 2.0)})}))
    assert torch.equal(from_record(store.load_saved("L", 2)["personal"])["w"], torch.full((2,), 2.0))
    with pytest.raises(MissingStateError, match=r"^client 4 has no saved state of round 7 \(lineage L\)"):
        store.load_saved("L", 7)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(StateError, match=f"^the saved client state {path} cannot be read"):
        store.load_saved("L", 3)


def test_the_round_each_client_last_trained_in_is_sent_and_checkpointed(tmp_path, grid_factory):
    """Each message names the round in which its client last trained (0: never), as the messages
    sent so far say; the checkpoint keeps those rounds and a resumed strategy has them back."""
    from pflower.state_round import STATE_ROUND

    cfg = run_config(method="fedper", num_server_rounds=3, local_epochs=1, samples_per_client=60, fraction_train=0.34, results_dir=str(tmp_path / "a"))
    grid = grid_factory(cfg, 3)
    strategy = build_strategy(load_settings(cfg))
    strategy.start(grid=grid)
    client = {n: c.node_config["partition-id"] for n, c in grid.contexts.items()}
    last: dict[int, int] = {}
    for msg in grid.sent:  # in the order sent: trainings of a round before its evaluations
        if msg.metadata.message_type == "query":
            continue
        cid = client[msg.metadata.dst_node_id]
        for name in ("config", "evaluate"):  # its own, and the evaluation riding on it
            if name in msg.content.config_records:
                assert msg.content[name][STATE_ROUND] == last.get(cid, 0), (msg.metadata.message_type, name, msg.content[name]["server-round"], cid)
        if msg.metadata.message_type == "train":
            last[cid] = msg.content["config"]["server-round"]
    assert len(set(last.values())) > 1 and strategy.federation.trained == last
    ckpt = load_checkpoint(load_settings({**cfg, "resume-from": str(tmp_path / "a"), "results-dir": str(tmp_path / "b"), "num-server-rounds": 4}))
    assert ckpt.strategy["trained-in"] == last
    resumed = build_strategy(load_settings(cfg))
    resumed.federation.load_state_dict(ckpt.strategy)
    assert resumed.federation.trained == last


def test_a_checkpoint_older_than_state_round_names_no_round(tmp_path):
    """A checkpoint without the rounds clients last trained in: messages name none, and the
    clients restore the newest state saved before the round, as before the key."""
    from flwr.app import ConfigRecord as Config

    from pflower.state_round import STATE_ROUND
    from pflower.strategies.federation import Federation

    federation = Federation()
    federation.node_of, federation.client_of = {0: 10}, {10: 0}
    federation.load_state_dict({"num-clients": 1, "num-examples": {0: 5}})
    federation.trained_in(3, [0])
    (msg,) = federation.messages([0], "train", {0: ArrayRecord()}, Config({"server-round": 4}))
    assert federation.trained is None and STATE_ROUND not in msg.content["config"]


def test_state_found_in_a_fallback_root_is_copied_forward(tmp_path):
    StateStore(1, tmp_path / "old").save("L", 3, RecordDict({"personal": ArrayRecord()}))
    store = StateStore(1, tmp_path / "new", tmp_path / "old")
    assert store.load("L", before_round=4) is not None
    assert (tmp_path / "new" / "L" / "client-1" / "round-000003.state").is_file()


def test_bad_resumed_from_links_are_ignored_and_chains_are_bounded(tmp_path):
    """A link file a client cannot use (not a list, names that are not paths, a cycle, more
    roots than a chain may have) never stops a client: it searches what it can."""
    import json

    from pflower.client_app.store import LINK, MAX_CHAIN

    store = StateStore(1, tmp_path / "c", tmp_path / "b")
    for bad in ("null", "5", '"/etc"', "{", json.dumps([str(tmp_path / "c"), 3, None, ""])):
        (tmp_path / "b" / "L").mkdir(parents=True, exist_ok=True)
        (tmp_path / "b" / "L" / LINK).write_text(bad)
        assert store.chain("L") == [tmp_path / "c", tmp_path / "b"]
    (tmp_path / "b" / "L" / LINK).write_text(json.dumps([str(tmp_path / f"r{i}") for i in range(3 * MAX_CHAIN)]))
    assert len(store.chain("L")) == MAX_CHAIN


def test_resumed_with_no_round_left_the_held_evaluation_still_goes(tmp_path, grid_factory, monkeypatch):
    """A crash before round 3's checkpoint leaves round 2's evaluation held in the checkpoint of
    round 2; resumed with num-server-rounds=2 there is no round to carry it: it goes alone and
    round 2's row has the evaluation the uninterrupted run has."""
    from pflower.strategies import loop

    kw = dict(method="fedper")
    _, full = _run(grid_factory, tmp_path / "full", 3, **kw)
    real = loop.save_checkpoint

    def crash(directory, ckpt):
        if ckpt.round == 3:
            raise RuntimeError("died")
        return real(directory, ckpt)

    monkeypatch.setattr(loop, "save_checkpoint", crash)
    with pytest.raises(RuntimeError, match="died"):
        _run(grid_factory, tmp_path / "first", 3, **kw)
    monkeypatch.setattr(loop, "save_checkpoint", real)
    _, doc = _run(grid_factory, tmp_path / "second", 2, resume=str(tmp_path / "first"), **kw)
    assert [r["round"] for r in doc["rounds"]] == [1, 2]
    assert doc["rounds"][1]["evaluated"] == 3 and doc["rounds"][1]["per-client-accuracy"] == full["rounds"][1]["per-client-accuracy"]


def test_relative_state_folders_resolve_against_the_working_directory_of_each_message(tmp_path, monkeypatch):
    """A relative results-dir (or a node's relative state-dir) names a folder under the working
    directory the client has when it saves: a process that changes directory between two runs of
    one run config saves the second run's states under the second directory, not the first's
    (the store is cached per process)."""
    import importlib

    from flwr.app import Context

    client_app = importlib.import_module("pflower.client_app.app")
    settings = load_settings(run_config(results_dir="results"))
    rt = client_app.Runtime(settings, 3, 4, None, None, None)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        here = (tmp_path / name).resolve()
        plain = Context(1, 1, {"partition-id": 3, "num-partitions": 4}, RecordDict(), {})
        node = Context(1, 1, {"partition-id": 3, "num-partitions": 4, "state-dir": "states"}, RecordDict(), {})
        assert rt.store(plain).roots == settings.state_paths == [here / "results" / "client-state"]
        assert rt.store(node).roots == [here / "states"]


def _reply_lost(client: int, nth: int):
    """A tamper that turns ``client``'s ``nth`` training reply into an error reply: the client
    trained and saved its state, the server never got the reply (lost, late)."""
    from flwr.app import Error
    from flwr.app.message.message import make_message

    seen = []

    def tamper(cid, reply):
        if cid == client and reply.metadata.message_type == "train" and not reply.has_error():
            seen.append(1)
            if len(seen) == nth:
                return make_message(reply.metadata, error=Error(0, "lost"))
        return reply

    return tamper


def test_a_resume_after_a_lost_training_reply_equals_the_uninterrupted_run(tmp_path, grid_factory):
    """Client 0's round-2 training reply is lost: the server still names round 1 as the round it
    last trained in. The run resumed after round 2 (a fresh context) trains client 0 from its
    round-1 state, as named; the uninterrupted run must do the same, not train from the round-2
    state its context still points to."""
    kw = dict(method="fedper", fraction_train=1.0)

    def grid(tamper):
        return lambda cfg, n: grid_factory(cfg, n, tamper=tamper)

    _, full = _run(grid(_reply_lost(0, 2)), tmp_path / "full", 3, **kw)
    _run(grid(_reply_lost(0, 2)), tmp_path / "first", 2, **kw)
    _, doc = _run(grid_factory, tmp_path / "second", 3, resume=str(tmp_path / "first"), **kw)
    assert _without_time(doc["rounds"]) == _without_time(full["rounds"])

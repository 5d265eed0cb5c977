"""Every method, two schedules, in process: the metrics.json rows and the saved client states'
digests, written as one JSON file, so a refactor's numbers can be compared byte for byte with
the code before it (run it on both and ``cmp`` the files; the same machine, since the last
digits follow the CPU).

    python bench/numbers_digest.py OUT.json

The setting is the resume sweep's (tests/test_resume_sweep.py): 3 clients of digits, 60 samples
each, 2 of them training a round; evaluation every round on the next round's messages, and every
2nd round by 2 clients in phases of their own. About 25 s on 2 cores.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import InProcessGrid, run_config  # noqa: E402

from pflower.build import build_strategy  # noqa: E402
from pflower.config import load_settings  # noqa: E402
from pflower.methods import declarations  # noqa: E402

client_app = importlib.import_module("pflower.client_app.app")
SCHEDULES = {
    "evaluate-every-1": {"num-server-rounds": 4, "evaluate-every": 1, "fraction-train": 0.67},
    "evaluate-every-2": {"num-server-rounds": 5, "evaluate-every": 2, "fraction-train": 0.67, "fraction-evaluate": 0.67, "single-message": False},
}


def digest(method: str, schedule: dict) -> dict:
    """One run's rows (without wall time) and each saved state file's SHA-256 by client and round."""
    for cache in (client_app._shared, client_app._runtime, client_app._store):
        cache.cache_clear()
    with tempfile.TemporaryDirectory() as d:
        cfg = {**run_config(local_epochs=1, samples_per_client=60), **declarations()[method].example, "method": method, **schedule, "results-dir": d}
        settings = load_settings(cfg)
        build_strategy(settings).start(grid=InProcessGrid(client_app.app, cfg, 3))
        rows = json.loads((settings.results_path / "metrics.json").read_text())["rounds"]
        states = {f"{p.parent.name}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(d).rglob("*.state"))}
    return {"rows": [{k: v for k, v in r.items() if k != "wall-seconds"} for r in rows], "states": states}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = {}
    for method in declarations():
        for name, schedule in SCHEDULES.items():
            out[f"{method}/{name}"] = digest(method, schedule)
            print(f"{method} {name}", file=sys.stderr, flush=True)
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

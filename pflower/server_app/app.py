"""The ServerApp: validate the run config, build the method's strategy, run it (or resume it)."""

from __future__ import annotations

import logging
from logging import ERROR, INFO, WARNING
from pathlib import Path

import torch
from flwr.app import ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from pflower.build import build_strategy, check_data, check_model
from pflower.checkpoint import load_checkpoint
from pflower.config import ConfigError, check_held, check_server, load_settings
from pflower.datasets.node import CLASS_NAMES
from pflower.device import deterministic_kernels
from pflower.run_folder import RESULTS, FolderBusyError, claimed, clear_run, new_run_folder
from pflower.state_round import MissingStateError
from pflower.strategies.federation import Federation, NoClientsError, window_for
from pflower.strategies.grouped_grid import NodeGroupError
from pflower.strategies.loop import RoundFailedError

#: Failures whose message says everything: logged as one ERROR line, without a traceback.
CLEAR_FAILURES = (ConfigError, FolderBusyError, RoundFailedError, NoClientsError, MissingStateError, NodeGroupError)

app = ServerApp()


class _ClearFailureWithoutTraceback(logging.Filter):
    """Flower logs a failing ServerApp with its traceback; a bad run config needs only its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], CLEAR_FAILURES):
            record.exc_info = None
            record.exc_text = None
        return True


logging.getLogger("flwr").addFilter(_ClearFailureWithoutTraceback())


@app.main()
def main(grid: Grid, context: Context) -> None:
    deterministic_kernels()  # the server trains too (pFedLA's and pFedHN's hypernetworks)
    try:
        settings = load_settings(context.run_config)
        torch.set_num_threads(settings.server_threads)
        check_server(settings)
        if settings.simulated_clients and window_for(grid) is None:
            raise ConfigError([("simulated-clients", settings.simulated_clients, "simulation only: a deployed SuperNode serves one client")])
        check_data(settings)  # the data as the clients will open it: a run on wrong data never starts
        check_model(settings)  # the model the data asks for fits a client; a run refused writes no folder
        if not settings.results_dir:  # a folder of the run's own
            folder = new_run_folder(settings.results_path, settings.method)
            settings = settings.model_copy(update={"results_dir": str(Path(RESULTS) / folder.name)})
            log(INFO, "Results of this run: %s", folder)
        settings.results_path.mkdir(parents=True, exist_ok=True)
        with claimed(settings.results_path):  # one run at a time in a folder: checked again once held
            check_held(settings)
            checkpoint = load_checkpoint(settings) if settings.resume_from else None
            if settings.overwrite and not settings.continues_in_place and (removed := clear_run(settings.results_path)):
                log(WARNING, "overwrite=true: removed the previous run's %s from %s", ", ".join(removed), settings.results_path)
            if settings.node_data:  # the nodes say what their data is; the server opens no data file
                federation = Federation(settings.seed)
                federation.discover(grid, settings.round_timeout)
                shape, names = federation.agree_on_data()
                log(INFO, "Nodes' own data: images %s, %d classes (%s)", shape, len(names), ", ".join(names[:12]))
                strategy = build_strategy(settings, shape, len(names))
                strategy.federation = federation
                config = ConfigRecord({CLASS_NAMES: names})
                strategy.start(grid=grid, checkpoint=checkpoint, train_config=config, evaluate_config=config)
            else:
                build_strategy(settings).start(grid=grid, checkpoint=checkpoint)
    except CLEAR_FAILURES as err:  # bad keys or resume-from, too few valid replies, no clients, a client's state missing
        log(ERROR, "%s", err)
        raise

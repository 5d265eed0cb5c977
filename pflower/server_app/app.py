"""The ServerApp: validate the run config, build the method's strategy, run it (or resume it)."""

from __future__ import annotations

import logging
from logging import ERROR

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from pflower.checkpoint import load_checkpoint
from pflower.config import ConfigError, check_results_dir, load_settings
from pflower.methods import build_strategy
from pflower.strategies.federation import NoClientsError
from pflower.strategies.loop import RoundFailedError

#: Failures whose message says everything: logged as one ERROR line, without a traceback.
CLEAR_FAILURES = (ConfigError, RoundFailedError, NoClientsError)

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
    try:
        settings = load_settings(context.run_config)
        check_results_dir(settings)
        strategy = build_strategy(settings)
        checkpoint = load_checkpoint(settings) if settings.resume_from else None
        strategy.start(grid=grid, checkpoint=checkpoint)
    except CLEAR_FAILURES as err:  # bad keys or resume-from, too few valid replies, no clients
        log(ERROR, "%s", err)
        raise

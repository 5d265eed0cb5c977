"""The ServerApp: validate the run config, build the method's strategy, run it."""

from __future__ import annotations

import logging
from logging import ERROR

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from pflower.config import ConfigError, load_settings
from pflower.methods import build_strategy

app = ServerApp()


class _ConfigErrorWithoutTraceback(logging.Filter):
    """Flower logs a failing ServerApp with its traceback; a bad run config needs only its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ConfigError):
            record.exc_info = None
            record.exc_text = None
        return True


logging.getLogger("flwr").addFilter(_ConfigErrorWithoutTraceback())


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        strategy = build_strategy(load_settings(context.run_config))
    except ConfigError as err:  # bad keys, or values the chosen model cannot take (top-k)
        log(ERROR, "%s", err)
        raise
    strategy.start(grid=grid)

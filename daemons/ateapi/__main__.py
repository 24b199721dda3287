"""ateapi: parse flags, configure logging, run until SIGTERM."""

from __future__ import annotations

import sys

import anyio
import structlog

from daemons._common import gc_tuning
from daemons._common.logging import configure_logging
from daemons.ateapi import settings as settings_mod
from daemons.ateapi.wiring import run


def main(argv: list[str] | None = None) -> int:
    settings = settings_mod.parse(argv)
    configure_logging(settings.log_level)
    structlog.get_logger("substrate.ateapi").info("starting", **settings.redacted())
    try:
        gc_tuning.tune()
        anyio.run(run, settings)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

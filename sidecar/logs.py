"""Structured JSON logs, built explicitly (no global structlog configuration).

Prompt and completion text never go into a log line; only ids, counts and states do.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.typing import FilteringBoundLogger


def make_logger(stream: TextIO | None = None, level: str = "info") -> FilteringBoundLogger:
    """A JSON-lines logger writing to ``stream`` (stderr by default) at ``level`` and above."""
    logger: FilteringBoundLogger = structlog.wrap_logger(
        structlog.PrintLogger(file=stream or sys.stderr),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(sort_keys=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
    )
    return logger

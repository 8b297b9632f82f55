"""Logging set-up: one line per event, plain or JSON (for log shippers)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            event.update(extra)
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str)


def setup_logging(level: str = "INFO", json_logs: bool = False) -> None:
    """Configure the root logger once for a service process."""
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter())
    else:
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        fmt.converter = time.gmtime
        handler.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # transformers/huggingface_hub draw tqdm bars ("Loading weights: 100%|███|") on stderr: in a service
    # log they are noise, and they break one-event-per-line. Read at their import, which comes later.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def adopt_logger(name: str) -> None:
    """A library logger with its own handler (DeepSpeed: stdout, its own format) logs through ours instead."""
    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.propagate = True

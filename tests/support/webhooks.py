"""The webhook tests' helpers: settings with a webhook URL and its secret, and one pass of ``fleetctl serve``."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from controller.serve.daemon import serve_forever
from controller.service import Session
from controller.settings import ControllerSettings


def with_hooks(controller: ControllerSettings, tmp_path: Path, url: str) -> ControllerSettings:
    secret = tmp_path / "webhook.key"
    secret.write_text("a-shared-webhook-secret-0123456789\n")
    secret.chmod(0o600)
    return controller.model_copy(update={"webhook_urls": (url,), "webhook_secret_file": secret})


def serve_once(settings: ControllerSettings) -> str:
    out = io.StringIO()
    with Session(settings) as s:
        serve_forever(s, interval=0.1, once=True, console=Console(file=out, width=200))
    return out.getvalue()

"""``fleetctl`` verbs that start something and stay with it: serve (the controller service), demo (a simulated fleet).

What they run is imported when they run (:mod:`controller.serve.daemon`, :mod:`controller.cli.demo`).

Lazy imports: the daemon loads the run history, the settings (pydantic) and rich (34 ms of CPU alone,
``bench/import_costs.py``), the demo the simulator: ``fleetctl --help`` imports this module with every verb's and
costs ~0.14 s of CPU in all (``bench/cli.py``: bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from controller.cli.invocation import session
from controller.cli.output import stderr, stdout


def serve(
    ctx: typer.Context,
    interval: float = typer.Option(1.0, "--interval", help="seconds between syncs"),
    once: bool = typer.Option(False, "--once", help="sync every running run once and exit"),
    api_port: int | None = typer.Option(None, "--api-port", help="serve the HTTP API on this port (api_port)"),
    api_host: str | None = typer.Option(None, "--api-host", help="bind address of the HTTP API (api_host)"),
    tokens: Path | None = typer.Option(None, "--tokens", help="bearer tokens of the API: USER ROLE TOKEN a line, "
                                                               "mode 0600 (with --new-token: the file added to)"),
    webhook: list[str] = typer.Option([], "--webhook", help="POST each verdict to this URL (repeatable)"),
    webhook_secret: Path | None = typer.Option(None, "--webhook-secret-file", help="HMAC key of the webhooks"),
    new_token: bool = typer.Option(False, "--new-token", help="print a fresh random token; with --tokens FILE, "
                                                               "also add it to FILE (created or rewritten mode 0600)"),
    user: str | None = typer.Option(None, "--user", help="with --new-token --tokens: whose token it is (default: "
                                                         "$FLEET_USER, else the OS user)"),
    role: str | None = typer.Option(None, "--role", help="with --new-token --tokens: read, trigger (start runs, "
                                                         "cancel its own; the default) or admin (also others' work)"),
) -> None:
    """Controller service: history kept in step with the broker, verdicts, /metrics, HTTP API, webhooks,
    scheduled golden checks (settings golden_*)."""
    if (user is not None or role is not None) and not (new_token and tokens is not None):
        raise typer.BadParameter("--user and --role name the owner of a token added with --new-token --tokens FILE")
    if new_token:
        from controller.identity import local_user
        from controller.serve.tokens import Identity, add_token, parse_role
        from controller.serve.tokens import new_token as make_token

        token = make_token()
        if tokens is not None:
            who = Identity(user or local_user(), parse_role(role or "trigger"))
            count = add_token(tokens, token, who)
            sys.stderr.write(f"added a token of user {who.user}, role {who.role.value}, to {tokens} (mode 0600, "
                             f"{count} token{'s' if count > 1 else ''})\n")
        print(token)
        return
    from controller.serve.daemon import serve_forever

    s = session(ctx)
    overrides: dict[str, object] = {k: v for k, v in (("api_port", api_port), ("api_host", api_host),
                                                       ("api_tokens_file", tokens),
                                                       ("webhook_secret_file", webhook_secret)) if v is not None}
    if webhook:
        overrides["webhook_urls"] = tuple(webhook)
    if overrides:
        s.settings = type(s.settings).model_validate({**s.settings.model_dump(), **overrides})
    serve_forever(s, interval=interval, once=once, console=stderr())


def demo(
    devices: int = typer.Option(4, "--modules", min=1, max=64, help="how many simulated modules"),
    old_devices: int | None = typer.Option(None, "--devices", min=1, max=64, hidden=True,
                                           help="old name of --modules (--devices is a selector on every other verb)"),
    models: str = typer.Option("all", "--models", "-m", help="model keys, comma separated, or 'all'"),
    noise: float = typer.Option(0.01, "--noise", min=0.0, max=0.5, help="relative noise of the simulated modules"),
    slow: float | None = typer.Option(None, "--slow", help="one module runs this factor slower (e.g. 1.12)"),
    throttle: bool = typer.Option(False, "--throttle", help="the slow module is slow because its device throttles"),
    regress: list[str] = typer.Option([], "--regress", help="MODEL_KEY:METRIC:FRACTION, release worse by that"),
    seed: int = typer.Option(1, "--seed", help="seed of the simulated release's and modules' noise"),
    time_scale: float = typer.Option(50.0, "--time-scale", min=1.0, help="simulated modules run N x real time"),
    out_dir: Path = typer.Option(Path("demo-out"), "--out", help="folder where the demo keeps everything"),
    real: int = typer.Option(0, "--real", min=0, max=8,
                             help="also N real-engine modules on this CPU (needs make engine)"),
    engine: str = typer.Option("transformers", "--engine",
                               help="the real modules' engine: transformers (transformers serve; five keys) or "
                                    "llama.cpp (llama-server; all seven keys)"),
) -> int:
    """Simulated fleet on this machine validates a freshly built simulated release (embedded broker)."""
    from contract.records import parse_model_keys
    from controller.cli.demo import DemoOptions, run_demo

    opts = DemoOptions(devices=old_devices or devices, models=parse_model_keys(models), noise=noise, slow=slow,
                       throttle=throttle, regress=tuple(regress), seed=seed, time_scale=time_scale, out_dir=out_dir,
                       real=real, engine=engine)
    return run_demo(opts, stdout(), stderr())

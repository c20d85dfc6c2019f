"""The ``tandem`` command line: one module per command, each parsing, calling one library
function and printing. Commands load lazily, so ``tandem render`` never imports the bench.

Exit codes are named in ``ExitCode`` and assigned in one place, ``main``: a ``TandemError``
becomes its message on stderr and ``USER_ERROR`` (or ``CHECK_FAILED``); anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from enum import IntEnum

import click

from tandem import screen
from tandem.errors import CheckFailed, TandemError
from tandem.interrupts import Interrupted, raise_on_termination
from tandem.redact import forget_secrets


class ExitCode(IntEnum):
    SUCCESS = 0
    CHECK_FAILED = 1
    USER_ERROR = 2
    # 3-6: `tandem status`'s verdict when it is not healthy
    # (tandem.operations.health.Verdict.exit_code)
    INTERRUPTED = 130


# name -> (module, one-line summary); the order is the order of `tandem --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": (
        "tandem.cli.plan",
        "Memory, KV pool, concurrency and decode roofline of a deployment.",
    ),
    "check": ("tandem.cli.check", "Preflight the nodes; refuse to launch on a real fault."),
    "render": ("tandem.cli.render", "Print each rank's exact command and environment."),
    "up": ("tandem.cli.lifecycle", "Launch every rank, workers first, and wait until it answers."),
    "status": ("tandem.cli.lifecycle", "Show a deployment's ranks and endpoint."),
    "logs": ("tandem.cli.lifecycle", "Show or follow the ranks' logs."),
    "down": ("tandem.cli.lifecycle", "Stop every rank and remove what up created."),
    "supervise": ("tandem.cli.supervise", "Restart the whole group when a rank dies."),
    "service": ("tandem.cli.service", "Run a deployment as a systemd service (install, status)."),
    "upgrade": (
        "tandem.cli.upgrade",
        "Move a running deployment to a new recipe behind a gate; roll back on failure.",
    ),
    "rollback": ("tandem.cli.upgrade", "Start an earlier revision of a deployment again."),
    "history": ("tandem.cli.upgrade", "List a deployment's revisions and what changed."),
    "sync": ("tandem.cli.sync", "Make every node hold the same image and model snapshot."),
    "chat": ("tandem.cli.lifecycle", "Send one chat message to a deployment and print the answer."),
    "bench": ("tandem.cli.bench", "Measure serving performance of an OpenAI-compatible endpoint."),
    "eval": ("tandem.cli.eval", "Evaluate answer quality (GPQA-Diamond) against an endpoint."),
    "watch": ("tandem.cli.watch", "Sample a running deployment over time; judge the soak."),
    "model": ("tandem.cli.model", "Build local models (the tiny random-weight DeepSeek)."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _) in COMMANDS.items() if _importable(module)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not _importable(COMMANDS[name][0]):
            return None
        module = importlib.import_module(COMMANDS[name][0])
        return getattr(module, name.replace("-", "_") + "_command")

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tandem")
def cli() -> None:
    """Serve one large model across several nodes with vLLM, and prove that it works.

    \b
    Examples:
      tandem model tiny                          # build the tiny local DeepSeek model
      tandem up tiny-local                       # two ranks on this machine, TP=2
      tandem render deepseek-v4-flash --cluster examples/dgx-spark-pair.yaml
      tandem bench --url http://10.77.0.1:8000 --model tiny --concurrency 1,2,4 --out runs/b1
    """


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and turn tandem's errors into messages and exit codes. Every line goes
    through ``tandem.screen`` (redacted, control characters escaped), the log's too."""
    raise_on_termination()
    forget_secrets()  # an earlier command's --api-key (the tests run many in one process)
    _log_through_screen()
    try:
        code = cli.main(args=argv, prog_name="tandem", standalone_mode=False)
        if isinstance(code, int) and code:  # a command's own exit status (`status`)
            return code
    except CheckFailed as exc:
        screen.echo(f"error: {exc}", err=True)
        return ExitCode.CHECK_FAILED
    except TandemError as exc:
        screen.echo(f"error: {exc}", err=True)
        return ExitCode.USER_ERROR
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show(file=screen.err_stream)
        return ExitCode.USER_ERROR
    except Interrupted as exc:
        screen.echo(f"interrupted ({exc})", err=True)
        return 128 + exc.signum
    except (KeyboardInterrupt, click.exceptions.Abort):
        screen.echo("interrupted", err=True)
        return ExitCode.INTERRUPTED
    return ExitCode.SUCCESS


def _log_through_screen() -> None:
    """tandem's loggers print through ``tandem.screen`` (once: ``main`` may run again)."""
    logger = logging.getLogger("tandem")
    if not any(getattr(h, "tandem_screen", False) for h in logger.handlers):
        handler = screen.log_handler()
        handler.tandem_screen = True  # type: ignore[attr-defined]
        logger.addHandler(handler)

"""The ``tandem`` command line: one module per command, each parsing, calling one library
function and printing. Commands load lazily, so ``tandem render`` never imports the bench.

Exit codes are named in ``ExitCode`` and assigned in one place, ``main``: a ``TandemError``
becomes its message on stderr and ``USER_ERROR`` (or ``CHECK_FAILED``); anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
from enum import IntEnum

import click

from tandem import screen
from tandem.cli.layout import HELP_OPTIONS
from tandem.errors import CheckFailed, TandemError
from tandem.interrupts import Interrupted, raise_on_termination
from tandem.redact import forget_secrets
from tandem.version import DISTRIBUTION, TANDEM_VERSION

EPILOG = """\b
Exit status (every command):
  0    done; `status`: healthy
  1    a check failed: preflight, smoke, a gate, a bench or soak limit, a plan that does
       not fit
  2    the command was refused: bad input, no such deployment or file (the message names
       the field and the fix)
  3-6  `status` only: starting, degraded, stalled, down
  130  interrupted (Ctrl-C); 128+N after signal N

\b
Output for scripts: --json where a command prints a result (always valid JSON, also
when there is nothing to list). Shell completion: eval "$(_TANDEM_COMPLETE=bash_source
tandem)" in ~/.bashrc (zsh_source, fish_source for those shells); recipe and deployment
names complete.
"""


class ExitCode(IntEnum):
    """The exit status of every command, written once (``tandem --help`` shows it)."""

    SUCCESS = 0
    CHECK_FAILED = 1
    USER_ERROR = 2
    # 3-6: `tandem status`'s verdict when it is not healthy
    # (tandem.operations.health.Verdict.exit_code)
    INTERRUPTED = 130


# name -> (module, one-line summary); grouped and ordered as `tandem --help` shows them.
SECTIONS: dict[str, dict[str, tuple[str, str]]] = {
    "Start here": {
        "recipes": ("tandem.cli.recipe", "List the built-in recipes and shipped examples."),
        "recipe": ("tandem.cli.recipe", "Show a recipe to copy; the recipe's JSON Schema."),
        "init": ("tandem.cli.init", "Write a recipe and a cluster for your model and nodes."),
        "model": ("tandem.cli.model", "Build local models; place a model on the nodes."),
    },
    "Deploy": {
        "plan": ("tandem.cli.plan", "Memory, KV pool, fit and decode speed of a deployment."),
        "check": ("tandem.cli.check", "Preflight the nodes; refuse to launch on a real fault."),
        "render": ("tandem.cli.render", "Print each rank's exact command and environment."),
        "sync": ("tandem.cli.sync", "Give every node the same image and model snapshot."),
        "up": ("tandem.cli.lifecycle", "Launch every rank and wait until the model answers."),
        "down": ("tandem.cli.lifecycle", "Stop every rank and remove what up created."),
    },
    "Operate": {
        "status": ("tandem.cli.lifecycle", "List deployments; one's verdict, endpoint, ranks."),
        "logs": ("tandem.cli.lifecycle", "Show or follow the ranks' logs; a support bundle."),
        "chat": ("tandem.cli.lifecycle", "Send one chat message and print the answer."),
        "supervise": ("tandem.cli.supervise", "Restart the whole group when a rank fails."),
        "front": ("tandem.cli.front", "One endpoint for every model, routed by model name."),
        "service": ("tandem.cli.service", "Run a deployment as a systemd service."),
        "upgrade": ("tandem.cli.upgrade", "Move to a new recipe behind a gate, or roll back."),
        "rollback": ("tandem.cli.upgrade", "Start an earlier revision of a deployment again."),
        "history": ("tandem.cli.upgrade", "List a deployment's revisions and what changed."),
        "dashboard": ("tandem.cli.dashboard", "Serve a read-only status page of a deployment."),
    },
    "Measure": {
        "bench": ("tandem.cli.bench", "Serving performance of an OpenAI-compatible endpoint."),
        "eval": ("tandem.cli.eval", "Answer quality: smoke checks after boot, GPQA-Diamond."),
        "watch": ("tandem.cli.watch", "Sample a deployment over hours; judge the soak."),
    },
}
COMMANDS: dict[str, tuple[str, str]] = {
    name: entry for section in SECTIONS.values() for name, entry in section.items()
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

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """Click's, with the nearest command named for a typo (``stauts``: ``status``)."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            near = difflib.get_close_matches(name, self.list_commands(ctx), n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            ctx.fail(f"No such command '{name}'.{hint} `tandem --help` lists them.")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        shown = set(self.list_commands(ctx))
        for title, commands in SECTIONS.items():
            rows = [(name, summary) for name, (_, summary) in commands.items() if name in shown]
            with formatter.section(title):
                formatter.write_dl(rows)


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@click.group(
    cls=LazyGroup,
    context_settings=HELP_OPTIONS,
    epilog=EPILOG,
)
@click.version_option(version=TANDEM_VERSION, prog_name=f"tandem ({DISTRIBUTION})")
def cli() -> None:
    """Serve one large model across several nodes with vLLM, and prove that it works.

    \b
    Examples:
      tandem recipes                             # the built-in recipes, one line each
      tandem model real && tandem up smollm2-local   # a real model, PP=2 on this machine
      tandem status                              # every deployment and its verdict
      tandem init --model Qwen/Qwen3-0.6B --config config.json --hosts 10.0.0.1,10.0.0.2
      tandem render deepseek-v4-flash --cluster examples/dgx-spark-pair.yaml
      tandem bench smollm2-local --concurrency 1,2,4 --out runs/b1
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
    except click.exceptions.NoArgsIsHelpError as exc:  # `tandem` alone: its help, no error
        screen.echo(exc.ctx.get_help() if exc.ctx else "")
        return ExitCode.SUCCESS
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

"""No function in ``tandem`` grows past 80 lines or 8 parameters, and the ones already past them
only shrink.

Lines count from a function's first decorator to its last line; parameters are every name it
takes but ``self`` and ``cls`` (``*args`` and ``**kwargs`` count one each). Read with ``ast``,
nothing imported. ``OVER`` lists each function past a limit today with its size: a new one
fails ``test_no_new_function_is_too_long_or_too_wide``, a listed one that grew fails
``test_listed_functions_do_not_grow``, and one that shrank under both limits or is gone fails
``test_the_list_names_only_what_is_still_over`` (so the entry goes, and the list only shrinks).
Run ``python tests/test_sizes.py`` to print today's list.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
MAX_LINES = 80
MAX_PARAMS = 8

OVER: dict[str, tuple[int, int]] = {
    "tandem/agent.py:model_facts": (102, 7),
    "tandem/backends/k8s.py:KubernetesBackend.up": (119, 6),
    "tandem/backends/local.py:up": (105, 6),
    "tandem/backends/processes.py:stop": (76, 9),
    "tandem/backends/pull.py:Pull.run": (94, 3),
    "tandem/bench/load_generator.py:LoadGenerator._run_point": (128, 5),
    "tandem/bench/timed_request.py:send_request": (59, 9),
    "tandem/check/fabric.py:run_fabric": (108, 8),
    "tandem/cli/bench.py:run_command": (153, 15),
    "tandem/cli/eval.py:gpqa_command": (119, 16),
    "tandem/cli/eval.py:smoke_command": (88, 7),
    "tandem/cli/watch.py:run_command": (98, 8),
    "tandem/eval/dataset.py:load_gpqa_csv": (83, 1),
    "tandem/eval/smoke.py:_tool_parts": (121, 1),
    "tandem/operations/health.py:judge": (98, 4),
    "tandem/operations/preflight.py:run_check": (118, 8),
    "tandem/operations/supervisor.py:supervise": (150, 8),
    "tandem/plan/kv.py:kv_layout": (91, 7),
    "tandem/plan/planner.py:plan_deployment": (183, 9),
    "tandem/plan/roofline.py:roofline": (83, 7),
    "tandem/readiness.py:wait_ready": (96, 10),
    "tandem/render/prometheus.py:alert_rules": (106, 2),
    "tandem/report/plan.py:plan_tables": (92, 1),
    "tandem/watch/summary.py:summarize": (115, 5),
}


def sizes() -> dict[str, tuple[int, int]]:
    """Every function of the package: ``path:qualname`` -> (lines, parameters)."""
    found: dict[str, tuple[int, int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(SRC).as_posix()

        def visit(node: ast.AST, prefix: str, where: str = where) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = f"{prefix}{child.name}"
                    first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                    args = child.args
                    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
                    params = len([a for a in named if a.arg not in ("self", "cls")])
                    params += (args.vararg is not None) + (args.kwarg is not None)
                    found[f"{where}:{name}"] = (child.end_lineno - first + 1, params)
                    visit(child, f"{name}.")
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")

        visit(tree, "")
    return found


def over_limits() -> dict[str, tuple[int, int]]:
    return {
        name: size for name, size in sizes().items() if size[0] > MAX_LINES or size[1] > MAX_PARAMS
    }


def test_no_new_function_is_too_long_or_too_wide():
    new = {name: size for name, size in over_limits().items() if name not in OVER}
    assert not new, (
        f"over {MAX_LINES} lines or {MAX_PARAMS} parameters (lines, parameters): {new}; split "
        "it along what its docstring names, or take a config model instead of its fields"
    )


def test_listed_functions_do_not_grow():
    now = sizes()
    grown = {
        name: (OVER[name], now[name])
        for name in OVER
        if name in now and (now[name][0] > OVER[name][0] or now[name][1] > OVER[name][1])
    }
    assert not grown, f"grew (was, now): {grown}"


def test_the_list_names_only_what_is_still_over():
    stale = sorted(set(OVER) - set(over_limits()))
    assert not stale, f"under the limits or gone now, remove from OVER: {stale}"


if __name__ == "__main__":
    for name, (lines, params) in sorted(over_limits().items()):
        sys.stdout.write(f'    "{name}": ({lines}, {params}),\n')

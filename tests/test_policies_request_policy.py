"""Request policies: classification order, caps/floors/opt-out, and the policy file (round trip, broken files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies import (
    AcceptanceEstimator,
    ClassPolicy,
    ControllerSettings,
    PolicyFile,
    PolicyFileError,
    RequestPolicy,
    StepCostModel,
    classify_prompt,
    load_policy,
)

POLICY = RequestPolicy(
    static_k=5,
    max_k=8,
    classes={"code": ClassPolicy(max_k=8, min_k=2), "chat": ClassPolicy(max_k=4)},
    model_classes={"my-coder": "code"},
    default_class="chat",
    model="openai/gpt-oss-120b",
    controller=ControllerSettings(hysteresis=0.05, refresh_every=8),
)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("def add(a, b):\n    return a + b", "code"),
        ("import numpy as np\nx = np.zeros(3)", "code"),
        ("Fix this: for (int i = 0; i < n; i++) { sum += i; }", "code"),
        ("```python\nprint('hi')\n```", "code"),
        ("What is 12 * 7?", "math"),
        ("Solve x^2 = 49 for x, given 3 + 4 = 7.", "math"),
        ("Natalia sold clips to 48 of her friends in April. How many clips did she sell?", "math"),
        ("Tell me about the history of Paris.", "chat"),
        ("I like this; it works.", "chat"),  # one semicolon in prose is not code
        ("Which class should I take next semester?", "chat"),  # "class" without a definition is not code
    ],
)
def test_builtin_classifier(prompt: str, expected: str) -> None:
    assert classify_prompt(prompt) == expected


def test_classification_order_extra_args_then_model_then_prompt_then_default() -> None:
    code_prompt = "def f(x):\n    return x"
    assert POLICY.classify({"peagle_class": "legal"}, "my-coder", code_prompt) == "legal"
    assert POLICY.classify({}, "my-coder", "Tell me a story") == "code"
    assert POLICY.classify(None, "other-model", code_prompt) == "code"
    assert POLICY.classify(None, "other-model", "Tell me a story") == "chat"
    assert POLICY.classify(None, None, None) == "chat"  # default_class
    with pytest.raises(ValueError, match="peagle_class"):
        POLICY.classify({"peagle_class": 3})


def test_views_carry_caps_floors_and_opt_out() -> None:
    code = POLICY.view("r1", prompt="def f(): pass")
    assert (code.cls, code.min_k, code.max_k, code.speculate) == ("code", 2, 8, True)
    chat = POLICY.view("r2", prompt="hello there")
    assert (chat.cls, chat.min_k, chat.max_k) == ("chat", 0, 4)
    math = POLICY.view("r3", prompt="What is 2 + 2?")  # no entry for "math": no floor, the policy's max_k as cap
    assert (math.cls, math.min_k, math.max_k) == ("math", 0, 8)
    out = POLICY.view("r4", {"peagle_speculate": False}, prompt="def f(): pass")
    assert out.speculate is False
    with pytest.raises(ValueError, match="true or false"):
        POLICY.view("r5", {"peagle_speculate": "no"})


def test_controller_built_from_the_policy_honours_it() -> None:
    ctl = POLICY.make_controller(StepCostModel({"base": 10.0}), AcceptanceEstimator(8))
    assert ctl.static_k == 5 and ctl.max_k == 8 and ctl.settings.hysteresis == 0.05
    views = [POLICY.view("a", prompt="hello"), POLICY.view("b", {"peagle_speculate": False}, prompt="def f(): pass")]
    d = ctl.decide(views)
    assert d.depth_for(views[0]) <= 4 and d.depth_for(views[1]) == 0


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_policy_file_round_trip(tmp_path: Path, suffix: str) -> None:
    path = PolicyFile.save(POLICY, tmp_path / f"policy{suffix}")
    assert load_policy(path) == POLICY
    if suffix == ".json":
        assert json.loads(path.read_text())["version"] == 1


def _write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = "version: 1\nstatic_k: 5\nmax_k: 8\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD + "classes:\n  code: {max_k: x}\n", "classes.code.max_k: must be an integer in [0, 8], got 'x'"),
        (GOOD + "classes:\n  code: {max_k: 9}\n", "classes.code.max_k: must be an integer in [0, 8], got 9"),
        (GOOD + "classes:\n  chat: {max_k: 4, min_k: 5}\n", "classes.chat.min_k: must be an integer in [0, 4], got 5"),
        (GOOD + "classes:\n  code: {maxk: 3}\n", "classes.code: unknown key(s) ['maxk']"),
        (GOOD + "hysterisis: 0.1\n", "unknown key(s) ['hysterisis']"),
        (GOOD + "controller: {hysteresis: 2}\n", "controller.hysteresis must be in [0, 1)"),
        (GOOD + "controller: {per_request: 'yes'}\n", "controller.per_request: must be true or false, got 'yes'"),
        (GOOD + "controller: {patience: 1.5}\n", "controller.patience: must be an integer, got 1.5"),
        (GOOD + "controller: {hysterisis: 0.1}\n", "controller: unknown key(s) ['hysterisis']"),
        (GOOD + "model_classes: {my-coder: 3}\n", "model_classes.my-coder: must be a non-empty class name string"),
        ("version: 2\nstatic_k: 5\nmax_k: 8\n", "version: must be 1"),
        ("version: 1\nstatic_k: 9\nmax_k: 8\n", "static_k: must be an integer in [0, 8], got 9"),
        ("version: 1\nstatic_k: 5\nmax_k: 17\n", "max_k: must be an integer in [0, 16], got 17"),
        ("version: 1\nmax_k: 8\n", "static_k: missing"),
        ("static_k: 5\nmax_k: 8\n", "version: missing"),
        ("- 1\n- 2\n", "must be a mapping"),
        ("version: 1\nstatic_k: [5\n", "not valid YAML"),
    ],
)
def test_broken_policy_files_name_the_key_and_the_rule(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(PolicyFileError) as info:
        load_policy(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)  # the file is named too


def test_missing_file_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="cannot read"):
        load_policy(tmp_path / "absent.yaml")
    with pytest.raises(PolicyFileError, match="not valid JSON"):
        load_policy(_write(tmp_path, "{'version': 1}", "policy.json"))


def test_policies_built_in_code_are_validated_too() -> None:
    with pytest.raises(PolicyFileError, match=r"static_k: must be an integer in \[0, 4\], got 5"):
        RequestPolicy(static_k=5, max_k=4)
    with pytest.raises(PolicyFileError, match=r"classes.code.min_k: must be an integer in \[0, 3\], got 4"):
        RequestPolicy(static_k=2, max_k=8, classes={"code": ClassPolicy(max_k=3, min_k=4)})

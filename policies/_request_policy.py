"""Request policies: which class a request belongs to, its depth cap/floor, opt-out, and the policy file.

Class of a request, first match wins:
1. ``extra_args["peagle_class"]`` (vLLM ``SamplingParams.extra_args``, set by the client per request);
2. the served model name, through the policy's ``model_classes`` mapping;
3. the built-in prompt classifier `classify_prompt` ("code", "math" or "chat");
4. ``default_class`` when there is no prompt text.

Opt-out: ``extra_args["peagle_speculate"] = False`` gives the request depth 0.

Policy file (YAML or JSON, format version 1)::

    version: 1
    model: openai/gpt-oss-120b          # optional, informational
    static_k: 5                         # offline-tuned depth, the controller's fallback
    max_k: 8                            # deepest depth (the drafter's K)
    default_class: chat
    classes:
      code: {max_k: 8, min_k: 2}
      chat: {max_k: 4}
    model_classes:
      my-coder: code
    controller: {hysteresis: 0.03, refresh_every: 16}

Unknown keys are errors; every error names the key path and what was expected.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from policies._controller import ControllerSettings, DepthController, RequestView
from policies._estimator import AcceptanceEstimator
from policies._step_cost import StepCostModel

__all__ = [
    "ClassPolicy",
    "MAX_K",
    "POLICY_FORMAT_VERSION",
    "PolicyFile",
    "PolicyFileError",
    "RequestPolicy",
    "classify_prompt",
    "load_policy",
]

POLICY_FORMAT_VERSION = 1
MAX_K = 16
"""Deepest depth a policy may name (matches autotune.spec.MAX_K)."""

CLASS_KEY = "peagle_class"
SPECULATE_KEY = "peagle_speculate"

_CODE_PATTERNS = re.compile(
    r"```|\bdef\s+\w+\s*\(|\bclass\s+\w+\s*[:(]|^\s*(?:from\s+[\w.]+\s+)?import\s+\w+|#include\s*<|"
    r"\bfunction\s+\w*\s*\(|\breturn\b[^.\n]*;|=>|\bpublic\s+(?:static\s+)?\w+",
    re.MULTILINE,
)
_CODE_CHARS = re.compile(r"[{};]")
_MATH_EXPR = re.compile(r"\d\s*[-+*/^=×÷<>]\s*\(?\s*\d|\\frac|\\sqrt|\$[^$]+\$")
_MATH_WORDS = re.compile(
    r"\b(?:how many|how much|calculate|compute|solve|what is the (?:sum|product|value|total)|total|percent|"
    r"equation|integral|derivative|probability)\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"\d")


def classify_prompt(text: str) -> str:
    """Built-in workload class of a prompt: "code", "math" or "chat". Pure function over the string.

    - code: a code fence, a definition (``def f(``, ``class A:``), an import line, ``#include <``, or at least three
      of the characters ``{``, ``}``, ``;``;
    - math: an arithmetic expression between digits (``3 + 4``, ``2^10``, LaTeX ``\\frac``), or a number together
      with a quantity word ("how many", "total", "calculate", ...), as in GSM8K word problems;
    - chat: anything else.

    Examples: ``classify_prompt("def add(a, b):")`` -> "code"; ``classify_prompt("What is 12 * 7?")`` -> "math";
    ``classify_prompt("Tell me about Paris")`` -> "chat".
    """
    if _CODE_PATTERNS.search(text) or len(_CODE_CHARS.findall(text)) >= 3:
        return "code"
    if _MATH_EXPR.search(text):
        return "math"
    if _NUMBER.search(text) and _MATH_WORDS.search(text):
        return "math"
    return "chat"


class PolicyFileError(ValueError):
    """A policy file (or dict) that breaks the format: the message names the file, the key path and the rule."""


@dataclass(frozen=True)
class ClassPolicy:
    """Depth limits for one request class."""

    max_k: int | None = None
    """Cap: the deepest depth requests of this class verify (None: the policy's max_k)."""
    min_k: int = 0
    """Floor: the depth they always verify when they speculate (capped by max_k)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"min_k": self.min_k}
        if self.max_k is not None:
            out["max_k"] = self.max_k
        return out


@dataclass(frozen=True)
class RequestPolicy:
    """Per-request speculation policy: classes with caps/floors, model-name mapping, opt-out, controller tunables.

    Build with `load_policy` / `RequestPolicy.from_dict`, or directly. `view` turns a request into the
    `RequestView` the `DepthController` takes.
    """

    static_k: int
    """Offline-tuned depth: the controller's fallback depth."""
    max_k: int
    """Deepest depth any request verifies (the drafter's K)."""
    classes: Mapping[str, ClassPolicy] = field(default_factory=dict)
    model_classes: Mapping[str, str] = field(default_factory=dict)
    """Served model name -> class (for deployments that serve one workload per model name)."""
    default_class: str = "chat"
    """Class when nothing else decides (no class argument, unmapped model name, no prompt text)."""
    model: str | None = None
    """The target model the policy was tuned for (informational)."""
    controller: ControllerSettings = field(default_factory=ControllerSettings)

    def __post_init__(self) -> None:
        # Same checks as the file format, so a policy built in code is as valid as one loaded from disk.
        _validate(self.to_dict(), source="RequestPolicy")

    # ---- per request ------------------------------------------------------------------------------------------------
    def classify(
        self, extra_args: Mapping[str, Any] | None = None, model_name: str | None = None, prompt: str | None = None
    ) -> str:
        """The request's class (see the module docstring for the order of rules)."""
        if extra_args:
            cls = extra_args.get(CLASS_KEY)
            if cls is not None:
                if not isinstance(cls, str) or not cls:
                    raise ValueError(f"extra_args[{CLASS_KEY!r}] must be a non-empty string, but got {cls!r}.")
                return cls
        if model_name is not None and model_name in self.model_classes:
            return self.model_classes[model_name]
        if prompt:
            return classify_prompt(prompt)
        return self.default_class

    def speculate(self, extra_args: Mapping[str, Any] | None = None) -> bool:
        """False when the request opted out with ``extra_args["peagle_speculate"] = False``."""
        if not extra_args or SPECULATE_KEY not in extra_args:
            return True
        value = extra_args[SPECULATE_KEY]
        if not isinstance(value, bool):
            raise ValueError(f"extra_args[{SPECULATE_KEY!r}] must be true or false, but got {value!r}.")
        return value

    def limits(self, cls: str) -> tuple[int, int]:
        """(floor, cap) depths for a class; classes without an entry get (0, max_k)."""
        entry = self.classes.get(cls)
        if entry is None:
            return 0, self.max_k
        cap = self.max_k if entry.max_k is None else min(entry.max_k, self.max_k)
        return min(entry.min_k, cap), cap

    def view(
        self,
        request_id: str,
        extra_args: Mapping[str, Any] | None = None,
        model_name: str | None = None,
        prompt: str | None = None,
    ) -> RequestView:
        """The controller's view of a request: class, cap, floor and opt-out."""
        cls = self.classify(extra_args, model_name, prompt)
        floor, cap = self.limits(cls)
        return RequestView(request_id, cls, max_k=cap, min_k=floor, speculate=self.speculate(extra_args))

    # ---- building the runtime pieces --------------------------------------------------------------------------------
    def make_controller(self, cost_model: StepCostModel, estimator: AcceptanceEstimator) -> DepthController:
        """A `DepthController` with this policy's depths and controller settings."""
        return DepthController(cost_model, estimator, self.max_k, self.static_k, settings=self.controller)

    # ---- (de)serialising --------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The policy-file form (format version 1)."""
        return {
            "version": POLICY_FORMAT_VERSION,
            "model": self.model,
            "static_k": self.static_k,
            "max_k": self.max_k,
            "default_class": self.default_class,
            "classes": {name: c.to_dict() for name, c in self.classes.items()},
            "model_classes": dict(self.model_classes),
            "controller": self.controller.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "policy") -> RequestPolicy:
        """Validate a policy-file dict and build the policy. Errors are `PolicyFileError` naming ``source``."""
        _validate(data, source)
        classes = {
            name: ClassPolicy(max_k=entry.get("max_k"), min_k=entry.get("min_k", 0))
            for name, entry in (data.get("classes") or {}).items()
        }
        return cls(
            static_k=data["static_k"],
            max_k=data["max_k"],
            classes=classes,
            model_classes=dict(data.get("model_classes") or {}),
            default_class=data.get("default_class", "chat"),
            model=data.get("model"),
            controller=ControllerSettings(**(data.get("controller") or {})),
        )


class PolicyFile:
    """Load and save policy files: JSON for ``.json``, YAML otherwise (YAML also reads JSON)."""

    @staticmethod
    def load(path: str | Path) -> RequestPolicy:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyFileError(f"{p}: cannot read the policy file ({exc.strerror or exc}).") from exc
        try:
            data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise PolicyFileError(f"{p}: not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}: {exc}") from exc
        return RequestPolicy.from_dict(data, source=str(p))

    @staticmethod
    def save(policy: RequestPolicy, path: str | Path) -> Path:
        p = Path(path)
        data = policy.to_dict()
        if p.suffix.lower() == ".json":
            text = json.dumps(data, indent=2, sort_keys=False) + "\n"
        else:
            text = yaml.safe_dump(data, sort_keys=False)
        p.write_text(text, encoding="utf-8")
        return p


def load_policy(path: str | Path) -> RequestPolicy:
    """Read a policy file (YAML or JSON). Raises `PolicyFileError` naming the file and the offending key."""
    return PolicyFile.load(path)


# ---- validation ---------------------------------------------------------------------------------------------
_TOP_KEYS = {"version", "model", "static_k", "max_k", "default_class", "classes", "model_classes", "controller"}
_CLASS_KEYS = {"max_k", "min_k"}
_CONTROLLER_TYPES: dict[str, str] = {
    "hysteresis": "float",
    "patience": "int",
    "refresh_every": "int",
    "per_request": "bool",
    "drafter_always_runs": "bool",
    "explore_every": "int",
    "reoptimize_churn": "float",
    "learn_step_cost": "bool",
    "decay": "float",
    "prior_strength": "float",
}


def _validate(data: Any, source: str) -> None:
    def fail(path: str, rule: str, value: Any) -> None:
        raise PolicyFileError(f"{source}: {path}: {rule}, got {value!r}.")

    def integer(path: str, value: Any, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            fail(path, f"must be an integer in [{lo}, {hi}]", value)
        return int(value)

    def unknown(path: str, keys: Any, known: set[str]) -> None:
        extra = sorted(str(k) for k in keys if k not in known)
        if extra:
            where = f"{path}: " if path else ""
            raise PolicyFileError(
                f"{source}: {where}unknown key(s) {extra}; known keys are {sorted(known)}. Check the spelling."
            )

    if not isinstance(data, Mapping):
        raise PolicyFileError(f"{source}: a policy must be a mapping (YAML/JSON object), got {type(data).__name__}.")
    unknown("", data, _TOP_KEYS)
    if "version" not in data:
        raise PolicyFileError(f"{source}: version: missing; add 'version: {POLICY_FORMAT_VERSION}'.")
    if data["version"] != POLICY_FORMAT_VERSION:
        fail("version", f"must be {POLICY_FORMAT_VERSION} (the only format this peagle-tune reads)", data["version"])
    for key in ("static_k", "max_k"):
        if key not in data:
            raise PolicyFileError(f"{source}: {key}: missing; it must be an integer in [0, {MAX_K}].")
    max_k = integer("max_k", data["max_k"], 0, MAX_K)
    integer("static_k", data["static_k"], 0, max_k)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        fail("model", "must be a string or null", model)
    default = data.get("default_class", "chat")
    if not isinstance(default, str) or not default:
        fail("default_class", "must be a non-empty string", default)
    classes = data.get("classes") or {}
    if not isinstance(classes, Mapping):
        fail("classes", "must be a mapping of class name to {max_k, min_k}", classes)
    for name, entry in classes.items():
        path = f"classes.{name}"
        if not isinstance(name, str) or not name:
            fail("classes", "class names must be non-empty strings", name)
        if not isinstance(entry, Mapping):
            fail(path, "must be a mapping with optional keys max_k, min_k", entry)
        unknown(path, entry, _CLASS_KEYS)
        cap = max_k
        if entry.get("max_k") is not None:
            cap = integer(f"{path}.max_k", entry["max_k"], 0, max_k)
        integer(f"{path}.min_k", entry.get("min_k", 0), 0, cap)
    model_classes = data.get("model_classes") or {}
    if not isinstance(model_classes, Mapping):
        fail("model_classes", "must be a mapping of served model name to class name", model_classes)
    for served, cls in model_classes.items():
        if not isinstance(cls, str) or not cls:
            fail(f"model_classes.{served}", "must be a non-empty class name string", cls)
    controller = data.get("controller") or {}
    if not isinstance(controller, Mapping):
        fail("controller", "must be a mapping of controller settings", controller)
    unknown("controller", controller, set(_CONTROLLER_TYPES))
    for key, value in controller.items():
        kind = _CONTROLLER_TYPES[key]
        path = f"controller.{key}"
        if kind == "bool" and not isinstance(value, bool):
            fail(path, "must be true or false", value)
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            fail(path, "must be an integer", value)
        if kind == "float" and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        ):
            fail(path, "must be a number", value)
    try:
        ControllerSettings(**controller)
    except ValueError as exc:
        raise PolicyFileError(f"{source}: controller.{exc}") from exc

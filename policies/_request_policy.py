"""Request policies: which class a request belongs to, its depth cap/floor, opt-out, and the policy file.

The operator decides, a client may only ask for less. The *assigned* class of a request (`RequestPolicy.assign`),
first match wins:

1. the served model name, through the policy's ``model_classes`` mapping;
2. the built-in prompt classifier `classify_prompt` ("code", "math" or "chat");
3. ``default_class`` when there is no prompt text (always so in the engine, which sees token ids only).

A client may then name a class with ``extra_args["peagle_class"]`` (vLLM ``SamplingParams.extra_args``; the
OpenAI server's ``vllm_xargs``). `RequestPolicy.classify` takes it only when all of these hold, else the request
stays in its assigned class (the rule is `RequestPolicy.resolve`, a plain function of plain values):

- the label is one of the classes clients may request (``clients.classes``; default: every class the policy knows,
  `RequestPolicy.known_classes`): an unknown label never creates a class;
- the named class's cap is not above the assigned class's cap, unless ``clients.raise_depth``;
- the assigned class did not come from ``model_classes``, unless ``clients.override_model_classes``.

Per-request limits a client can always set, both only lowering its depth: ``extra_args["peagle_speculate"] = False``
(opt-out, depth 0) and ``extra_args["peagle_max_k"] = n`` (its own cap, `client_depth_cap`). Nothing a client sends
raises a depth above its class's cap or the policy's ``max_k``.

Example: with ``classes: {code: {max_k: 8}, chat: {max_k: 1}}``, ``default_class: chat``, a request in the engine
labelled ``peagle_class: code`` stays in "chat" at depth <= 1; one labelled ``peagle_class: no-such-class`` too::

    >>> caps = {"code": ClassPolicy(max_k=8), "chat": ClassPolicy(max_k=1)}
    >>> policy = RequestPolicy(static_k=1, max_k=8, classes=caps)
    >>> policy.classify({"peagle_class": "code"}), policy.classify({"peagle_class": "no-such-class"})
    ('chat', 'chat')
    >>> policy.classify({"peagle_class": "chat"}, assigned="code")  # lowering is allowed
    'chat'

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
    clients:                            # optional; what a request's own labels may do (defaults shown)
      classes: null                     # classes a client may name (null: every known class)
      raise_depth: false                # may a named class have a higher cap than the assigned one?
      override_model_classes: false     # may a named class replace the model_classes assignment?

Unknown keys are errors; every error names the key path and what was expected. A policy knows at most
`MAX_CLASSES` classes (its ``classes``, ``default_class``, ``model_classes`` targets and the built-in
`BUILTIN_CLASSES`), which bounds every per-class table downstream (estimator, statistics, Prometheus series).
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

from policies._batch import RequestView
from policies._controller import DepthController
from policies._depth import MAX_K
from policies._estimator import MAX_CLASSES, AcceptanceEstimator
from policies._files import load_json_text, load_yaml_text, read_text
from policies._settings import ControllerSettings
from policies._step_cost import StepCostModel
from policies.errors import PolicyFileError

__all__ = [
    "BUILTIN_CLASSES",
    "CLASS_KEY",
    "DEFAULT_POLICY_CLASS",
    "MAX_CLASSES",
    "MAX_K",
    "MAX_K_KEY",
    "POLICY_FORMAT_VERSION",
    "SPECULATE_KEY",
    "ClassPolicy",
    "ClientRules",
    "PolicyFile",
    "RequestPolicy",
    "classify_prompt",
    "client_depth_cap",
    "load_policy",
]

POLICY_FORMAT_VERSION = 1

CLASS_KEY = "peagle_class"
"""``SamplingParams.extra_args`` key naming a request's workload class (set by the client or the middleware)."""
SPECULATE_KEY = "peagle_speculate"
"""``extra_args`` key that opts a request out of speculation when false."""
MAX_K_KEY = "peagle_max_k"
"""``extra_args`` key with the request's own depth cap (an integer in [0, MAX_K]; it can only lower the depth)."""
BUILTIN_CLASSES: tuple[str, ...] = ("code", "math", "chat")
"""The classes `classify_prompt` assigns; every policy knows them."""
DEFAULT_POLICY_CLASS = "chat"
"""A policy's ``default_class`` when the file names none."""

# Every pattern runs in linear time on hostile text (no two adjacent quantifiers can match the same characters, and
# scans are bounded): the API-server middleware runs the classifier on client prompts in its event loop. Before, 20 KB
# of newlines took 16 s and 56 KB of "return " 1.9 s (quadratic backtracking).
_CODE_PATTERNS = re.compile(
    r"```|\bdef\s+\w+\s*\(|\bclass\s+\w+\s*[:(]|^[ \t]*(?:from[ \t]+[\w.]+[ \t]+)?import[ \t]+\w+|#include\s*<|"
    r"\bfunction(?:[ \t]+\w+)?[ \t]*\(|\breturn\b[^.\n;]{0,200};|=>|\bpublic\s+(?:static\s+)?\w+",
    re.MULTILINE,
)
_CODE_CHARS = re.compile(r"[{};]")
_MATH_EXPR = re.compile(r"\d[ \t]*[-+*/^=×÷<>][ \t]*(?:\([ \t]*)?\d|\\frac|\\sqrt|\$[^$\n]{1,200}\$")
_CLASSIFY_CHARS = 65536
"""`classify_prompt` reads at most this many characters of a prompt (its start), so its cost is bounded."""
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
    ``classify_prompt("Tell me about Paris")`` -> "chat". Only the first 64 KiB are read; time is linear in them.
    """
    text = text[:_CLASSIFY_CHARS]
    if _CODE_PATTERNS.search(text) or len(_CODE_CHARS.findall(text)) >= 3:
        return "code"
    if _MATH_EXPR.search(text):
        return "math"
    if _NUMBER.search(text) and _MATH_WORDS.search(text):
        return "math"
    return "chat"


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


def client_depth_cap(extra_args: Mapping[str, Any] | None) -> int | None:
    """The depth cap a request set for itself with ``extra_args["peagle_max_k"]`` (None: it set none).

    An integer in [0, `MAX_K`]; vLLM's OpenAI server delivers ``vllm_xargs`` values as str/int/float, so "2" and 2.0
    count as 2. Anything else raises ValueError naming the key. The cap only ever lowers the request's depth.

    Example: ``client_depth_cap({"peagle_max_k": "1"})`` -> 1; ``client_depth_cap({})`` -> None.
    """
    if not extra_args or MAX_K_KEY not in extra_args:
        return None
    value = extra_args[MAX_K_KEY]
    depth: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        depth = value
    elif isinstance(value, float) and value.is_integer():
        depth = int(value)
    elif isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 3:
        depth = int(value.strip())
    if depth is None or not 0 <= depth <= MAX_K:
        raise ValueError(f"extra_args[{MAX_K_KEY!r}] must be an integer in [0, {MAX_K}], but got {value!r:.40}.")
    return depth


@dataclass(frozen=True)
class ClientRules:
    """What a request's own ``peagle_class`` label may do (the ``clients`` section of a policy file).

    The defaults let a client move only to a class no deeper than the one the operator assigned, and never away from
    a ``model_classes`` assignment; opting out and ``peagle_max_k`` are always allowed (they only lower depth).
    """

    classes: tuple[str, ...] | None = None
    """Classes a client may name (None: every class the policy knows). Each must be a known class."""
    raise_depth: bool = False
    """True: a named class may have a higher cap than the assigned class (trusted clients only)."""
    override_model_classes: bool = False
    """True: a named class may replace the class ``model_classes`` assigned to the served model name."""

    def __post_init__(self) -> None:
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(self.classes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "classes": None if self.classes is None else list(self.classes),
            "raise_depth": self.raise_depth,
            "override_model_classes": self.override_model_classes,
        }


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
    default_class: str = DEFAULT_POLICY_CLASS
    """Class when nothing else decides (no class argument, unmapped model name, no prompt text)."""
    model: str | None = None
    """The target model the policy was tuned for (informational)."""
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    clients: ClientRules = field(default_factory=ClientRules)
    """What a request's own class label may do (see `ClientRules`)."""
    known_classes: frozenset[str] = field(init=False, repr=False, compare=False)
    """Every class a request can end up in: ``classes``, ``default_class``, ``model_classes`` targets and
    `BUILTIN_CLASSES` (at most `MAX_CLASSES`)."""
    requestable_classes: frozenset[str] = field(init=False, repr=False, compare=False)
    """The classes a client may name (``clients.classes``, else `known_classes`)."""

    def __post_init__(self) -> None:
        # Same checks as the file format, so a policy built in code is as valid as one loaded from disk.
        _validate(self.to_dict(), source="RequestPolicy")
        known = frozenset({*BUILTIN_CLASSES, self.default_class, *self.classes, *self.model_classes.values()})
        object.__setattr__(self, "known_classes", known)
        requestable = known if self.clients.classes is None else frozenset(self.clients.classes)
        object.__setattr__(self, "requestable_classes", requestable)

    # ---- per request ------------------------------------------------------------------------------------------------
    def assign(self, model_name: str | None = None, prompt: str | None = None) -> str:
        """The operator's class for a request: ``model_classes[model_name]``, else `classify_prompt`, else
        ``default_class`` (see the module docstring)."""
        if model_name is not None and model_name in self.model_classes:
            return self.model_classes[model_name]
        if prompt:
            return classify_prompt(prompt)
        return self.default_class

    def resolve(self, requested: Any, assigned: str, *, by_model: bool = False) -> str:
        """The class of a request the operator assigned to ``assigned`` whose client named ``requested`` (any value,
        as it arrived; None: no label). ``by_model``: ``assigned`` came from ``model_classes``.

        ``requested`` is taken only if it is a class clients may request, is not deeper than ``assigned`` (unless
        ``clients.raise_depth``) and ``assigned`` is not a model-name assignment (unless
        ``clients.override_model_classes``); otherwise the request stays in ``assigned``. Never raises.

        Example (``code`` capped at 8, ``chat`` at 1): ``resolve("code", "chat")`` -> "chat" (would raise the cap);
        ``resolve("chat", "code")`` -> "chat" (lowers it); ``resolve(12, "chat")`` -> "chat" (not a label).
        """
        if requested is None or requested == assigned or not isinstance(requested, str):
            return assigned
        rules = self.clients
        if requested not in self.requestable_classes:
            return assigned
        if by_model and not rules.override_model_classes:
            return assigned
        if not rules.raise_depth and self.limits(requested)[1] > self.limits(assigned)[1]:
            return assigned
        return requested

    def classify(
        self,
        extra_args: Mapping[str, Any] | None = None,
        model_name: str | None = None,
        prompt: str | None = None,
        *,
        assigned: str | None = None,
    ) -> str:
        """The request's class: `assign` (or the trusted ``assigned`` class, e.g. one the API-server middleware
        stamped), then the client's ``peagle_class`` label through `resolve`."""
        by_model = False
        if assigned is None:
            by_model = model_name is not None and model_name in self.model_classes
            assigned = self.assign(model_name, prompt)
        return self.resolve((extra_args or {}).get(CLASS_KEY), assigned, by_model=by_model)

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
        *,
        assigned: str | None = None,
    ) -> RequestView:
        """The controller's view of a request: class (`classify`), cap (the class's, lowered by the request's own
        ``peagle_max_k``), floor (at most the cap) and opt-out. ``assigned``: a trusted class for the request (the
        simulator's ground truth, the middleware's verified stamp), used as given.

        Raises ValueError when ``peagle_speculate`` or ``peagle_max_k`` has a value that is not a flag / a depth.
        """
        cls = self.classify(extra_args, model_name, prompt, assigned=assigned)
        floor, cap = self.limits(cls)
        own = client_depth_cap(extra_args)
        if own is not None and own < cap:
            cap, floor = own, min(floor, own)
        return RequestView(request_id, cls, max_k=cap, min_k=floor, speculate=self.speculate(extra_args))

    # ---- building the runtime pieces --------------------------------------------------------------------------------
    def make_controller(self, cost_model: StepCostModel, estimator: AcceptanceEstimator) -> DepthController:
        """A `DepthController` with this policy's depths and controller settings."""
        return DepthController(cost_model, estimator, self.max_k, self.static_k, settings=self.controller)

    # ---- (de)serialising --------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The policy-file form (format version 1); ``clients`` only when it differs from the defaults."""
        out = {
            "version": POLICY_FORMAT_VERSION,
            "model": self.model,
            "static_k": self.static_k,
            "max_k": self.max_k,
            "default_class": self.default_class,
            "classes": {name: c.to_dict() for name, c in self.classes.items()},
            "model_classes": dict(self.model_classes),
            "controller": self.controller.to_dict(),
        }
        if self.clients != ClientRules():
            out["clients"] = self.clients.to_dict()
        return out

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
            default_class=data.get("default_class", DEFAULT_POLICY_CLASS),
            model=data.get("model"),
            controller=ControllerSettings(**(data.get("controller") or {})),
            clients=ClientRules(**(data.get("clients") or {})),
        )


class PolicyFile:
    """Load and save policy files: JSON for ``.json``, YAML otherwise (YAML also reads JSON)."""

    @staticmethod
    def load(path: str | Path) -> RequestPolicy:
        p = Path(path)
        text = read_text(p, PolicyFileError, "policy file")
        try:
            data = load_json_text(text) if p.suffix.lower() == ".json" else load_yaml_text(text)
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
_TOP_KEYS = {
    "version", "model", "static_k", "max_k", "default_class", "classes", "model_classes", "controller", "clients",
}
_CLIENT_KEYS = {"classes", "raise_depth", "override_model_classes"}
_CLASS_KEYS = {"max_k", "min_k"}
_CONTROLLER_TYPES: dict[str, str] = {
    "hysteresis": "float",
    "patience": "int",
    "refresh_every": "int",
    "per_request": "bool",
    "drafter_always_runs": "bool",
    "explore_every": "int",
    "explore_budget": "float",
    "run_steps": "float",
    "reoptimize_churn": "float",
    "learn_step_cost": "bool",
    "decay": "float",
    "prior_strength": "float",
}


def _validate(data: Any, source: str) -> None:
    def fail(path: str, rule: str, value: Any) -> None:
        raise PolicyFileError(f"{source}: {path}: {rule}, got {value!r:.80}.")

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
    default = data.get("default_class", DEFAULT_POLICY_CLASS)
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
    known = {*BUILTIN_CLASSES, default, *classes, *model_classes.values()}
    if len(known) > MAX_CLASSES:
        raise PolicyFileError(
            f"{source}: classes: a policy may know at most {MAX_CLASSES} classes (classes, default_class, "
            f"model_classes targets and the built-in {list(BUILTIN_CLASSES)}), but this one knows {len(known)}. "
            "Merge classes that share caps."
        )
    clients = data.get("clients") or {}
    if not isinstance(clients, Mapping):
        fail("clients", "must be a mapping with optional keys classes, raise_depth, override_model_classes", clients)
    unknown("clients", clients, _CLIENT_KEYS)
    for key in ("raise_depth", "override_model_classes"):
        if key in clients and not isinstance(clients[key], bool):
            fail(f"clients.{key}", "must be true or false", clients[key])
    requestable = clients.get("classes")
    if requestable is not None:
        if isinstance(requestable, str) or not isinstance(requestable, list | tuple):
            fail("clients.classes", "must be a list of class names or null (every known class)", requestable)
        strange = [c for c in requestable if c not in known]
        if strange:
            fail("clients.classes", f"must name classes the policy knows ({sorted(known)})", strange)
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

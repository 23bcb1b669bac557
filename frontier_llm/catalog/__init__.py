"""The built-in catalog of models and systems (YAML package data).

Anywhere a model or system name is accepted, a path to a YAML file of the same form works too:
adding a system is adding data, not code.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

from frontier_llm.errors import SpecError, UserError
from frontier_llm.specs import Efficiency, LinkTier, ModelSpec, SystemSpec
from frontier_llm.specs.build import build
from frontier_llm.specs.site import site_from_mapping
from frontier_llm.specs.system import Power, PredictionError
from frontier_llm.specs.yamlio import LineMap, load_yaml

HERE = Path(__file__).parent
MODELS_DIR = HERE / "models"
SYSTEMS_DIR = HERE / "systems"


def model_names() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


def system_names() -> list[str]:
    return sorted(p.stem for p in SYSTEMS_DIR.glob("*.yaml"))


def _resolve(name: str, folder: Path, kind: str, names: list[str]) -> Path:
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise UserError(f"{kind} file {name} does not exist")
        return candidate
    path = folder / f"{name}.yaml"
    if path.is_file():
        return path
    hint = _system_hint(name, names) if kind == "system" else ""
    if not hint:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
    raise UserError(
        f"unknown {kind} '{name}'.{hint} Valid {kind}s: {', '.join(names)} "
        f"(or a path to a {kind} YAML file)"
    )


def _system_hint(name: str, names: list[str]) -> str:
    """The suggestion for a system asked by its chip (``h100``, ``mi250x``): the catalog's
    systems whose name or ``gpu:`` names it, whole multi-GPU nodes first. Spelling alone
    suggested ``h100-sxm``, a one-GPU machine, for ``h100``: a plan on it prices 1,024 GPUs as
    1,024 nodes over the network, ten times the node-hours of ``dgx-h100``. Empty when no
    system names the chip (a misspelling: difflib's suggestion then)."""
    key = name.strip().lower()
    if len(key) < 3:
        return ""
    shape: dict[str, int] = {}
    for n in names:
        raw = load_yaml(SYSTEMS_DIR / f"{n}.yaml")
        if key in f"{n} {raw.get('gpu', '')}".lower():
            shape[n] = int(raw.get("gpus_per_node") or 1)
    if not shape:
        return ""
    # Most GPUs per node first, then a system named for the chip, then by name.
    ranked = sorted(shape, key=lambda n: (-shape[n], key not in n, n))
    first, rest = ranked[0], ranked[1:]
    others = ", ".join(f"{n} ({shape[n]} per node)" if shape[n] > 1 else f"{n} (one GPU alone)"
                       for n in rest)
    return (f" Did you mean '{first}' ({shape[first]} GPUs per node)?"
            + (f" Also with that chip: {others}." if others else ""))


def _mapping(data: object, path: Path, kind: str) -> LineMap:
    if not isinstance(data, LineMap):
        raise SpecError(f"{path}:1: a {kind} file must hold a mapping of fields")
    return data


def model_from_mapping(data: LineMap | dict) -> ModelSpec:
    return build(ModelSpec, data)


def system_from_mapping(data: LineMap | dict) -> SystemSpec:
    def links(raw: dict) -> dict[str, LinkTier]:
        if not isinstance(raw, dict):
            raise SpecError("links must map a scope (package, node, network) to a tier", "links")
        out = {}
        for scope, tier in raw.items():
            if not isinstance(tier, dict):
                raise SpecError(f"links.{scope} must map bandwidth, latency, source", "links")
            # A copy keeps the YAML line of each key, so errors point inside the tier.
            tier = tier.copy()
            tier["scope"] = scope
            out[scope] = build(LinkTier, tier)
        return out

    def efficiency(raw: dict) -> dict[str, Efficiency]:
        if not isinstance(raw, dict):
            raise SpecError("efficiency must map a name to {value, source}", "efficiency")
        out = {}
        for key, item in raw.items():
            item = item if isinstance(item, dict) else {"value": item}
            out[key] = build(Efficiency, item)
        return out

    def numbers(raw: dict) -> dict[str, float]:
        if not isinstance(raw, dict):
            raise SpecError("peak_flops must map a dtype to FLOP/s", "peak_flops")
        return {str(k): float(v) for k, v in raw.items()}

    return build(
        SystemSpec,
        data,
        nested={"links": links, "efficiency": efficiency, "peak_flops": numbers,
                "site": site_from_mapping, "power": lambda raw: build(Power, raw),
                "prediction_error": lambda raw: build(PredictionError, raw)},
    )


@lru_cache(maxsize=256)
def _load_model(path: str) -> ModelSpec:
    data = _mapping(load_yaml(path), Path(path), "model")
    if "name" not in data:
        data["name"] = Path(path).stem
    return model_from_mapping(data)


@lru_cache(maxsize=256)
def _load_system(path: str) -> SystemSpec:
    data = _mapping(load_yaml(path), Path(path), "system")
    if "name" not in data:
        data["name"] = Path(path).stem
    return system_from_mapping(data)


def load_model(name_or_path: str | ModelSpec) -> ModelSpec:
    """A catalog model by name (``gpt-175b``) or a model YAML file by path."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    return _load_model(str(_resolve(name_or_path, MODELS_DIR, "model", model_names())))


def load_system(name_or_path: str | SystemSpec) -> SystemSpec:
    """A catalog system by name (``frontier``) or a system YAML file by path."""
    if isinstance(name_or_path, SystemSpec):
        return name_or_path
    return _load_system(str(_resolve(name_or_path, SYSTEMS_DIR, "system", system_names())))

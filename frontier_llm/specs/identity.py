"""A canonical identity for "this layout of this model on this system".

The store keys layouts by it and the trace carries it, so a re-run of the same layout (another
job, another day) lands on the same row. Free-text fields do not take part.
"""

from __future__ import annotations

import hashlib
import json

from frontier_llm.specs.layout import Layout, layout_fields
from frontier_llm.specs.model import MLA_FIELDS, ModelSpec, dense_expert_fields

_IGNORED = {"description", "sources", "source"}
# Layout fields whose metadata says ``new_knob=True`` (docs/layout.md).
_NEW_KNOBS = tuple(f.name for f in layout_fields() if f.metadata.get("new_knob"))
_DEFAULTS = Layout().to_dict()
# Model fields added after the first stored layouts (the Mixture-of-Experts ones), with a dense
# model's values: like a new knob, one takes part only when it is not at that value, so every
# dense layout stored before them keeps its hash and a trace that omits them names the same row.
_NEW_MODEL_FIELDS = {**dense_expert_fields(), **dict.fromkeys(MLA_FIELDS, 0)}


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in sorted(obj.items()) if k not in _IGNORED}
    if isinstance(obj, list | tuple):
        return [_strip(v) for v in obj]
    return obj


def layout_hash(model: ModelSpec | dict, system_name: str, layout: Layout | dict) -> str:
    """sha256 (hex, 16 chars) of the canonical JSON of model shape, system name and layout."""
    m = model.to_dict() if isinstance(model, ModelSpec) else dict(model)
    p = layout.to_dict() if isinstance(layout, Layout) else dict(layout)
    for name in _NEW_KNOBS:
        # A knob added after the first stored layouts takes part only when it is not at its
        # default, so every layout stored before it keeps its hash.
        if name in p and p[name] == _DEFAULTS[name]:
            del p[name]
    for name, dense in _NEW_MODEL_FIELDS.items():
        if name in m and m[name] == dense:
            del m[name]
    if m.get("head_dim") in (None, m["hidden"] // m["heads"]) and not m.get("kv_lora_rank"):
        m.pop("head_dim", None)  # hidden / heads, as before head_dim was a field: hashes stay
    m.pop("name", None)  # two names for one shape are one layout
    m.pop("rope_base", None)  # prices nothing (the same shapes and FLOPs): every hash stays
    blob = json.dumps(
        {"model": _strip(m), "system": system_name, "layout": _strip(p)},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]

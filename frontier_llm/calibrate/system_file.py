"""Write fitted figures as a system YAML that ``flm plan --system FILE`` loads unchanged.

The file starts from the base system's own YAML (so what was not measured — memory, the
network tier on a one-node run, the ``site:`` section — stays as the base states it, with its
sources) and replaces what was measured, each value with a ``source`` naming the calibration:
date, hosts, node count, library versions, points and fit residual.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import yaml

from frontier_llm.atomic import write_text_atomic
from frontier_llm.calibrate.fit import MatmulFit, TierFit
from frontier_llm.catalog import SYSTEMS_DIR, load_system, system_from_mapping
from frontier_llm.errors import UserError
from frontier_llm.specs.system import SystemSpec
from frontier_llm.specs.yamlio import load_yaml


def plain(data):
    """YAML-loaded data (LineMap mappings) as plain dicts and lists, for yaml.safe_dump."""
    if isinstance(data, dict):
        return {str(k): plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [plain(v) for v in data]
    return data


def base_mapping(name_or_path: str) -> dict:
    """The base system's YAML as a plain mapping (a catalog name or a file path)."""
    spec = load_system(name_or_path)  # validates, and says what is wrong with a bad name
    path = Path(name_or_path)
    if not path.is_file():
        path = SYSTEMS_DIR / f"{name_or_path}.yaml"
    data = plain(load_yaml(path))
    data.setdefault("name", spec.name)
    return data


def provenance_line(prov: dict) -> str:
    v = prov.get("versions", {})
    libs = ", ".join(f"{k} {v[k]}" for k in ("torch", "backend", "nccl", "mpi4py", "mpi")
                     if v.get(k))
    hosts = prov.get("hosts", [])
    shown = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
    return (f"flm calibrate {prov.get('finished_at', '?')} on {prov.get('node_count', '?')} "
            f"node(s) ({shown}), {prov.get('world_size', '?')} ranks, {libs}")


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def calibrated_mapping(base: dict, prov: dict, links: dict[tuple[str, str], TierFit],
                       matmul: MatmulFit | None, name: str) -> dict:
    """The base mapping with the measured figures in place (pure)."""
    out = dict(base)
    # The base's held-out error was measured with the knobs replaced here: it no longer applies
    # (the planner's intervals then fall back to the calibration rows', planner/intervals.py).
    out.pop("prediction_error", None)
    spec: SystemSpec = system_from_mapping(plain(base))
    who = provenance_line(prov)
    backend = prov.get("versions", {}).get("backend", "")
    out["name"] = name
    out["description"] = (f"{base.get('description', spec.name)} — calibrated by flm calibrate "
                          f"on {prov.get('finished_at', '?')}")
    base_eff = spec.eff("collective")
    new_links = {}
    for scope, tier in spec.links.items():
        fit = links.get((backend, scope))
        if fit is not None:
            new_links[scope] = {
                "bandwidth": float(f"{fit.bandwidth:.4g}"),
                "latency": float(f"{fit.latency_s:.4g}"),
                "source": (f"{who}: alpha-beta fit of {fit.points} {backend} timings "
                           f"({', '.join(fit.per_op_rms)}), {fit.sizes} sizes, groups of "
                           f"{', '.join(map(str, fit.group_sizes))} ranks; residual rms "
                           f"{_pct(fit.rms_rel_residual)}, max {_pct(fit.max_rel_residual)}"),
            }
        else:
            # Not measured: the base's figure, already scaled by the base's collective
            # efficiency, because the calibrated file states achieved bandwidths (efficiency 1).
            new_links[scope] = {
                "bandwidth": float(f"{tier.bandwidth * base_eff:.4g}"),
                "latency": tier.latency,
                "source": (f"not measured by {who} (no group spans this tier): "
                           f"{spec.name}'s figure x its collective efficiency {base_eff:g}; "
                           f"{tier.source}"),
            }
    for scope, tier in spec.links.items():
        if not tier.rails:  # a network without rails keeps that (specs/system.py LinkTier)
            new_links[scope]["rails"] = False
    out["links"] = new_links
    eff = {k: {"value": e.value, "source": e.source} for k, e in spec.efficiency.items()}
    eff["collective"] = {"value": 1.0, "source": "links hold measured (achieved) bandwidths"}
    if matmul is not None:
        peak = spec.peak(matmul.dtype)
        peaks = dict(out.get("peak_flops", {}))
        if matmul.rate > peak:
            # A measured rate above the stated peak proves the stated peak wrong (on a CPU it
            # is an estimate): the achieved rate is then the best lower bound of the peak.
            peaks[matmul.dtype] = float(f"{matmul.rate:.4g}")
            peak = peaks[matmul.dtype]
            out["peak_flops"] = peaks
        eff["matmul"] = {
            "value": round(min(1.0, matmul.rate / peak), 4),
            "source": (f"{who}: {matmul.points} block GEMM sets in {matmul.dtype}, widths "
                       f"{', '.join(map(str, matmul.widths))}; achieved {matmul.rate:.4g} FLOP/s "
                       f"of peak {peak:.4g}; residual rms {_pct(matmul.rms_rel_residual)}, "
                       f"max {_pct(matmul.max_rel_residual)}"
                       + ("" if matmul.saturated else
                          "; the rate still rose at the widest width: the highest rate "
                          "measured, a lower bound (measure wider GEMMs)")),
        }
        out["matmul_half_hidden"] = round(matmul.half_hidden, 2)
    out["efficiency"] = eff
    sources = dict(out.get("sources") or {})
    sources["calibration"] = who
    sources["matmul_half_hidden"] = ("flm calibrate: size effect of the GEMM rate, by the "
                                     "weights' smaller side "
                                     "(docs/calibrate.md)")
    out["sources"] = sources
    system_from_mapping(plain(out))  # what we write must load
    return out


def write_system(mapping: dict, path: str | Path, header: list[str]) -> Path:
    """Write atomically, after the mapping has been checked; refuses to write nothing."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise UserError(f"--out: folder {path.parent} does not exist")
    lines = [f"# {h}" for h in header]
    lines.append(f"# written {datetime.now(UTC).isoformat(timespec='seconds')}; load it with "
                 f"flm plan --system {path}")
    text = "\n".join(lines) + "\n" + yaml.safe_dump(plain(mapping), sort_keys=False,
                                                    allow_unicode=True, width=100)
    return write_text_atomic(path, text)

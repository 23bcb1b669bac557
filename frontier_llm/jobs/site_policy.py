"""The site's rules, checked before anything is written or submitted.

Each rule that a job breaks is refused with one line naming the rule and its source (the site's
documentation, from the system YAML's ``site:`` section), so a job the scheduler would reject —
or accept and then hold forever — never reaches sbatch. docs/sites.md lists the rules per site.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from frontier_llm.errors import SpecError
from frontier_llm.jobs.render import JobScript, Resources, template_family
from frontier_llm.specs.site import Site, format_time, time_seconds

# Environment variables that give sbatch an account when the script has none (sbatch man page:
# SBATCH_ACCOUNT; flm sweep render/submit read FLM_ACCOUNT into --account).
ACCOUNT_ENV = ("SBATCH_ACCOUNT",)


class SiteRuleError(SpecError):
    """A job breaks one of the site's rules."""


def _refuse(site_name: str, site: Site, rule: str, message: str,
            source: str | None = None) -> SiteRuleError:
    source = source or site.source(rule)
    where = f" (source: {source})" if source else ""
    return SiteRuleError(f"site rule {site_name}.{rule}: {message}{where}", rule)


def _asks(r: Resources, pack: int) -> str:
    """The time a job asks for, said per layout when the allocation runs a pack in turn (the
    sweep's --time is each layout's; the allocation holds ``pack`` of them end to end)."""
    if pack <= 1:
        return r.time
    return (f"{r.time} (--time is per layout in a packed sweep: {pack} layouts in turn x "
            f"{format_time(time_seconds(r.time) // pack)}; lower pack: or --time)")


def check(site_name: str, site: Site, jobs: Iterable[tuple[int, Resources] |
                                                     tuple[int, Resources, int]],
          env: Mapping[str, str] | None = None) -> None:
    """Refuse the first rule broken by ``jobs``: (array size, resources of each array task[,
    layouts it runs in turn: a sequential pack]).

    The resources are the ranks' (tasks per node = ranks per node, CPUs per rank).
    """
    env = os.environ if env is None else env
    jobs = [(j[0], j[1], j[2] if len(j) > 2 else 1) for j in jobs]
    total = sum(size for size, _, _ in jobs)
    for size, r, pack in jobs:
        if site.account_required and not r.account and not any(env.get(k) for k in ACCOUNT_ENV):
            raise _refuse(site_name, site, "account_required",
                          "an account (project) is required: give --account, set FLM_ACCOUNT "
                          "or SBATCH_ACCOUNT, or set resources.account in the sweep")
        account = r.account or next((env[k] for k in ACCOUNT_ENV if env.get(k)), None)
        if site.account_pattern and account and not re.fullmatch(site.account_pattern, account):
            raise _refuse(site_name, site, "account_pattern",
                          f"account {account!r} is not of the site's form "
                          f"{site.account_pattern!r} (e.g. LUMI's project_465000000)")
        for kind, name, known in (("partition", r.partition, site.partitions),
                                  ("qos", r.qos, site.qos_names)):
            if known and name is not None and name not in known:
                raise _refuse(site_name, site, "partitions" if kind == "partition" else
                              "qos_names", f"{kind} {name!r} is not one of {site_name}'s "
                              f"({', '.join(known)})")
        asked = time_seconds(r.time)
        if site.time_bins and site.bins_apply(r.partition):
            b = site.time_bin(r.nodes)
            if b is None:
                top = max(x.max_nodes for x in site.time_bins)
                raise _refuse(site_name, site, "time_bins",
                              f"a job of {r.nodes} nodes is larger than the largest bin "
                              f"({top} nodes)")
            if asked > time_seconds(b.max_time):
                raise _refuse(site_name, site, "time_bins",
                              f"a job of {r.nodes} nodes ({b.min_nodes}-{b.max_nodes} bin) may "
                              f"run at most {b.max_time}; it asks for {_asks(r, pack)}")
        if site.usable_cores_per_node and r.cpus_per_task and not r.overcommit:
            cores = r.cpus_per_task * r.ntasks_per_node
            if cores > site.usable_cores_per_node:
                raise _refuse(site_name, site, "usable_cores_per_node",
                              f"{r.ntasks_per_node} ranks x {r.cpus_per_task} CPUs = {cores} "
                              f"cores per node, over the {site.usable_cores_per_node} usable")
        for kind, name in (("qos", r.qos), ("partition", r.partition)):
            rule = site.queue(name, kind)
            if rule is None:
                continue
            label = f"{kind} {name}"
            if not rule.arrays and size > 1:
                raise _refuse(site_name, site, "queues",
                              f"{label} allows no job arrays; this script is an array of {size} "
                              "(use another QoS, or one layout)", rule.source)
            if rule.max_jobs is not None and total > rule.max_jobs:
                raise _refuse(site_name, site, "queues",
                              f"{label} lets a user have {rule.max_jobs} job(s); the sweep has "
                              f"{total} (split it or use another {kind})", rule.source)
            if rule.max_time is not None and asked > time_seconds(rule.max_time):
                raise _refuse(site_name, site, "queues",
                              f"{label} allows at most {rule.max_time}; a job asks for "
                              f"{_asks(r, pack)}", rule.source)
            if rule.max_nodes is not None and r.nodes > rule.max_nodes:
                raise _refuse(site_name, site, "queues",
                              f"{label} allows at most {rule.max_nodes} nodes; a job asks for "
                              f"{r.nodes}", rule.source)
    if site.max_queued_jobs is not None and total > site.max_queued_jobs:
        raise _refuse(site_name, site, "max_queued_jobs",
                      f"a user may queue {site.max_queued_jobs} jobs (each array task counts); "
                      f"the sweep has {total}: split it into sweeps of at most "
                      f"{site.max_queued_jobs} jobs")


def check_scripts(site_name: str, site: Site, scripts: Iterable[JobScript]) -> None:
    """Refuse what only the whole script shows: a template made for another family of systems,
    and a multi-node job whose collectives would have no network plugin."""
    for job in scripts:
        family = template_family(job.template)
        if family is not None and family != site.template:
            raise _refuse(site_name, site, "template",
                          f"template {job.template} is a {family} template; {site_name} "
                          f"jobs use the {site.template} family (set template: "
                          f"{site.template}, or a template that extends it)")
        if job.options.get("stage_env") and not site.stage_dir:
            raise _refuse(site_name, site, "stage_dir",
                          f"template_options.stage_env: {site_name} documents no node-local "
                          "storage to stage an environment to (on LUMI use the container "
                          "route: docs/sites.md)")
        if job.resources.nodes > 1 and site.net_plugin_modules:
            modules = site.modules if job.modules is None else job.modules
            loaded = {m.split("/")[0] for m in modules or ()}
            if not loaded & set(site.net_plugin_modules) and not job.options.get(
                    "rccl_plugin_dir"):
                raise _refuse(site_name, site, "net_plugin_modules",
                              f"a job of {job.resources.nodes} nodes loads no network plugin, so "
                              "RCCL would stop at its first collective (NCCL_NET names the "
                              f"plugin): add one of {', '.join(site.net_plugin_modules)} to "
                              "environment.modules, or set template_options.rccl_plugin_dir")


def check_queue_room(limit: Mapping[str, object], queued: int, adding: int) -> None:
    """Refuse a submit that would take the user's queued jobs (``queued``, from squeue --me)
    over the site's limit (``limit``: the manifest's ``queue_limit``)."""
    most = int(limit["max_queued_jobs"])  # type: ignore[call-overload]
    if queued + adding > most:
        source = f" (source: {limit['source']})" if limit.get("source") else ""
        raise SiteRuleError(
            f"site rule {limit['site']}.max_queued_jobs: you have {queued} jobs queued and this "
            f"submit adds {adding} (each array task counts), over the {most} a user may queue: "
            f"wait for some to end, cancel some, or submit fewer (flm sweep submit KEY...)"
            f"{source}", "max_queued_jobs")

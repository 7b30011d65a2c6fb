"""Runs grouped into configurations (equal config apart from the seed), labelled and sorted; the
reference configuration; per-configuration statistics and differences paired by seed. No plotting.
make_figures.py's docstring states the rules."""
import json
import re

import numpy as np

import optcc_results as R

SCHEME_ORDER = ["baseline", "cb", "cb_fe", "cb_fe_sc", "cb_nonlep"]


class Configuration:
    """Runs of one experiment with the same config apart from the seed."""

    def __init__(self, key, runs):
        self.key = key
        self.runs = sorted(runs, key=lambda r: (_value_sort(r.seed), r.name))
        by = {s: [r for r in self.runs if r.status()[0] == s] for s in R.STATUSES}
        self.complete, self.partial, self.failed = by["complete"], by["partial"], by["failed"]
        self.flat = R.flatten(self.runs[0].configuration())
        self.label, self.color, self.differ = "", "C0", []

    @property
    def used(self):
        """The runs the statistics use: the complete ones, else the partial ones."""
        return self.complete or self.partial

    @property
    def is_partial(self):
        return not self.complete and bool(self.partial)

    def runs_text(self):
        parts = [str(len(self.complete))]
        if self.partial:
            steps = ", ".join(f"{r.last_step}/{r.train_steps}" for r in self.partial)
            parts.append(f"{len(self.partial)} partial (step {steps})")
        if self.failed:
            parts.append(f"{len(self.failed)} failed")
        return " + ".join(parts)

    def display(self):
        return self.label + (" (partial)" if self.is_partial else "")


def _value_sort(v):
    if v is None:
        return (0, 0.0, "")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (1, float(v), "")
    return (2, 0.0, str(v))


def _short_names(keys):
    """Shortest dotted suffix of each key that is unique among `keys`."""
    out = {}
    for k in keys:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            cand = ".".join(parts[-n:])
            if sum(1 for o in keys if o == cand or o.endswith("." + cand)) == 1:
                out[k] = cand
                break
    return out


def name_stem(config):
    """The run name without its seed part: `optcc sweep` names runs by their grid values joined with
    '-' (baseline-seed1), so the tokens that differ between the configuration's runs, or a lone
    `seed<N>` token, are the seed. None when the names do not split alike."""
    tokens = [r.name.split("-") for r in config.runs]
    if len({len(t) for t in tokens}) != 1:
        return None
    if len(tokens) > 1:
        kept = [p for i, p in enumerate(tokens[0]) if len({t[i] for t in tokens}) == 1]
    else:
        kept = [p for p in tokens[0] if not re.fullmatch(r"seed\d+", p)]
    return "-".join(kept) or None


SCHEME_KEY = "compression.scheme"


def varying_keys(known):
    """Config keys whose values differ between the configurations; with compression.scheme among
    them, it comes first and the keys it determines are left out."""
    keys = sorted({k for c in known for k in c.flat})
    varying = [k for k in keys if len({json.dumps(c.flat.get(k)) for c in known}) > 1]
    if SCHEME_KEY not in varying:
        return varying

    def determined(k):
        seen = {}
        return all(seen.setdefault(c.flat.get(SCHEME_KEY), json.dumps(c.flat.get(k))) == json.dumps(c.flat.get(k))
                   for c in known)
    return [SCHEME_KEY] + [k for k in varying if k != SCHEME_KEY and not determined(k)]


def label_configurations(experiment, configs, known, varying):
    """Sets each configuration's label (see the docstring at the top) and the keys that differ."""
    short = _short_names(varying)
    for c in configs:
        c.differ = [k + (" (and the keys it sets)" if k == SCHEME_KEY else "") for k in varying]
        if not c.runs[0].config:
            c.label = f"{c.runs[0].name} (no config)"
            continue
        parts = [str(c.flat.get(k)) if k == SCHEME_KEY else f"{short[k]}={'-' if c.flat.get(k) is None else c.flat.get(k)}"
                 for k in varying]
        c.label = ", ".join(parts) or (c.runs[0].scheme if c.runs[0].scheme != "(none)" else experiment)
    stems = [name_stem(c) for c in known]
    if known and None not in stems and len(set(stems)) == len(stems):  # the sweep's names: grid values
        for c, stem in zip(known, stems):
            c.label = stem
    compression = [c.runs[0].compression for c in known]
    if known and all(compression):  # what each compresses (optcc's label), told apart where it repeats
        for c, label in zip(known, compression):
            if compression.count(label) > 1 and c.label != label:
                label = f"{label} [{c.label}]"
            c.label = label


def group_configurations(experiment, runs):
    """The experiment's configurations, labelled and sorted by their differing config values."""
    groups = {}
    for r in runs:
        groups.setdefault(r.configuration_hash() if r.config else f"failed:{r.name}", []).append(r)
    configs = [Configuration(k, v) for k, v in groups.items()]
    known = [c for c in configs if c.runs[0].config]  # a file without a config has no values to compare
    varying = varying_keys(known)
    label_configurations(experiment, configs, known, varying)

    def sort_key(c):
        out = []
        for k in varying:
            v = c.flat.get(k)
            out.append((SCHEME_ORDER.index(v) if v in SCHEME_ORDER else len(SCHEME_ORDER), str(v))
                       if k == SCHEME_KEY else _value_sort(v))
        return (out, c.label)
    return sorted(configs, key=sort_key)


def reference(configs):
    """(configuration, why) the others are compared with: the first that compresses nothing (optcc's
    compression label `baseline`; for files written before optcc recorded it, every compressor of
    the stored config `none` and no FE), else the first, and `why` says there is no uncompressed
    run."""
    def off(spec):  # a CompressorSpec as the effective config writes it: none, fp16, {name: ..., ...}
        return spec in (None, "none") or (isinstance(spec, dict) and spec.get("name") == "none")

    def uncompressed(c):
        if c.runs[0].compression:
            return c.runs[0].compression == "baseline"
        comp = c.runs[0].configuration().get("compression") or {}
        return all(off(comp.get(k)) for k in ("dp", "pipeline_backward", "pipeline_forward", "embedding", "tp")) \
            and not comp.get("fused_embedding", False)
    for c in configs:
        if uncompressed(c):
            return c, "no compression"
    return configs[0], "no uncompressed run in this experiment: the first configuration"


# --- per-configuration statistics ---------------------------------------------------------------

def final_stats(config):
    """[(seed, loss, ppl)] of the used runs' last evaluation."""
    out = []
    for r in config.used:
        e = r.final_eval()
        if e:
            out.append((r.seed, e[1], e[2]))
    return out


def paired_loss_by_seed(config, ref):
    """{seed: final loss minus the reference's} for the seeds both have (each side's mean over its
    runs of that seed), in seed order."""
    def by_seed(stats):
        d = {}
        for seed, loss, _ in stats:
            d.setdefault(str(seed), []).append(loss)
        return {s: float(np.mean(v)) for s, v in d.items()}
    mine, theirs = by_seed(final_stats(config)), by_seed(final_stats(ref))
    return {s: mine[s] - theirs[s] for s in sorted(mine) if s in theirs}


def paired_loss_differences(config, ref):
    """Final loss minus the reference's, per seed both have (paired_loss_by_seed's values)."""
    return list(paired_loss_by_seed(config, ref).values())


def speed(config):
    times = [r.step_time() for r in config.used]
    return R.mean_std([t[0] for t in times]), R.mean_std([t[1] for t in times])


def mb_per_step(config):
    """{class (and wire key, where every used run has it): mean MB per step over the used runs}
    ({} without traffic)."""
    per_run = [r.bytes_per_step() for r in config.used]
    per_run = [p for p in per_run if p]
    if not per_run:
        return {}
    keys = [k for k in per_run[0] if all(k in p for p in per_run)]
    return {k: float(np.mean([p[k] for p in per_run])) / 1e6 for k in keys}


def series(run, table, column):
    t = run.table(table)
    if not t or not len(t["step"]):
        return None, None
    return t["step"], t[column]


def band(runs, table, column, reduce=None):
    """(steps common to all runs, mean, std) of a column (reduce: per-step aggregation of rows)."""
    per = []
    for r in runs:
        s, v = series(r, table, column)
        if s is None:
            continue
        if reduce is not None:
            s, v = reduce(s, v)
        per.append(dict(zip(s.tolist(), v.tolist())))
    if not per:
        return None
    common = sorted(set.intersection(*(set(p) for p in per)))
    if not common:
        return None
    m = np.array([[p[s] for s in common] for p in per])
    std = m.std(axis=0, ddof=1) if len(per) > 1 else np.zeros(len(common))
    return np.array(common), m.mean(axis=0), std


def paired_eval_matrix(config, ref):
    """(steps, d): d[i, t] is the validation loss minus the reference's at steps[t] for the i-th seed
    both ran (used runs), at the evaluation steps all those pairs share; None without a pair."""
    def by_seed(c):
        return {str(r.seed): dict(zip(*(x.tolist() for x in series(r, "eval", "loss")))) for r in c.used
                if series(r, "eval", "loss")[0] is not None}
    mine, theirs = by_seed(config), by_seed(ref)
    pairs = [(mine[s], theirs[s]) for s in sorted(mine) if s in theirs]
    if not pairs:
        return None
    steps = sorted(set.intersection(*(set(a) & set(b) for a, b in pairs)))
    if not steps:
        return None
    return np.array(steps), np.array([[a[t] - b[t] for t in steps] for a, b in pairs])


def paired_eval_difference(config, ref):
    """(steps, mean, std, n) over the seeds of paired_eval_matrix; None without a pair."""
    m = paired_eval_matrix(config, ref)
    if m is None:
        return None
    steps, d = m
    std = d.std(axis=0, ddof=1) if len(d) > 1 else np.zeros(len(steps))
    return steps, d.mean(axis=0), std, len(d)

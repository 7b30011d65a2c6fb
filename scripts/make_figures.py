#!/usr/bin/env python3
"""Regenerate every figure and table the stored results allow, into paper/ (default).

  make_figures.py [--results DIR] [--out DIR] [--experiment NAME ...]

Inputs: the runs under DIR (default results/), one experiment per folder (results/<experiment>/
<run>.h5, with resumed and re-attempted files merged: scripts/optcc_results.py), and every Google
Benchmark JSON under DIR (tests/bench's bench_compression --benchmark_out=... --benchmark_out_format=json).
Files directly in DIR belong to no experiment: they are indexed (results_index.py), not plotted.
--experiment NAME (repeatable; the folder relative to DIR, e.g. table2 or reference/table2) limits
the work to those experiments (and the benchmark JSONs inside their folders); a NAME without results
whose DIR/reference/NAME exists (a fresh clone has only the committed reference runs) is named with
the command that draws those.

Runs are grouped into configurations: equal config apart from train.seed, log.run_name/dir/level
and checkpoint.dir (optcc_results.NON_CONFIG_KEYS). A configuration is labelled by what it
compresses (the runs' root attribute `compression`: baseline, a scheme's name, or e.g.
dp=powersgd(rank=4); where two configurations share one, the label below follows in brackets);
for files written before optcc recorded it, by its runs' name without the seed part (`optcc sweep`
names runs by their grid values: baseline-seed1 -> baseline) when those names tell the
configurations apart, else by the config keys whose values differ between the experiment's
configurations (compression.scheme first; keys the scheme determines left out); the table notes
name the differing keys. The reference configuration (speed-ups, ratios, paired differences;
listed first) is the first that compresses nothing; without one, the first, and the table says
there is no uncompressed run. Statistics use a configuration's complete runs; one
with only partial runs (still going or killed) is shown up to its last flush and marked "partial"
(dashed lines, table rows); partial runs next to complete ones are drawn dashed, one line each.
Means ± sample standard deviations (n - 1) are over seeds; "paired" differences compare runs of
the same train.seed.

Per experiment, into OUT/<experiment>/ (PNG and PDF for figures, Markdown and LaTeX for tables):
  table.{md,tex}          final validation ppl and loss, paired loss difference and ppl ratio to the
                          reference, tokens/s, speed-up, MB sent per step per traffic class (Table 2;
                          the ablations' and compressor comparisons' tables)
  curves.{png,pdf}        training loss (running mean over 2% of the steps), validation ppl and the
                          validation loss minus the reference's (paired by seed) against step, with
                          seed bands (Fig. 9)
  pareto.{png,pdf}        final validation ppl against MB per step, Pareto front (compressor comparison;
                          not drawn when the configurations' MB per step lie within 1% of each other)
  memory.{png,pdf,md,tex} tensor memory by component (each component's largest value over the ranks)
                          at the last step, and the tracked peak (Fig. 12)
  breakdown.{png,pdf,md,tex}  mean time breakdown of the timeline steps (Fig. 10; emulation_table.py)
  lep_orthogonality.{png,pdf,md,tex}  the Fig. 11 traces: mean |cos|, mean error, mean delta per step
  index.md                the experiment file's header (question, claim, expected outcome; the file under
                          experiments/ whose `experiment: name:` is the folder's last part, else whose
                          stem is), the folder's ABOUT.txt (what its runs are) and the above
Every figure carries a footnote: the runs it shows (how many, their seeds) and, when the runs'
folder has one, its ABOUT.txt (results/reference/<experiment>/ABOUT.txt: real runs or a placeholder,
and why).
Per benchmark JSON DIR/<path>/<name>.json, into OUT/<path>/<name>-fig14.{png,pdf,md,tex}: compression
and decompression throughput (GB/s of input) against rank on the Fig. 14 slice shapes.
A figure whose inputs are absent is skipped with one line saying what is missing. Output is
deterministic (fixed styles, sorted inputs, no timestamps); a file whose bytes would not change is
not rewritten, and a figure or table no longer drawn for an experiment has its earlier files
removed. Exit status 1 when a figure failed for another reason (the line names it).
The figure families live in scripts/figures/ (configs, output, quality, memory, timing, lep, bench);
this file is the driver: per experiment, every family's outputs and the index page.
"""
import argparse
import functools
import glob
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optcc_results as R  # noqa: E402
import yaml  # noqa: E402  (optcc_results has checked it is there)
from figures.bench import bench_figures, find_benchmarks  # noqa: E402
from figures.configs import group_configurations, reference  # noqa: E402
from figures.lep import orthogonality_outputs  # noqa: E402
from figures.memory import memory_outputs  # noqa: E402
from figures.output import STYLE, Output, about, plt, runs_folder  # noqa: E402
from figures.quality import curves_figure, pareto_figure, summary_table  # noqa: E402
from figures.timing import breakdown_outputs  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def experiment_files():
    """[(path, stem, experiment.name or None)] of every experiments/**/*.yaml, shallowest first. A
    file that does not parse, or is not a mapping (a config, a profile, a broken file), has no name."""
    out = []
    paths = glob.glob(os.path.join(REPO, "experiments", "**", "*.yaml"), recursive=True)
    for path in sorted(paths, key=lambda p: (p.count(os.sep), p)):
        try:
            with open(path, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            doc = None
        block = doc.get("experiment") if isinstance(doc, dict) else None
        name = block.get("name") if isinstance(block, dict) else None
        out.append((path, os.path.splitext(os.path.basename(path))[0], None if name is None else str(name)))
    return out


def experiment_file(experiment):
    """The experiment file of a results folder (its last part is the experiment's name, e.g.
    reference/compressors-dp): the file under experiments/ whose `experiment: name:` is that name,
    else the one whose stem is that name and that names no other experiment; None without either."""
    name = experiment.split("/")[-1]
    files = experiment_files()
    named = [p for p, _, n in files if n == name]
    if named:
        return named[0]
    stems = [p for p, stem, n in files if stem == name and n is None]
    return stems[0] if stems else None


def experiment_header(experiment):
    """The leading comment of the experiment's file (experiment_file), if there is one."""
    path = experiment_file(experiment)
    if path is None:
        return None, None
    lines = []
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                break
            lines.append(line[1:].strip())
    return os.path.relpath(path, REPO), lines


class Experiment:
    def __init__(self, name, runs, out):
        self.name, self.out = name, out
        self.folder = runs_folder(runs)  # results/<experiment>, where an ABOUT.txt may say what the runs are
        self.configs = group_configurations(name, runs)
        self.usable = [c for c in self.configs if c.used]  # with a training step to show
        self.ref, self.why = reference(self.usable) if self.usable else (None, "")
        if self.ref is not None:  # the reference first, the others in their order
            self.usable.remove(self.ref)
            self.usable.insert(0, self.ref)
        for i, c in enumerate(self.usable):  # one colour per configuration in every figure of the experiment
            c.color = f"C{i % 10}"
        self.made, self.skipped, self.errors = [], [], []

    def step(self, what, make):
        """Runs one output; a missing input is a skip line, any other failure an error line."""
        try:
            missing = make()
        except Exception as e:  # noqa: BLE001 -- one line per failed figure, never a traceback
            self.errors.append(f"{what}: {type(e).__name__}: {e}")
            return
        if missing:
            self.skipped.append(f"{what} ({missing})")
        else:
            self.made.append(what)

    def render(self):
        d, usable = self.name, self.usable
        self.step("table", lambda: "no run with a training step" if not usable else
                  self.out.table(f"{d}/table", summary_table(d, usable, self.ref, self.why)))
        self.step("curves", lambda: self._figure("curves", curves_figure(d, usable, self.ref), "no /train or /eval rows"))
        self.step("pareto", lambda: self._figure("pareto", pareto_figure(d, usable),
                                                 "fewer than 2 configurations with a final ppl and /traffic, "
                                                 "or their MB per step within 1%"))
        self.step("memory", lambda: self._pair("memory", memory_outputs(d, usable), "no /memory_components rows"))
        self.step("breakdown", lambda: self._pair("breakdown", breakdown_outputs(d, usable, self.ref),
                                                  "no /breakdown rows: set log.timeline_steps"))
        self.step("lep_orthogonality", lambda: self._pair("lep_orthogonality", orthogonality_outputs(d, usable),
                                                          "no /lep_orthogonality rows: set log.lep_orthogonality"))
        self._index()

    def _figure(self, stem, fig, missing):
        if fig is None:
            self.out.remove_stem(f"{self.name}/{stem}")  # an earlier run's figure would be stale
            return missing
        self.out.figure(f"{self.name}/{stem}", fig)

    def _pair(self, stem, outputs, missing):
        fig, table = outputs
        if fig is None:
            self.out.remove_stem(f"{self.name}/{stem}")
            return missing
        self.out.figure(f"{self.name}/{stem}", fig)
        self.out.table(f"{self.name}/{stem}", table)

    def _index(self):
        src, header = experiment_header(self.name)
        lines = [f"# {self.name}", ""]
        if self.name.startswith("reference/"):
            lines += ["Committed reference results (`results/reference/`: some are the experiment file's real "
                      "cpu-scale runs, others smaller placeholders made by `scripts/reference_results.sh`); "
                      "the folder's ABOUT.txt (below, when there is one) says which, `paper/README.md` also what "
                      "they can and cannot show.", ""]
        note = about(self.folder)
        if note:
            path = os.path.join(self.folder, "ABOUT.txt")
            rel = os.path.relpath(os.path.abspath(path), REPO)
            lines += [f"About these runs (`{path if rel.startswith('..') else rel}`): {note}", ""]
        if header:
            lines += [f"From `{src}`:", "", "```"] + header + ["```", ""]
        for what in self.made:
            if what in ("table",):
                with open(os.path.join(self.out.root, self.name, "table.md")) as f:
                    lines += [f.read()]
            elif what in ("memory", "breakdown", "lep_orthogonality"):
                with open(os.path.join(self.out.root, self.name, f"{what}.md")) as f:
                    lines += [f"![{what}]({what}.png)", "", f.read()]
            else:
                lines += [f"![{what}]({what}.png)", ""]
        if self.skipped:
            lines += ["Not drawn: " + "; ".join(self.skipped) + "."]
        self.out.write(f"{self.name}/index.md", "\n".join(lines).rstrip() + "\n")


def reference_hint(args, name):
    """When results/reference/<name> exists (the committed runs of a fresh clone): where they are and
    the command that draws them; else ''."""
    ref = os.path.join(args.results, "reference", name)
    if name.startswith("reference/") or not os.path.isdir(ref):
        return ""
    command = ["scripts/make_figures.py"] + (["--results", args.results] if args.results != "results" else []) + \
        (["--out", args.out] if args.out != "paper" else []) + ["--experiment", f"reference/{name}"]
    return (f"; the committed reference results are under {ref}/ (experiment reference/{name}): "
            f"{shlex.join(command)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results", help="results folder (default results/)")
    ap.add_argument("--out", default="paper", help="output folder (default paper/)")
    ap.add_argument("--experiment", action="append", metavar="NAME",
                    help="only this experiment (folder under --results); repeatable")
    args = ap.parse_args()
    if not os.path.isdir(args.results):
        sys.exit(f"make_figures.py: --results {args.results}: no such folder")
    plt.rcParams.update(STYLE)
    wanted = set(args.experiment) if args.experiment else None
    runs = R.load_runs(args.results, wanted)
    by_exp = {}
    for r in runs:
        by_exp.setdefault(r.experiment, []).append(r)
    out, errors = Output(args.out), 0
    if wanted:
        benched = {rel.rsplit("/", 1)[0] for rel, _ in find_benchmarks(args.results)} - set(by_exp)
        for name in sorted(wanted - set(by_exp)):
            if any(b == name or b.startswith(name + "/") for b in benched):
                continue  # benchmark JSON only: drawn below
            print(f"make_figures: {name}: no results under {os.path.join(args.results, name)}{reference_hint(args, name)}")
    if "" in by_exp:
        print(f"make_figures: {len(by_exp.pop(''))} runs directly in {args.results}/ belong to no experiment: "
              "indexed, not plotted (an experiment's runs go to results/<experiment>/)")
    for name in sorted(by_exp):
        e = Experiment(name, by_exp[name], out)
        e.render()
        print(f"make_figures: {name}: {len(by_exp[name])} runs, {len(e.configs)} configurations -> "
              f"{os.path.join(args.out, name)}/: {', '.join(e.made) or 'nothing'}")
        if e.skipped:
            print(f"make_figures: {name}: skipped " + "; ".join(e.skipped))
        for line in e.errors:
            print(f"make_figures: {name}: FAILED {line}")
        errors += len(e.errors)
    errors += bench_figures(args, wanted, out)
    removed = f", {len(out.removed)} stale removed" if out.removed else ""
    print(f"make_figures: {len(out.written)} files written, {len(out.unchanged)} unchanged{removed} under {args.out}/")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()

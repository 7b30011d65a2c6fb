"""Output files (written only when their bytes change, atomically), tables as Markdown and LaTeX,
the one plotting style of every figure (deterministic: no timestamps in PNG or PDF), and the
footnote every figure carries: which runs it shows (how many, their seeds) and the ABOUT.txt of
their folder (results/reference/<experiment>/ABOUT.txt: real runs or a placeholder, and why)."""
import io
import os
import re
import sys
import textwrap

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:
    sys.exit(f"make_figures.py: {e}; install python3-matplotlib (scripts/deps.sh) or run with /usr/bin/python3")

STYLE = {"figure.dpi": 100, "savefig.dpi": 120, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
         "legend.fontsize": 7, "axes.prop_cycle": matplotlib.cycler(color=plt.get_cmap("tab10").colors)}
PNG_META = {"Software": None}
PDF_META = {"Creator": None, "Producer": None, "CreationDate": None}
FOOTNOTE_SIZE = 6.5  # points; grey, under everything else drawn on the figure


def about(folder):
    """The text of folder/ABOUT.txt (one or two lines saying what the runs there are), its lines
    joined by spaces; '' when the folder has none."""
    if not folder:
        return ""
    try:
        with open(os.path.join(folder, "ABOUT.txt"), encoding="utf-8") as f:
            return " ".join(line.strip() for line in f if line.strip())
    except OSError:
        return ""


def runs_folder(runs):
    """The folder of the runs' results files (an experiment's folder), or None."""
    for r in runs:
        for path in [f.path for f in r.files] + [u[0] for u in r.unreadable]:  # unreadable: (path, why)
            return os.path.dirname(path)
    return None


def _seed_key(seed):
    return (0, int(seed), "") if seed.lstrip("-").isdigit() else (1, 0, seed)


def runs_note(experiment, configs, runs_of=lambda c: c.used):
    """'<experiment>: N runs (K configurations), seeds 1, 2, 3' of the runs a figure shows
    (runs_of(configuration) for each), then their folder's ABOUT.txt."""
    configs = [c for c in configs if runs_of(c)]
    runs = [r for c in configs for r in runs_of(c)]
    seeds = sorted({str(r.seed) for r in runs if str(r.seed) != ""}, key=_seed_key)
    text = f"{experiment}: {len(runs)} run{'' if len(runs) == 1 else 's'}"
    if len(configs) > 1:
        text += f" ({len(configs)} configurations)"
    text += (f", seed{'' if len(seeds) == 1 else 's'} {', '.join(seeds)}" if seeds else ", no seed recorded")
    note = about(runs_folder(runs))
    return text + (f". {note}" if note else "")


def short(label, width=30):
    """A configuration's label for a legend or an axis, wrapped after spaces, commas and opening
    parentheses so a long one (`cb_fe_sc with dp=powersgd(...)`) does not spill over the next panel."""
    lines = [""]
    for piece in re.split(r"(?<=[ ,(])", label):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(line.rstrip() for line in lines)


def footnote(fig, text):
    """Writes `text` in small grey type under everything drawn on `fig`, left-aligned, wrapped to
    the drawing's width (one line when it fits)."""
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches, everything drawn so far
    chars = max(60, int(box.width * 72 / (0.5 * FOOTNOTE_SIZE)))  # about half an em per character
    fig.text(box.x0 / fig.get_figwidth(), (box.y0 - 0.05) / fig.get_figheight(), "\n".join(textwrap.wrap(text, chars)),
             ha="left", va="top", fontsize=FOOTNOTE_SIZE, color="0.45")


class Output:
    """Writes files under a root, leaving unchanged ones alone; counts what it did."""

    def __init__(self, root):
        self.root, self.written, self.unchanged, self.removed = root, [], [], []

    def remove_stem(self, rel_stem):
        """Deletes rel_stem.{png,pdf,md,tex} where they exist (an output no longer drawn)."""
        for ext in ("png", "pdf", "md", "tex"):
            path = os.path.join(self.root, f"{rel_stem}.{ext}")
            if os.path.exists(path):
                os.remove(path)
                self.removed.append(path)

    def write(self, rel, data):
        path = os.path.join(self.root, rel)
        data = data.encode() if isinstance(data, str) else data
        if os.path.exists(path):
            with open(path, "rb") as f:
                if f.read() == data:
                    self.unchanged.append(path)
                    return path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        self.written.append(path)
        return path

    def figure(self, rel_stem, fig):
        for ext, meta in (("png", PNG_META), ("pdf", PDF_META)):
            buf = io.BytesIO()
            fig.savefig(buf, format=ext, metadata=meta, bbox_inches="tight")
            self.write(f"{rel_stem}.{ext}", small_png(buf.getvalue()) if ext == "png" else buf.getvalue())
        plt.close(fig)

    def table(self, rel_stem, table):
        self.write(f"{rel_stem}.md", table.markdown())
        self.write(f"{rel_stem}.tex", table.latex())


def small_png(data):
    """The PNG as 256 palette colours (PIL's octree quantizer, deterministic) and zlib's best effort:
    about 4x smaller than matplotlib's RGBA for these line plots, no visible difference; the committed
    figures travel with the repository (docs/builds.md, "Size budgets"). PIL comes with matplotlib."""
    from PIL import Image
    octree = getattr(Image, "Quantize", Image).FASTOCTREE  # Pillow >= 9.1 names it Image.Quantize.FASTOCTREE
    im = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=256, method=octree)
    out = io.BytesIO()
    im.save(out, format="png", optimize=True)
    return out.getvalue()


class Table:
    """A table of text cells rendered as Markdown and as a LaTeX tabular (booktabs)."""

    def __init__(self, title, header, rows, notes=()):
        self.title, self.header, self.rows, self.notes = title, header, rows, list(notes)

    def markdown(self):
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.header) + " |",
                 "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in self.rows]
        return "\n".join(lines + [""] + [f"- {n}" for n in self.notes]) + "\n"

    def latex(self):
        def esc(s):
            s = s.replace("\\", r"\textbackslash{}")
            for a, b in (("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("±", r"$\pm$"),
                         ("Δ", r"$\Delta$"), ("×", r"$\times$"), ("|", r"$|$")):
                s = s.replace(a, b)
            return s
        lines = [f"% {esc(self.title)}", "% generated by scripts/make_figures.py; do not edit"]
        lines += [f"% {esc(n)}" for n in self.notes]
        lines += [r"\begin{tabular}{l" + "r" * (len(self.header) - 1) + "}", r"\toprule",
                  " & ".join(esc(h) for h in self.header) + r" \\", r"\midrule"]
        lines += [" & ".join(esc(c) for c in r) + r" \\" for r in self.rows]
        return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"]) + "\n"


def pm(mean, std, digits):
    """'m ± s' with `digits` decimals; 'm' alone when std is NaN (one value); '' when no value."""
    if mean != mean:
        return ""
    return f"{mean:.{digits}f}" if std != std else f"{mean:.{digits}f} ± {std:.{digits}f}"

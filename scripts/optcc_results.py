"""Reading optcc results files: one module for results_index.py, make_figures.py, scheme_table.py and
emulation_table.py.

Files and runs (harness/train/trainer.h). A run writes <dir>/<run>.h5; resumed at step S it writes
<run>.resumed-S.h5, and when that name is taken the first free <name>.attempt-N.h5. So one run's records
can span several files. `find_runs` groups every *.h5 under a results directory into runs: the
experiment is the folder relative to the results directory ("" for files directly in it), the run the
file name without those suffixes. `Run` merges a run's files by step:
  * files are ordered by their root attribute start_time (UTC, ISO 8601), then by resumed step and
    attempt number (the order they were started in);
  * each file starts at its attribute resumed_from_step S (0 for a fresh start): it replaces every row
    of the earlier files with step > S (the later file wins; rows an abandoned attempt flushed after
    the checkpoint it was resumed from belong to a timeline that no longer exists), then adds its own.
  A file that cannot be opened is left out and named in `Run.unreadable`.
  A file resumed with `optcc train --allow-config-change` (its attribute resume_config_changes is not
  empty: the run went on under another config; harness/train/resume_check.h lists what a plain resume
  may change) is not merged: `load_runs` makes it and the files after it a run of their own, named
  "<run> (config changed at step S)", so no table or figure joins two experiments into one curve.

Status of a run (the index's `status` column):
  complete  the merged /train table reached train.train_steps (config of the newest readable file);
  partial   it has training steps, fewer than train_steps: still running, killed or requeued (only rows
            up to the last flush are on disk);
  failed    nothing to show: no readable file, no config attribute, no training step flushed (also a
            run that has just started and not reached its first log.interval flush), or the last
            training loss is not finite (diverged).

Tables are read column by column as numpy arrays; `Run.table(name, since=STEP)` reads only the rows
with step >= STEP (binary search on the sorted step column), so paper-scale files (hundreds of
millions of /traffic rows) are not read whole for the last steps' bytes.
Needs h5py, numpy and PyYAML (Debian: python3-h5py python3-numpy python3-yaml; /usr/bin/python3).
"""
import hashlib
import json
import math
import os
import re
import sys

try:
    import h5py
    import numpy as np
    import yaml
except ImportError as e:
    sys.exit(f"optcc_results: {e}; install python3-h5py python3-numpy python3-yaml (scripts/deps.sh) "
             "or run with /usr/bin/python3")

TRAFFIC_CLASSES = ["tp", "pp_fwd", "pp_bwd", "dp", "embedding", "control", "outer"]  # /traffic class numbers (communicator.h)
DATA_CLASSES = TRAFFIC_CLASSES[:5] + ["outer"]  # what a scheme compresses; control (records, barriers) left out
# The pipeline classes also hold the receiving stage's TP all-gather of scatter-gathered slices
# (harness/parallel/stage_link.h); "<class> wire" is their stage-to-stage sends alone (/traffic's
# p2p_bytes column; files written before it have none): what a pipeline codec compresses.
WIRE_CLASSES = ["pp_fwd", "pp_bwd"]


def wire_key(cls):
    return f"{cls} wire"
MEMORY_COMPONENTS = ["parameters", "gradients", "optimizer", "activations_peak", "lep_buffers",
                     "ef_buffers", "pq_buffers", "outer_state"]  # outer_state: DiLoCo (files before it: 0)
STATUSES = ["complete", "partial", "failed"]
# Config keys that name or place a run rather than change what it computes (left out of a
# configuration, so runs that differ only there and in train.seed are seeds of one configuration).
NON_CONFIG_KEYS = [("train", "seed"), ("log", "run_name"), ("log", "dir"), ("log", "level"),
                   ("checkpoint", "dir"),
                   # What a run does on inf/NaN gradients in fp32/bf16 (stop, or skip and record it in
                   # /train's `skipped`): a run without such a fault computes the same either way.
                   ("train", "skip_nonfinite")]
# Keys added to the config after results were first written, with the value older builds ran as
# (config_keys_added.yaml explains it): a file without one is read as if it recorded that value.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "config_keys_added.yaml")) as _f:
    KEYS_ADDED = yaml.safe_load(_f)

# `optcc eval` writes <run>.eval-<step>[.attempt-N].h5 next to the run (harness/checkpoints/eval_checkpoint.h):
# an evaluation of a checkpoint, not a run's records; find_runs leaves these files out.
EVAL_FILE = re.compile(r"\.eval-\d+(?:\.attempt-\d+)?\.h5$")
RUN_FILE = re.compile(r"^(?P<run>.+?)(?:\.resumed-(?P<step>\d+))?(?:\.attempt-(?P<attempt>\d+))?\.h5$")


def lep_diagnostics_first_step(train_steps):
    """The first step of /lep_diagnostics the LEP study reads: its means are over the run's second half
    (steps > train_steps / 2). compact_results.py --trim drops the rows before it."""
    return max(1, int(train_steps) // 2 + 1)


def text(value):
    """An HDF5 attribute as str (h5py gives str or bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def attr(f, name, default=""):
    return text(f.attrs[name]) if name in f.attrs else default


def run_lock_path(path):
    """The run lock of a results file: <dir>/<run>.lock, which its writer holds with flock(2) for the run's
    life (harness/records/run_lock.h); also for <run>.resumed-S.h5 and <run>.attempt-N.h5."""
    parsed = parse_file_name(os.path.basename(path))
    return os.path.join(os.path.dirname(path), (parsed[0] if parsed else os.path.basename(path)) + ".lock")


def writer_alive(path):
    """True while a process holds the run lock of results file `path` (its writer is running)."""
    import fcntl
    try:
        fd = os.open(run_lock_path(path), os.O_RDONLY)
    except OSError:
        return False  # no lock file: nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock


def _hdf5_library():
    """ctypes handle of the HDF5 library h5py itself loaded (the same instance, found in this process's
    memory map), with the few calls clear_stale_write_flag needs; None when it cannot be found."""
    import ctypes
    names = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            lib = line.split()[-1] if line.strip() else ""
            base = os.path.basename(lib)
            if base.startswith("libhdf5") and "_hl" not in base and ".so" in base:
                names.add(lib)
    for name in sorted(names):
        try:
            lib = ctypes.CDLL(name)
            lib.H5Fincrement_filesize  # HDF5 >= 1.10.2
        except (OSError, AttributeError):
            continue
        hid = ctypes.c_int64
        lib.H5Pcreate.restype, lib.H5Pcreate.argtypes = hid, [hid]
        lib.H5Pset.argtypes = [hid, ctypes.c_char_p, ctypes.c_void_p]
        lib.H5Fopen.restype, lib.H5Fopen.argtypes = hid, [ctypes.c_char_p, ctypes.c_uint, hid]
        lib.H5Fclose.argtypes = [hid]
        lib.H5Pclose.argtypes = [hid]
        lib.H5Fincrement_filesize.argtypes = [hid, ctypes.c_uint64]
        return lib
    return None


def clear_stale_write_flag(path):
    """What `h5clear -s --increment=0` does, through the HDF5 library h5py uses: clears the superblock's
    "open for write" flags that a writer killed in SWMR mode leaves behind (a plain reader, h5py.File(path,
    "r"), pandas or h5dump, then fails with "file is already open for write"), and sets the end of the
    file's address space to its size, so the rows the writer flushed can be read. Only when the run lock
    is free (the writer is gone); the shared lock is held while clearing, so no run takes the file over
    meanwhile. True when the file was cleared."""
    import ctypes
    import fcntl
    try:
        lock = os.open(run_lock_path(path), os.O_RDONLY)
    except OSError:
        lock = None
    try:
        if lock is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return False  # the writer is alive: never touch its file
        lib = _hdf5_library()
        if lib is None:
            return False
        lib.H5open()
        fapl = lib.H5Pcreate(ctypes.c_int64.in_dll(lib, "H5P_CLS_FILE_ACCESS_ID_g").value)
        if fapl < 0:
            return False
        try:
            clear = ctypes.c_bool(True)
            if lib.H5Pset(fapl, b"clear_status_flags", ctypes.byref(clear)) < 0:
                return False
            fid = lib.H5Fopen(os.fsencode(path), 1, fapl)  # H5F_ACC_RDWR
            if fid < 0:
                return False
            ok = lib.H5Fincrement_filesize(fid, 0) >= 0
            return lib.H5Fclose(fid) >= 0 and ok
        finally:
            lib.H5Pclose(fapl)
    finally:
        if lock is not None:
            os.close(lock)


def open_results(path):
    """Opens a results file for reading, also while its run writes it (SWMR) or after a kill.
    A file whose writer died (SIGKILL, a node crash) still carries HDF5's "open for write" flag, which
    only an SWMR reader gets past; when the run lock says the writer is gone, the flag is cleared
    (clear_stale_write_flag), so the file opens in any reader afterwards."""
    try:
        return h5py.File(path, "r")
    except OSError as e:
        if "already open for write" not in str(e):
            raise
    if not writer_alive(path):
        if clear_stale_write_flag(path):
            return h5py.File(path, "r")
    return h5py.File(path, "r", swmr=True)  # a live run between flushes, or a file this user cannot write



def parse_file_name(name):
    """(run, resumed step, attempt) of a results file name, e.g. 'a.resumed-30.attempt-2.h5' ->
    ('a', 30, 2); None for a name that is not *.h5."""
    m = RUN_FILE.match(name)
    if not m:
        return None
    return m["run"], int(m["step"] or 0), int(m["attempt"] or 1)


def find_runs(results_dir):
    """{(experiment, run): [paths]} for every *.h5 under results_dir (but `optcc eval` outputs, EVAL_FILE),
    in sorted order."""
    runs = {}
    for root, dirs, files in os.walk(results_dir):
        dirs.sort()
        rel = os.path.relpath(root, results_dir)
        experiment = "" if rel == "." else rel.replace(os.sep, "/")
        for name in sorted(files):
            parsed = None if EVAL_FILE.search(name) else parse_file_name(name)
            if parsed:
                runs.setdefault((experiment, parsed[0]), []).append(os.path.join(root, name))
    return dict(sorted(runs.items()))


def _bisect_step(ds, step):
    """First row of the sorted 1-D step dataset `ds` with a value >= step (reads ~log2(n) elements)."""
    lo, hi = 0, ds.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if int(ds[mid]) < step:
            lo = mid + 1
        else:
            hi = mid
    return lo


class ResultsFile:
    """One readable file of a run: its attributes and where it starts."""

    def __init__(self, path):
        self.path = path
        _, name_step, self.attempt = parse_file_name(os.path.basename(path)) or (None, 0, 1)
        with open_results(path) as f:
            self.attrs = {k: text(f.attrs[k]) for k in f.attrs}
        self.first_step = int(self.attrs.get("resumed_from_step", name_step) or 0)
        self.start_time = self.attrs.get("start_time", "")

    def order(self):
        return (self.start_time, self.first_step, self.attempt, self.path)

    def read(self, name, since=None):
        """{column: array} of table `name` (rows with step >= since), or None when it is absent."""
        with open_results(self.path) as f:
            if name not in f or not isinstance(f[name], h5py.Group):
                return None
            g = f[name]
            cols = [c for c in g if isinstance(g[c], h5py.Dataset)]
            if not cols:
                return None
            n = min(g[c].shape[0] for c in cols)  # equal after every flush; min guards a torn one
            start = 0
            if since is not None and "step" in g:
                start = min(_bisect_step(g["step"], since), n)
            return {c: g[c][start:n] for c in cols}


def _truncate(table, last_step):
    keep = table["step"] <= last_step
    return {c: v[keep] for c, v in table.items()}


class Run:
    """The records of one run, merged over its files (see the module's docstring)."""

    def __init__(self, experiment, name, paths):
        self.experiment, self.name = experiment, name
        self.files, self.unreadable = [], []
        for p in paths:
            try:
                self.files.append(ResultsFile(p))
            except (OSError, KeyError, ValueError) as e:
                self.unreadable.append((p, str(e).splitlines()[0] if str(e) else type(e).__name__))
        self.files.sort(key=ResultsFile.order)
        self.attrs = self.files[-1].attrs if self.files else {}
        self.config = self._parse_config()
        self._cache = {}

    @classmethod
    def from_paths(cls, paths):
        """A run of the given files (e.g. one file named on a command line)."""
        name = parse_file_name(os.path.basename(paths[0]))
        return cls("", name[0] if name else paths[0], paths)

    def _parse_config(self):
        try:
            cfg = yaml.safe_load(self.attrs.get("config", "")) if self.attrs.get("config") else None
        except yaml.YAMLError:
            return None
        return cfg if isinstance(cfg, dict) else None

    def attr(self, name, default=""):
        return self.attrs.get(name, default)

    def table(self, name, since=None):
        """{column: array} merged over the run's files; empty columns when no file has the table."""
        key = (name, since)
        if key not in self._cache:
            merged = None
            for f in self.files:
                part = f.read(name, since)
                if merged is not None and "step" in merged:
                    merged = _truncate(merged, f.first_step)
                if part is None:
                    continue
                merged = part if merged is None else {
                    c: np.concatenate([merged[c], part[c]]) for c in part if c in merged}
            self._cache[key] = merged or {}
        return self._cache[key]

    def rows(self, name):
        t = self.table(name)
        return len(next(iter(t.values()))) if t else 0

    # --- facts of the run -------------------------------------------------------------------
    def cfg(self, section, key, default=None):
        return ((self.config or {}).get(section) or {}).get(key, default)

    @property
    def train_steps(self):
        return int(self.cfg("train", "train_steps", 0) or 0)

    @property
    def seed(self):
        return self.cfg("train", "seed", "")

    @property
    def scheme(self):
        return self.attr("compression_scheme", "(none)")

    @property
    def compression(self):
        """What the run compresses, as optcc labelled it (root attribute `compression`: `baseline`,
        a scheme's name, or the acting settings such as `dp=powersgd(rank=4)`; compression_label in
        harness/config/config.h). "" for files written before optcc recorded it."""
        return self.attr("compression", "")

    @property
    def last_step(self):
        steps = self.table("train").get("step")
        return int(steps[-1]) if steps is not None and len(steps) else 0

    def status(self):
        """(status, reason): see the module's docstring."""
        if not self.files:
            return "failed", "no readable file"
        if self.config is None:
            return "failed", "no config attribute"
        t = self.table("train")
        if not t or not len(t["step"]):
            return "failed", "no training step flushed"
        if not math.isfinite(float(t["loss"][-1])):
            return "failed", f"loss not finite at step {int(t['step'][-1])}"
        if self.last_step >= self.train_steps:
            return "complete", ""
        return "partial", f"step {self.last_step} of {self.train_steps}"

    def final_eval(self):
        """(step, loss, ppl) of the last evaluation, or None."""
        e = self.table("eval")
        if not e or not len(e["step"]):
            return None
        return int(e["step"][-1]), float(e["loss"][-1]), float(e["ppl"][-1])

    def timed_steps(self, warmup=3):
        """(steps, statistic): the training steps a step time is taken over, and "median" or "mean".
        Without DiLoCo: the steps after `warmup` that recorded no timeline (/breakdown), median (robust
        to a slow step). Under DiLoCo (outer_period H): the whole periods after `warmup`, steps k*H+1 ..
        (k+1)*H, timeline steps included, mean: the outer exchange costs one step in H (per fragment),
        which a median would leave out. Empty when no such step (or period) was recorded."""
        t = self.table("train")
        if not t or not len(t["step"]):
            return np.array([], dtype=np.int64), "median"
        steps = np.asarray(t["step"])
        period = self.outer_period()
        if not period:
            recorded = self.table("breakdown").get("step", np.array([], dtype=np.int64))
            return steps[(steps > warmup) & ~np.isin(steps, recorded)], "median"
        first = period * -(-warmup // period) + 1  # the first period that starts after the warm-up
        whole = (int(steps.max()) - first + 1) // period
        return steps[(steps >= first) & (steps < first + whole * period)], "mean"

    def step_time(self, warmup=3):
        """Step seconds and tokens/s over timed_steps(warmup), by its statistic (NaN when there are
        none; tokens/s = the config's tokens per step / that step time under DiLoCo's mean)."""
        t = self.table("train")
        steps, statistic = self.timed_steps(warmup)
        if not len(steps):
            return float("nan"), float("nan")
        keep = np.isin(t["step"], steps)
        if statistic == "median":
            return float(np.median(t["step_seconds"][keep])), float(np.median(t["tokens_per_second"][keep]))
        seconds = float(np.mean(t["step_seconds"][keep]))
        tokens = t["tokens_per_second"][keep] * t["step_seconds"][keep]  # each step's tokens
        return seconds, float(np.mean(tokens)) / seconds

    def outer_period(self):
        """DiLoCo's period H (diloco.inner_steps) when the run's compression.dp_strategy is diloco, else
        None: its outer traffic comes once per fragment per H steps."""
        if self.cfg("compression", "dp_strategy") != "diloco":
            return None
        return int(self.cfg("diloco", "inner_steps", 16))

    def bytes_per_step(self, window=20):
        """{class: bytes all ranks sent per training step}, mean over the last `window` recorded steps
        after the first (steady state: PowerSGD warm-up and SC calibration are over); under DiLoCo the
        window is whole periods (outer_period), which hold each fragment's sync once: `window` rounded
        up to them, or as many as the steps after the first hold when the run is shorter (a 20-step
        trial at H = 12: steps 9..20, one sync, not steps 2..20);
        {} without /traffic rows."""
        last = self.last_step
        period = self.outer_period()
        if period:
            window = period * -(-window // period)
            if last - window + 1 < 2 and (last - 1) // period >= 1:  # too short: the whole periods after step 1
                window = period * ((last - 1) // period)
        t = self.table("traffic", since=max(2, last - window + 1))
        if not t or not len(t["step"]):
            return {}
        t = {c: v[t["step"] <= last] for c, v in t.items()}
        n = max(1, len(np.unique(t["step"])))
        out = {c: float(t["bytes"][t["class"] == i].sum()) / n for i, c in enumerate(TRAFFIC_CLASSES)}
        if "p2p_bytes" in t:
            for c in WIRE_CLASSES:
                out[wire_key(c)] = float(t["p2p_bytes"][t["class"] == TRAFFIC_CLASSES.index(c)].sum()) / n
        return out

    def config_hash(self):
        """sha256 (12 hex digits) of the stored config attribute, as written."""
        return hashlib.sha256(self.attr("config").encode()).hexdigest()[:12]

    def configuration(self):
        """The config without the keys that only name or place the run (NON_CONFIG_KEYS), as a dict; a key
        its build did not have yet (KEYS_ADDED) takes the value that build ran as."""
        cfg = json.loads(json.dumps(self.config or {}, default=str))
        if cfg:
            for section, keys in KEYS_ADDED.items():
                have = cfg.setdefault(section, {})
                if isinstance(have, dict):
                    for key, value in keys.items():
                        have.setdefault(key, value)
        for section, key in NON_CONFIG_KEYS:
            (cfg.get(section) or {}).pop(key, None)
        return cfg

    def configuration_hash(self):
        return hashlib.sha256(json.dumps(self.configuration(), sort_keys=True).encode()).hexdigest()[:12]


def split_at_config_changes(experiment, name, paths):
    """The run's files as one Run, or several when a file was resumed under a changed config (the
    module's docstring): each such file starts a new run named '<name> (config changed at step S)'."""
    run = Run(experiment, name, paths)
    cuts = [i for i, f in enumerate(run.files) if i > 0 and f.attrs.get("resume_config_changes", "")]
    if not cuts:
        return [run]
    out, start = [], 0
    for cut in cuts + [len(run.files)]:
        part = [f.path for f in run.files[start:cut]]
        label = name if start == 0 else f"{name} (config changed at step {run.files[start].first_step})"
        unreadable = [p for p, _ in run.unreadable] if start == 0 else []
        out.append(Run(experiment, label, part + unreadable))
        start = cut
    return out


def load_runs(results_dir, experiments=None):
    """Every run under results_dir (optionally only the named experiments), sorted; a run resumed
    under a changed config is split there (split_at_config_changes)."""
    out = []
    for (experiment, name), paths in find_runs(results_dir).items():
        if experiments is None or experiment in experiments:
            out.extend(split_at_config_changes(experiment, name, paths))
    return out


def flatten(d, prefix=""):
    """{'a': {'b': 1}} -> {'a.b': 1}; lists become compact JSON text."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out


def mean_std(values):
    """(mean, sample standard deviation with n - 1, n); std is NaN for one value."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) == 0:
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else float("nan"), len(v)

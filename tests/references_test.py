#!/usr/bin/env python3
"""Checks that every reference in the tree points at something a reader of the repository can open.

  references_test.py REPO_ROOT

Scans every file git lists (tracked, plus untracked files that .gitignore does not exclude, so a new
page is checked before it is committed), skipping binary files, *.h5, *.png, *.pdf and this file.
A finding is printed as file:line, the rule, the offending text and the fix. Rules:

  a  a private specification: "spec §N", "the spec's §N", "the spec", "optimus-cc-spec.md".
     Fix: cite docs/design.md §N (its headings carry the same numbers).
  b  "docs/design.md §N" (or docs/architecture.md §N, and the further §s of a list after it) where
     that page has no heading numbered N (`## N. ...`, `### N.M ...`).
  c  a fault id BR-nn without a `## BR-nn` heading in docs/faults.md.
  d  "issue N" / "issues N": a private tracker. Allowed on a line with an http(s) URL (a public
     issue of another project). Fix: say the reason itself.
  e  a path or note outside the repository: ../shared, /work/shared, shared/docs, shared/peers,
     "shared notes".
  f  "architecture.md" or "design.md" not written as docs/architecture.md, docs/design.md (or
     "architecture §N"); relative Markdown links inside docs/ are fine.
  g  a repository path to a source or doc file (compat/ kernels/ models/ compression/ harness/
     datasets/ scripts/ slurm/ experiments/ paper/ tests/ docs/ cmake/ ... .h .cpp .py .sh .yaml
     .md .txt .cmake) that exists neither from the root nor from the file's own folder. In code
     files only comments (and Python docstrings) count: code builds fixture paths. Globs (*, {a,b}),
     <placeholders>, NAME.yaml-style and one-letter names (x.h) are skipped.
  h  a bare "§N" that names no document (docs/design.md, docs/architecture.md or the paper);
     inside docs/design.md and docs/architecture.md a bare §N is the page's own section (rule b).

Prints a count per rule. Exit 0 = no finding, 1 = findings, 77 = not a git checkout (skipped).
"""
import bisect
import os
import re
import subprocess
import sys

SKIP_SUFFIXES = (".h5", ".png", ".pdf")
SELF = "tests/references_test.py"
RULES = {
    "a": "private spec cited",
    "b": "§ with no such heading",
    "c": "BR id not in docs/faults.md",
    "d": "private issue number",
    "e": "path outside the repository",
    "f": "architecture.md without docs/",
    "g": "path that does not exist",
    "h": "§ naming no document",
}

# Whitespace, a line break and the next line's comment marker: a reference may wrap in a comment.
GAP = r"(?:\s|//+|/\*+|\*+|#+|%+|--)*?"
# \b, or right after a "\n"/"\t" escape of a string literal ("\nSpec §9 rows").
WORD = r"(?:\b|(?<=\\n)|(?<=\\t))"
SPEC_SECTION = re.compile(WORD + r"spec(?:'s)?" + GAP + r"§", re.I)
SPEC_OTHER = re.compile(r"optimus-cc-spec(?:\.md)?|" + WORD + r"the\s+spec\b(?:'s)?", re.I)
SECTION = re.compile(r"§+\s*(\d+(?:\.\d+)*)")
ANCHOR = re.compile(r"docs/design\.md|docs/architecture\.md|optimus-cc-spec\.md|design\.md|architecture\.md"
                    r"|\barchitecture\b|" + WORD + r"spec\b(?:'s)?|\bpaper\b(?:'s)?", re.I)
# What may stand between a document's name and a further § of the same list ("§5.2, §5.5 and §6.5").
LIST_GLUE = re.compile(r"^(?:\s|//+|/\*+|\*+|#+|%+|--|[,;:&/()\-–]|\band\b|\bor\b|\bitems?\b|\bsteps?\b|\d+(?:\.\d+)*|§+)*$",
                       re.I)
BR = re.compile(r"\bBR-(\d+)\b")
ISSUE = re.compile(r"\bissues?\s*#?\d+", re.I)
URL = re.compile(r"https?://")
OUTSIDE = re.compile(r"\.\./shared|/work/shared|\bshared/docs|\bshared/peers|\bshared notes\b", re.I)
BARE_ARCH = re.compile(r"(?<![A-Za-z0-9_./-])architecture\.md|\barchitecture" + GAP + r"§", re.I)
MD_LINK_TARGET = re.compile(r"\]\(\s*$")
TOP = "compat|kernels|models|compression|harness|datasets|scripts|slurm|experiments|paper|tests|docs|cmake"
PATH = re.compile(r"(?<![A-Za-z0-9_./$-])(?:" + TOP + r")/[A-Za-z0-9_./-]+")
PATH_EXT = re.compile(r"\.(?:h|cpp|py|sh|yaml|md|txt|cmake)$")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?(?:\s|$)", re.M)
FAULT_HEADING = re.compile(r"^##\s+(BR-\d+)\b", re.M)


def listed_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError:  # no git
        return None
    if out.returncode != 0:
        return None
    return sorted({p for p in out.stdout.decode("utf-8", "replace").split("\0") if p})


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None  # listed but deleted in the work tree
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def headings(root, page):
    text = read_text(os.path.join(root, page))
    if text is None:
        return None
    return set(HEADING.findall(text))


C_LIKE = (".h", ".hpp", ".hh", ".c", ".cc", ".cpp", ".cu", ".cuh")
HASH_LIKE = (".sh", ".py", ".cmake", ".sbatch", ".bash")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_-]*$")


def c_comments(text):
    """The text with everything but // and /* */ comments blanked (offsets and line breaks kept)."""
    out = [ch if ch == "\n" else " " for ch in text]
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = text[i:j]
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = text[i:j]
            i = j
        elif c == '"':
            raw = re.match(r'R"([^()\\ ]{0,16})\(', text[i - 1:i + 20]) if i > 0 else None
            if raw:
                end = text.find(")" + raw.group(1) + '"', i)
                i = n if end < 0 else end + len(raw.group(1)) + 2
                continue
            i += 1
            while i < n and text[i] not in '"\n':
                i += 2 if text[i] == "\\" else 1
            i += 1
        elif c == "'" and not (i > 0 and text[i - 1].isalnum()):  # not a digit separator (1'000)
            i += 1
            while i < n and text[i] not in "'\n":
                i += 2 if text[i] == "\\" else 1
            i += 1
        else:
            i += 1
    return "".join(out)


def hash_comments(text, python):
    """The text with everything but # comments (and Python's triple-quoted docs) blanked."""
    out = [ch if ch == "\n" else " " for ch in text]
    spans = []
    if python:
        for m in re.finditer(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'', text):
            spans.append((m.start(), m.end()))
            out[m.start():m.end()] = text[m.start():m.end()]
    pos = 0
    for line in text.split("\n"):
        if not any(a <= pos < b for a, b in spans):
            quote = None
            for k, ch in enumerate(line):
                if quote:
                    if ch == "\\" and quote == '"':
                        continue
                    if ch == quote:
                        quote = None
                elif ch in "\"'" and not (ch == "'" and k > 0 and line[k - 1].isalnum()):
                    quote = ch
                elif ch == "#" and (k == 0 or line[k - 1] in " \t;("):
                    out[pos + k:pos + len(line)] = line[k:]
                    break
        pos += len(line) + 1
    return "".join(out)


def comments_of(rel, text):
    """What of a file is comment or documentation: all of it for Markdown, YAML, text and data."""
    name = os.path.basename(rel)
    if rel.endswith(C_LIKE):
        return c_comments(text)
    if rel.endswith(HASH_LIKE) or name in ("CMakeLists.txt", "Makefile") or text.startswith("#!"):
        return hash_comments(text, rel.endswith(".py") or text.startswith("#!/usr/bin/env python"))
    return text


class File:
    def __init__(self, rel, text):
        self.rel = rel
        self.text = text
        self.lines = text.split("\n")
        self.starts = [0]
        for line in self.lines[:-1]:
            self.starts.append(self.starts[-1] + len(line) + 1)

    def line_of(self, pos):
        return bisect.bisect_right(self.starts, pos)

    def line_text(self, pos):
        return self.lines[self.line_of(pos) - 1]


def check_file(f, root, design, architecture, faults, report):
    text = f.text
    in_docs = f.rel.startswith("docs/")

    def add(rule, pos, found, fix):
        report.append((rule, f.rel, f.line_of(pos), found.replace("\n", " "), fix))

    # a: the private specification
    cited = set()
    for m in SPEC_SECTION.finditer(text):
        cited.add(m.start())
        num = SECTION.match(text, m.end() - 1)
        n = num.group(1) if num else "N"
        add("a", m.start(), text[m.start():(num.end() if num else m.end())],
            f"cite docs/design.md §{n} (same number)")
    for m in SPEC_OTHER.finditer(text):
        if any(m.start() <= c < m.end() for c in cited):
            continue  # "the spec's §N": counted above
        add("a", m.start(), m.group(0), "cite docs/design.md §N (the section meant) instead of the private spec")

    # b, h: every §, checked against the document it belongs to
    for m in SECTION.finditer(text):
        window_start = text.rfind("\n", 0, max(0, text.rfind("\n", 0, m.start())))
        window = text[max(0, window_start):m.start()]
        anchor = None
        for a in ANCHOR.finditer(window):
            anchor = a
        if anchor and LIST_GLUE.match(window[anchor.end():]):
            name = anchor.group(0).lower()
        else:
            name = None
        num = m.group(1)
        if name is None and f.rel in ("docs/design.md", "docs/architecture.md"):
            name = f.rel  # a page's bare § is a section of its own
        if name in ("docs/design.md", "docs/architecture.md"):
            page, known = (("docs/design.md", design) if name == "docs/design.md"
                           else ("docs/architecture.md", architecture))
            if known is None:
                add("b", m.start(), f"{name} §{num}", f"{page} does not exist: write it, or cite an existing page")
            elif num not in known:
                add("b", m.start(), f"{name} §{num}", f"{page} has no heading numbered {num}: cite the right section")
        elif name is None:
            add("h", m.start(), m.group(0), "name the document: docs/design.md §N (or docs/architecture.md §N)")
        # spec / architecture / design.md anchors are counted by rules a and f; the paper's § are public

    # c: fault ids
    for m in BR.finditer(text):
        if faults is None:
            add("c", m.start(), m.group(0), "docs/faults.md does not exist: write it")
        elif m.group(0) not in faults:
            add("c", m.start(), m.group(0), f"add a `## {m.group(0)} — title` section to docs/faults.md")

    # d: private issue numbers
    for m in ISSUE.finditer(text):
        if URL.search(f.line_text(m.start())):
            continue
        add("d", m.start(), m.group(0), "drop the tracker number; say the reason itself")

    # e: outside paths and notes
    for m in OUTSIDE.finditer(text):
        add("e", m.start(), m.group(0), "say what is meant without a path outside the repository")

    # f: architecture.md without docs/
    for m in BARE_ARCH.finditer(text):
        if in_docs and MD_LINK_TARGET.search(text[max(0, m.start() - 3):m.start()]):
            continue  # a relative Markdown link inside docs/
        add("f", m.start(), m.group(0), "write docs/architecture.md")
    for m in re.finditer(r"(?<![A-Za-z0-9_./-])design\.md", text):
        if in_docs and MD_LINK_TARGET.search(text[max(0, m.start() - 3):m.start()]):
            continue
        add("f", m.start(), m.group(0), "write docs/design.md")

    # g: repository paths that do not exist, in comments and docs (code builds fixture paths)
    docs_only = comments_of(f.rel, text)
    for m in PATH.finditer(docs_only):
        token = m.group(0)
        after = docs_only[m.end():m.end() + 1]
        if after in ("*", "<", "{", "$") or "..." in token:
            continue  # a glob or a placeholder
        token = token.rstrip(".-/")
        if not PATH_EXT.search(token):
            continue
        if token in ("docs/design.md", "docs/architecture.md") and re.match(r"\s*§", docs_only[m.end():]):
            continue  # "docs/design.md §N": rule b reports it
        stem = os.path.splitext(os.path.basename(token))[0]
        if len(stem) == 1 or PLACEHOLDER.match(stem):
            continue  # experiments/NAME.yaml, harness/train/x.h
        here = os.path.dirname(f.rel)
        if os.path.exists(os.path.join(root, token)) or os.path.exists(os.path.join(root, here, token)):
            continue  # from the root, or from the file's own folder (experiments/README.md: paper/x.yaml)
        add("g", m.start(), token, "no such file: correct the path (or name the file it became)")

def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(sys.argv[1])
    files = listed_files(root)
    if files is None:
        print(f"{root}: not a git checkout (git ls-files failed); skipped")
        return 77
    design = headings(root, "docs/design.md")
    architecture = headings(root, "docs/architecture.md")
    faults_text = read_text(os.path.join(root, "docs/faults.md"))
    faults = set(FAULT_HEADING.findall(faults_text)) if faults_text is not None else None

    report = []
    for rel in files:
        if rel == SELF or rel.lower().endswith(SKIP_SUFFIXES):
            continue
        text = read_text(os.path.join(root, rel))
        if text is None:
            continue
        check_file(File(rel, text), root, design, architecture, faults, report)

    for rule, rel, line, found, fix in report:
        print(f"{rel}:{line}: [{rule}] {found!r} -> {fix}")
    counts = {r: 0 for r in RULES}
    for rule, *_ in report:
        counts[rule] += 1
    print(f"\n{len(report)} finding(s) in {len(files)} listed files:")
    for r, what in RULES.items():
        print(f"  {r}  {what:32s} {counts[r]}")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())

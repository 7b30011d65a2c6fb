#!/usr/bin/env bash
# The repository's size budgets. Measures what a GPU machine receives of this checkout: the tracked
# files (working-tree sizes), the untracked files git does not ignore, and the ignored paths the run
# carries (the kit's .debs and the prepared demo corpus). Prints each part and the total in MiB, and
# the carry list to name. Two budgets, each with room below a hard limit:
#   the tracked tree            at most OPTCC_TRACKED_LIMIT_MIB (default 40)
#   what travels to the GPU     at most OPTCC_GPU_LIMIT_MIB (default 52; the device tool takes 64 at most)
# Above either, it names the budget, the largest files and folders that count toward it, and exits 2.
# .ci/run runs it (after scripts/gpu/fetch_deps.sh, so the .debs count).
#
#   scripts/gpu/size.sh [--quiet]      --quiet: print only when a budget is exceeded
#
# Environment: OPTCC_TRACKED_LIMIT_MIB, OPTCC_GPU_LIMIT_MIB, OPTCC_GPU_DEBS (default scripts/gpu/debs).
# Sizes are file sizes in bytes (what is copied), not disk blocks. Called by fetch_deps.sh and by
# check.sh --dry-run; uses only `git ls-files` (reads, never writes the index).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
LIMIT_MIB="${OPTCC_GPU_LIMIT_MIB:-52}"
TRACKED_LIMIT_MIB="${OPTCC_TRACKED_LIMIT_MIB:-40}"
DEBS="${OPTCC_GPU_DEBS:-$REPO/scripts/gpu/debs}"
QUIET=0
case "${1:-}" in
  -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
  --quiet) QUIET=1 ;;
  "") ;;
  *) echo "gpu/size.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
cd "$REPO"
git rev-parse --git-dir > /dev/null 2>&1 || { echo "gpu/size.sh: $REPO is not a git checkout: cannot tell what travels" >&2; exit 1; }

# The ignored paths a run carries (at most 8): the .debs, and the corpus step d trains on.
CARRY=("${DEBS#$REPO/}" data/corpus.bin data/corpus.idx data/corpus.json)

sizes() {  # NUL-separated paths on stdin -> "bytes<TAB>path" of those that exist (links: their own size)
  { xargs -0 -r stat --printf '%s\t%n\n' -- 2>/dev/null || true; }
}
bytes_of_list() { sizes | awk -F'\t' '{s += $1} END {printf "%d", s}'; }
mib() { awk -v b="$1" 'BEGIN{printf "%.1f", b/1048576}'; }

tracked=$(git ls-files -z | bytes_of_list)
ref=$(git ls-files -z results/reference | bytes_of_list)
untracked=$(git ls-files -z -o --exclude-standard | bytes_of_list)
n_untracked=$(git ls-files -z -o --exclude-standard | tr -cd '\0' | wc -c)
carried=0
carry_lines=()
missing=()
for c in "${CARRY[@]}"; do
  if [ -e "$c" ]; then
    b=$(find "$c" -type f -print0 | bytes_of_list)
    carried=$((carried + b))
    carry_lines+=("$(printf '  carried   %-28s %7s MiB' "$c" "$(mib "$b")")")
  else
    missing+=("$c")
  fi
done
total=$((tracked + untracked + carried))
limit=$((LIMIT_MIB * 1048576))

if [ "$QUIET" = 0 ]; then
  echo "gpu/size.sh: what travels to the GPU machine"
  printf '  tracked   %-28s %7s MiB (results/reference: %s MiB)\n' "git ls-files" "$(mib "$tracked")" "$(mib "$ref")"
  printf '  untracked %-28s %7s MiB\n' "not ignored ($n_untracked files)" "$(mib "$untracked")"
  for l in "${carry_lines[@]}"; do echo "$l"; done
  printf '  total     %-28s %7s MiB of %s MiB\n' "" "$(mib "$total")" "$LIMIT_MIB"
  echo "  carry (ignored paths to name): ${CARRY[*]}"
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu/size.sh: WARNING: not here, so not carried: ${missing[*]} (debs: scripts/gpu/fetch_deps.sh; corpus: make data)" >&2
fi
tracked_limit=$((TRACKED_LIMIT_MIB * 1048576))
if [ "$QUIET" = 0 ]; then
  printf '  budgets   tracked %s of %s MiB, travelling %s of %s MiB\n' "$(mib "$tracked")" "$TRACKED_LIMIT_MIB" "$(mib "$total")" "$LIMIT_MIB"
fi

# "bytes<TAB>path" of the largest files and of the largest folders (two levels) among stdin's lines.
largest() (  # a subshell: its pipefail change stays inside
  lines=$(cat)
  set +o pipefail  # head ends the sorts early
  echo "    largest files:" >&2
  printf '%s\n' "$lines" | sort -rn | head -8 | awk -F'\t' '{printf "      %8.2f MiB  %s\n", $1/1048576, $2}' >&2
  echo "    largest folders:" >&2
  printf '%s\n' "$lines" |
    awk -F'\t' '{n = split($2, a, "/"); k = n > 2 ? a[1] "/" a[2] : a[1]; s[k] += $1} END {for (k in s) print s[k] "\t" k}' |
    sort -rn | head -6 | awk -F'\t' '{printf "      %8.2f MiB  %s\n", $1/1048576, $2}' >&2
)
over=0
if [ "$tracked" -gt "$tracked_limit" ]; then
  echo "gpu/size.sh: the tracked tree is $(mib "$tracked") MiB, above its budget of $TRACKED_LIMIT_MIB MiB (OPTCC_TRACKED_LIMIT_MIB)." >&2
  git ls-files -z | sizes | largest
  echo "gpu/size.sh: fix: shrink or drop the largest tracked files (reference results: scripts/compact_results.py --trim;" \
       "docs/builds.md, \"Size budgets\"), or raise the budget in scripts/gpu/size.sh with the reason" >&2
  over=1
fi
if [ "$total" -gt "$limit" ]; then
  echo "gpu/size.sh: $(mib "$total") MiB would travel to the GPU machine, above its budget of $LIMIT_MIB MiB (OPTCC_GPU_LIMIT_MIB; the device tool's hard limit is 64 MiB)." >&2
  {
    { git ls-files -z; git ls-files -z -o --exclude-standard; } | sizes
    for c in "${CARRY[@]}"; do if [ -e "$c" ]; then find "$c" -type f -print0 | sizes; fi; done
  } | largest
  echo "gpu/size.sh: fix: drop the corpus from the carry list (then run check.sh with --steps unit,bench,fig14: its ranks step needs it)," \
       "trim SHIP in scripts/gpu/fetch_deps.sh, shrink the tracked tree, or remove large untracked files" >&2
  over=1
fi
[ "$over" = 0 ] || exit 2

#!/usr/bin/env bash
# Measures what a GPU machine receives of this checkout: the tracked files (working-tree sizes),
# the untracked files git does not ignore, and the ignored paths the run carries (the kit's .debs
# and the prepared demo corpus). Prints each part and the total in MiB, and the carry list to name.
#
#   scripts/gpu/size.sh [--quiet]      exit 2 when the total exceeds the limit (64 MiB)
#
# Environment: OPTCC_GPU_LIMIT_MIB (default 64), OPTCC_GPU_DEBS (default scripts/gpu/debs).
# Sizes are file sizes in bytes (what is copied), not disk blocks. Called by fetch_deps.sh and by
# check.sh --dry-run; uses only `git ls-files` (reads, never writes the index).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
LIMIT_MIB="${OPTCC_GPU_LIMIT_MIB:-64}"
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
if [ "$total" -gt "$limit" ]; then
  echo "gpu/size.sh: $(mib "$total") MiB would travel, above the limit of $LIMIT_MIB MiB. Largest parts:" >&2
  {
    { git ls-files -z; git ls-files -z -o --exclude-standard; } | sizes |
      awk -F'\t' '{n = split($2, a, "/"); k = n > 2 ? a[1] "/" a[2] : a[1]; s[k] += $1} END {for (k in s) print s[k] "\t" k}'
    for c in "${CARRY[@]}"; do [ -e "$c" ] && printf '%s\t%s (carried)\n' "$(find "$c" -type f -print0 | bytes_of_list)" "$c"; done
  } | sort -rn | head -6 | awk -F'\t' '{printf "    %8.1f MiB  %s\n", $1/1048576, $2}' >&2
  echo "gpu/size.sh: fix: drop the corpus from the carry list (then run check.sh with --steps unit,bench,fig14: its ranks step needs it)," \
       "trim SHIP in scripts/gpu/fetch_deps.sh, or remove large untracked files" >&2
  exit 2
fi

#!/usr/bin/env bash
# cmake/git_rev.cmake in a scratch git repository: a clean checkout records the bare revision;
# a change to a compiled folder, or an untracked file in one, adds -dirty-<hash> (the same change,
# the same hash; another change, another hash); a change outside them (README) does not.
#   git_rev_test.sh SOURCE_DIR
set -euo pipefail
script="$1/cmake/git_rev.cmake"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cd "$d"
git init -q . && git config user.email t@example.invalid && git config user.name t
mkdir -p harness && echo "int a;" > harness/a.cpp && echo "readme" > README.md
git add -A && git commit -qm init
head=$(git rev-parse --short=12 HEAD)
rev() { cmake -DSRC="$d" -DOUT="$d/rev.h" -P "$script" && sed -n 's/#define OPTCC_GIT_REV "\(.*\)"/\1/p' rev.h; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(rev)" = "$head" ] || fail "clean: $(rev), expected $head"
echo "more" >> README.md
[ "$(rev)" = "$head" ] || fail "README edit made it $(rev)"
echo "int b;" >> harness/a.cpp
one=$(rev)
[[ "$one" =~ ^$head-dirty-[0-9a-f]{8}$ ]] || fail "source edit: $one"
[ "$(rev)" = "$one" ] || fail "same change, other hash: $(rev) vs $one"
echo "int c;" >> harness/a.cpp
two=$(rev)
[[ "$two" =~ ^$head-dirty-[0-9a-f]{8}$ && "$two" != "$one" ]] || fail "another change: $two vs $one"
git checkout -q harness/a.cpp
echo "int d;" > harness/new.cpp
three=$(rev)
[[ "$three" =~ ^$head-dirty-[0-9a-f]{8}$ ]] || fail "untracked source file: $three"
rm harness/new.cpp
[ "$(rev)" = "$head" ] || fail "back to clean: $(rev)"
echo "git_rev: ok ($head, $one, $two, $three)"

#!/usr/bin/env bash
# What a new user (and CI) pays from a fresh clone: each make target the README and .ci/run
# name, in the order a user meets them, timed; the disk .venv and the clone take.
#
#   benchmarks/fresh_clone.sh [REPO]      # REPO: what to clone (default: this repository)
#
# The clone goes to a temporary folder, removed at the end. The figures are in
# docs/results.md, section 5, with the output this prints.
set -u
repo=${1:-$(cd "$(dirname "$0")/.." && pwd)}
root=$(mktemp -d "${TMPDIR:-/tmp}/fresh-clone.XXXXXX")
trap 'rm -rf "$root"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB, load average $(cut -d' ' -f1 /proc/loadavg)"
git clone -q "$repo" "$root/clone" && cd "$root/clone" || exit 1
echo "clone: $(git log --oneline -1)"
failed=0
for target in demo test lint e2e-short e2e-vl upstream-test; do
  started=$(date +%s)
  make "$target" >"$root/$target.log" 2>&1
  status=$?
  # the line that says how it went: pytest's summary, the verdict, the accept lengths, ...
  said=$(grep -E '^[0-9]+ (passed|failed)|^verdict|accept_length|^\[e2e\]|^Success|^e2e-vl' "$root/$target.log" | tail -n 1)
  echo "make $target: exit $status in $(( $(date +%s) - started )) s; ${said:-last line: $(tail -n 1 "$root/$target.log")}"
  [ "$target" = demo ] && grep '^set-up:' "$root/$target.log"
  [ "$status" = 0 ] || { failed=1; tail -n 30 "$root/$target.log"; }
done
echo "disk: .venv $(du -sh .venv | cut -f1), .cache $(du -sh .cache | cut -f1), whole clone $(du -sh . | cut -f1)"
exit $failed

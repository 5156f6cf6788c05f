#!/usr/bin/env bash
# Install size and time of the runtime dependencies with `ray[default]` vs plain `ray`, each in
# a fresh venv (BENCHMARKS.md, section g). Uses the pip cache; prints one line per variant.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
deps=$("$PYTHON" -c "import tomllib; print(' '.join(d for d in tomllib.load(open('pyproject.toml','rb'))['project']['dependencies'] if not d.startswith('ray')))")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for ray in "ray[default]>=2.40" "ray>=2.40"; do
    venv="$work/venv"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$ray" $deps
    end=$(date +%s.%N)
    packages=$("$venv/bin/pip" list --format=freeze 2>/dev/null | wc -l)
    size=$(du -sm "$venv" | cut -f1)
    printf '%-22s packages=%-4s size_mb=%-5s install_s=%.1f\n' "$ray" "$packages" "$size" "$(echo "$end - $start" | bc)"
done

#!/usr/bin/env bash
# Reproduces everything: runs every numbered notebook in notebooks/ in order with papermill.
#   bash run_all.sh                  # profile chosen automatically: paper (CUDA GPU + Hub) or local
#   bash run_all.sh --profile smoke  # paper | local | smoke
#   bash run_all.sh --force          # re-run notebooks that already finished
#   bash run_all.sh --only 01        # only notebooks whose name starts with 01
# Executed notebooks and logs go to results/<profile>/executed and results/<profile>/logs.
# A finished notebook is skipped on the next call (its stamp matches the notebook's content),
# and inside a notebook finished runs are skipped too, so an interrupted call resumes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
profile="" force=0 only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --force) force=1; shift ;;
    --only) only="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "run_all.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

bash "$root/scripts/bootstrap_env.sh"
py="${PLUGIN_VENV:-$root/.venv}/bin/python"
cd "$root"
if [ -z "$profile" ]; then
  profile="$("$py" -c 'from plugin_lib.harness.profile import auto_profile; print(auto_profile())')"
  echo "[run_all] profile: $profile (chosen automatically; --profile overrides)"
fi
"$py" -c "from plugin_lib.harness.profile import load_profile; load_profile('$profile')"  # clear error if unknown
out="$root/results/$profile"
mkdir -p "$out/executed" "$out/logs"

mapfile -t notebooks < <(ls notebooks/[0-9][0-9]_*.ipynb | sort)
[ -n "$only" ] && mapfile -t notebooks < <(printf '%s\n' "${notebooks[@]}" | grep "/$only")
total=${#notebooks[@]} i=0 started=$SECONDS
for nb in "${notebooks[@]}"; do
  i=$((i + 1))
  name="$(basename "$nb" .ipynb)"
  stamp="$out/executed/$name.done"
  want="$(sha256sum "$nb" | cut -d' ' -f1)"
  if [ "$force" = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "[run_all] ($i/$total) $name: already finished, skipped (--force re-runs it)"
    continue
  fi
  echo "[run_all] ($i/$total) $name: running (log: results/$profile/logs/$name.log)"
  t0=$SECONDS
  if ! "$py" -m papermill "$nb" "$out/executed/$name.ipynb" -p profile "$profile" \
        --cwd "$root/notebooks" --log-output --no-progress-bar > "$out/logs/$name.log" 2>&1; then
    echo "[run_all] FAILED: $name. The failing cell and its error:" >&2
    grep -E -A 12 "PapermillExecutionError|Exception encountered at" "$out/logs/$name.log" | head -40 >&2 || tail -30 "$out/logs/$name.log" >&2
    echo "[run_all] Full log: results/$profile/logs/$name.log; partial notebook: results/$profile/executed/$name.ipynb" >&2
    exit 1
  fi
  "$py" "$root/scripts/strip_notebook.py" "$out/executed/$name.ipynb"
  echo $((SECONDS - t0)) >> "$out/executed/$name.seconds"  # one line per execution
  echo "$want" > "$stamp"
  echo "[run_all] ($i/$total) $name: done in $((SECONDS - t0)) s"
done
echo "[run_all] all $total notebooks finished for profile '$profile' in $((SECONDS - started)) s"
if [ "$profile" = local ]; then readme=--readme; else readme=; fi  # the README shows the local profile
"$py" -m plugin_lib.report --profile "$profile" $readme

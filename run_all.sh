#!/usr/bin/env bash
# Reproduces everything: runs every numbered notebook in notebooks/ in order with papermill.
#   bash run_all.sh                  # profile chosen automatically: paper (CUDA GPU + Hub) or local
#   bash run_all.sh --profile smoke  # one of the profiles below
#   bash run_all.sh --force          # re-run notebooks that already finished
#   bash run_all.sh --only 01        # only notebooks whose name starts with 01
#   bash run_all.sh --no-fetch       # do not download missing data; stop instead
#   bash run_all.sh --executor ray   # first compute the notebooks' units (local, ray or slurm:
#                                    # python -m plugin_lib.harness.grid run; its options, e.g.
#                                    # --address auto or --partition gpu, in PLUGIN_GRID_ARGS),
#                                    # then run the notebooks, which find the records and aggregate
# Profiles (plugin_lib/harness/profiles.yaml; disk and time as measured, docs/profiles.md):
#   local       the committed CPU-scale results (SmolLM2-135M); current ones are skipped in seconds
#   smoke       every code path in minutes on a CPU (about 5 GiB of disk)
#   paper-twin  the paper profile's code path on small random twins of its bases (CPU, ~15 GiB)
#   confirm     the preregistered confirmation on fresh test inputs (docs/preregistration.md)
#   paper       the paper's scale: a CUDA GPU (80 GB), the Hugging Face Hub and about 40 GiB of
#               disk (the preflight prints the plan and stops on a machine that cannot run it)
#   colab       the paper's GPT-2 bases scaled to one Colab T4 session per notebook (docs/colab.md)
# Executed notebooks, stamps and logs go to results/<profile>/executed and .../logs
# (PLUGIN_RESULTS_DIR/<profile>/... when PLUGIN_RESULTS_DIR is set).
# - The data come first: missing files are downloaded into the data folder (data/, or
#   PLUGIN_DATA_DIR; python -m plugin_lib.data.fetch, with a progress bar), then everything is
#   checked (python -m plugin_lib.data.check). Data that cannot be fetched (offline; Adidas needs a
#   Kaggle account) stop the call, saying what to do, before anything runs or is written.
# - A notebook is skipped when its stamp matches: the notebook, its parameters, the profile's
#   settings and the code version (scripts/run_stamp.py). Inside a notebook finished runs are
#   skipped too, so an interrupted call resumes.
# - Before any stamp, every stored run record is checked against the hash the store wrote for it
#   in results/<profile>/RECORDS.sha256 (plugin_lib/utils/record_manifest.py): a damaged, edited
#   or unlisted record stops the call, named, with its mend (git checkout, or delete to recompute).
# - papermill writes to a temporary file, moved into place only on success: a failed notebook
#   leaves the last executed notebook and its stamp as they were (a stale stamp still does not
#   match, so the notebook runs again next time) and leaves <name>.failed.ipynb beside it;
#   the report is written only when every notebook finished, and the README's results block
#   only by a complete `--profile local` run.
# - A paper run prints its preflight plan first (work, memory, disk, hours) and stops when the
#   GPU memory or the disk will not do, or when the machine has no CUDA GPU. Every other profile
#   checks the disk the notebooks still to run may write before the first one starts.
# - One call per profile at a time: a second call refuses at once.
# - Notebooks import this checkout's plugin_lib (PYTHONPATH), even with a PLUGIN_VENV shared
#   with another checkout. PLUGIN_SKIP_BOOTSTRAP=1 uses that environment as it is.
# Exit status: 0 done, 1 a notebook or the data check failed, 2 bad arguments,
# 3 another run_all.sh holds the profile, 4 a stored run record is damaged (unreadable, e.g.
# truncated), 5 a stored run record was edited (its content differs from its hash in the
# manifest), 6 a run record the store did not write (not in the manifest), 129/130/143 interrupted.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "run_all.sh: $1" >&2; exit "${2:-1}"; }
value_of() {  # value_of OPTION [VALUE]: the option's value, or a clear error when it has none
  if [ $# -lt 2 ] || [ -z "$2" ] || [[ "$2" == -* ]]; then
    die "$1 needs a value, e.g. '$1 $(case "$1" in --profile) echo smoke ;; --executor) echo ray ;; *) echo 01 ;; esac)' (see --help)" 2
  fi
}
profile="" force=0 only="" fetch=1 executor=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) value_of "$@"; profile="$2"; shift 2 ;;
    --profile=*) value_of --profile "${1#*=}"; profile="${1#*=}"; shift ;;
    --only) value_of "$@"; only="$2"; shift 2 ;;
    --only=*) value_of --only "${1#*=}"; only="${1#*=}"; shift ;;
    --executor) value_of "$@"; executor="$2"; shift 2 ;;
    --executor=*) value_of --executor "${1#*=}"; executor="${1#*=}"; shift ;;
    --force) force=1; shift ;;
    --no-fetch) fetch=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" 2 ;;
  esac
done

# Where results go: PLUGIN_RESULTS_DIR (relative to the caller's directory) or results/.
results_root="${PLUGIN_RESULTS_DIR:-$root/results}"
drive=/content/drive/MyDrive  # Colab with Google Drive mounted: the GPU profiles' results survive a disconnect
if [ -z "${PLUGIN_RESULTS_DIR:-}" ] && [ -d "$drive" ] && { [ "$profile" = paper ] || [ "$profile" = colab ]; }; then
  results_root="$drive/plugin-repro/results"
  export PLUGIN_CACHE_DIR="${PLUGIN_CACHE_DIR:-$drive/plugin-repro/cache}"
fi
case "$results_root" in /*) ;; *) results_root="$PWD/$results_root" ;; esac
export PLUGIN_RESULTS_DIR="$results_root"
# Notebooks import this checkout's plugin_lib, whatever package the environment has installed.
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

if [ "${PLUGIN_SKIP_BOOTSTRAP:-0}" = 1 ]; then
  [ -x "${PLUGIN_VENV:-$root/.venv}/bin/python" ] \
    || die "PLUGIN_SKIP_BOOTSTRAP=1 but ${PLUGIN_VENV:-$root/.venv}/bin/python does not exist"
else
  bash "$root/scripts/bootstrap_env.sh"
fi
py="${PLUGIN_VENV:-$root/.venv}/bin/python"
cd "$root"
# glibc's allocator set for tensors, in every process started from here (plugin_lib/utils/malloc.py)
GLIBC_TUNABLES="$("$py" -m plugin_lib.utils.malloc)"; export GLIBC_TUNABLES

# Arguments first: nothing is written before they are known to be good.
if [ -z "$profile" ]; then
  profile="$("$py" -c 'from plugin_lib.harness.profile import auto_profile; print(auto_profile())')"
  echo "[run_all] profile: $profile (chosen automatically; --profile overrides)"
fi
"$py" - "$profile" <<'EOF' || exit 2
import sys
from plugin_lib.harness.profile import profile_names
if sys.argv[1] not in profile_names():
    sys.exit(f"run_all.sh: unknown profile {sys.argv[1]!r}; choose one of: {', '.join(profile_names())}")
EOF
case "$executor" in ""|local|ray|slurm) ;; *) die "unknown executor '$executor'; choose local, ray or slurm (see --help)" 2 ;; esac
all=()
for nb in notebooks/[0-9][0-9]_*.ipynb; do [ -f "$nb" ] && all+=("$nb"); done
[ ${#all[@]} -gt 0 ] || die "no numbered notebook in $root/notebooks"
notebooks=()
for nb in "${all[@]}"; do
  if [ -z "$only" ] || [[ "$(basename "$nb")" == "$only"* ]]; then notebooks+=("$nb"); fi
done
if [ ${#notebooks[@]} = 0 ]; then
  {
    echo "run_all.sh: no notebook name starts with '$only'. The notebooks are:"
    for nb in "${all[@]}"; do echo "  $(basename "$nb" .ipynb)"; done
  } >&2
  exit 2
fi

out="$results_root/$profile"
shown="${out#"$root"/}"  # for messages: results/<profile> when inside this checkout
lock="$out/.run_all.lock"
refuse() {
  die "another run_all.sh is already running for profile '$profile' (it holds $1). Wait for it to finish or stop it, then call again." 3
}
# A quick look at the lock before the data check, which may take a few seconds (creates nothing).
if [ -e "$lock" ] && command -v flock >/dev/null 2>&1 && ! flock -n "$lock" true; then
  refuse "$shown/.run_all.lock"
fi

# The data, checked at the door: missing, truncated or malformed data stop the call here.
"$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("plugin_lib.data.check") is None)' \
  || die "this checkout has no plugin_lib/data/check.py, so the data cannot be checked before the notebooks run. Update the checkout."
echo "[run_all] checking the data of profile '$profile'"
if ! "$py" -m plugin_lib.data.check --profile "$profile"; then
  if [ "$fetch" = 1 ] && [ "${PLUGIN_DATA_DIR:-}" != hub ]; then
    echo "[run_all] fetching the missing data (python -m plugin_lib.data.fetch; --no-fetch skips this)"
    "$py" -m plugin_lib.data.fetch || true  # says what it could not get; the check below decides
    "$py" -m plugin_lib.data.check --profile "$profile" \
      || die "the data of profile '$profile' are still not ready (see above); nothing was run."
  else
    die "the data of profile '$profile' are not ready (see above); nothing was run or written."
  fi
fi

# The paper and colab profiles' plan before GPU-days are spent: work, cache and disk, peak GPU memory and
# the estimated total (python -m plugin_lib.commands.preflight). It stops the call when memory or
# disk will not do; PLUGIN_SKIP_PREFLIGHT=1 skips it (e.g. a resumed run that already saw it).
if { [ "$profile" = paper ] || [ "$profile" = colab ]; } && [ "${PLUGIN_SKIP_PREFLIGHT:-0}" != 1 ]; then
  echo "[run_all] preflight of profile '$profile' (PLUGIN_SKIP_PREFLIGHT=1 skips it)"
  if ! "$py" -m plugin_lib.commands.preflight --profile "$profile" ${only:+--only "$only"}; then
    die "the preflight says profile '$profile' will not fit on this machine (see WILL NOT FIT above); nothing was run or written."
  fi
fi

# One run_all.sh per profile: flock on results/<profile>/.run_all.lock, released on exit (a
# PID-checked lock directory where flock is missing).
lockdir=""
made="$(mkdir -p "$out" 2>&1)" && [ -w "$out" ] \
  || die "cannot write the results folder $shown (${made##*: }): set PLUGIN_RESULTS_DIR to a writable folder; nothing was run."
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$lock"
  flock -n 9 || refuse "$shown/.run_all.lock"
else
  if ! mkdir "$out/.run_all.lock.d" 2>/dev/null; then
    holder="$(cat "$out/.run_all.lock.d/pid" 2>/dev/null || true)"
    if [ -z "$holder" ] || kill -0 "$holder" 2>/dev/null; then
      refuse "$shown/.run_all.lock.d, process ${holder:-unknown}; remove that folder if no run_all.sh is running"
    fi
    rm -rf "$out/.run_all.lock.d"
    mkdir "$out/.run_all.lock.d" 2>/dev/null || refuse "$shown/.run_all.lock.d"
  fi
  lockdir="$out/.run_all.lock.d"
  echo $$ > "$lockdir/pid"
fi

# Cleanup on any exit: the papermill child, the temporary notebook, the lock directory.
pm="" tmp=""
cleanup() {
  if [ -n "$pm" ]; then kill -TERM "$pm" 2>/dev/null || true; wait "$pm" 2>/dev/null || true; fi
  if [ -n "$tmp" ]; then rm -f "$tmp"; fi
  if [ -n "$lockdir" ]; then rm -rf "$lockdir"; fi
}
interrupted() {
  echo "[run_all] interrupted by SIG$1: the notebook that was running is not stored; the last finished one is kept." >&2
  cleanup; trap - EXIT; exit "$2"
}
trap cleanup EXIT
trap 'interrupted INT 130' INT
trap 'interrupted TERM 143' TERM
trap 'interrupted HUP 129' HUP

executed="$out/executed"
mkdir -p "$executed" "$out/logs"
rm -f "$executed"/.*.running.*.ipynb  # left by a run that was killed outright (we hold the lock)
# What killed writers left (atomic writes' .tmp, caches' .partial; plugin_lib/utils/io.reap_tree)
"$py" - "$out" <<'EOF' || exit 1
import sys
from plugin_lib.harness.profile import CacheDirError, cache_dir
from plugin_lib.utils.io import reap_tree
try:
    roots = [sys.argv[1], cache_dir()]
except CacheDirError as err:
    sys.exit(f"run_all.sh: {err}")
removed = [path for root in roots for path in reap_tree(root)]
if removed:
    print(f"[run_all] removed {len(removed)} temporary file(s) that killed writers left, e.g. {removed[0]}")
EOF
mode="$(printf '%o' $((0666 & ~0$(umask))))"  # the user's normal file permissions
# The stored run records are checked first; run_stamp.py's status is this call's (4, 5, 6 above).
stamps="$("$py" "$root/scripts/run_stamp.py" --profile "$profile" "${notebooks[@]}")" || exit $?
declare -A want=()
while read -r hash nb; do want["$nb"]="$hash"; done <<< "$stamps"

# Disk first: what the notebooks still to run may write (the preflight's upper bounds, less what
# the profile already stores) against the free disk, before anything is computed. The paper and
# colab preflight above checked it already; PLUGIN_SKIP_PREFLIGHT=1 skips both.
to_run=()
for nb in "${notebooks[@]}"; do
  name="$(basename "$nb" .ipynb)"
  if [ "$force" = 1 ] || [ ! -f "$executed/$name.done" ] || [ ! -f "$executed/$name.ipynb" ] \
      || [ "$(cat "$executed/$name.done")" != "${want[$nb]}" ]; then
    to_run+=("$name")
  fi
done
if [ ${#to_run[@]} -gt 0 ] && [ "$profile" != paper ] && [ "$profile" != colab ] \
    && [ "${PLUGIN_SKIP_PREFLIGHT:-0}" != 1 ]; then
  "$py" -m plugin_lib.commands.preflight --profile "$profile" --disk-only "${to_run[@]}" \
    || die "the preflight's disk check stopped the run (its reason is above); nothing was run. PLUGIN_SKIP_PREFLIGHT=1 runs anyway."
fi

# The units first, on the chosen executor (python -m plugin_lib.harness.grid; docs/scale.md): the
# notebooks below then find their records current and only aggregate.
if [ -n "$executor" ]; then
  echo "[run_all] computing the notebooks' units with the $executor executor (log: $shown/logs/grid.log)"
  # shellcheck disable=SC2086  # PLUGIN_GRID_ARGS holds several options
  grid_rc=0
  # shellcheck disable=SC2086
  "$py" -m plugin_lib grid run --profile "$profile" --executor "$executor" ${only:+--only "$only"} \
      ${PLUGIN_GRID_ARGS:-} > >(tee "$out/logs/grid.log") 2>&1 || grid_rc=$?
  wait  # tee has written the whole log
  if [ "$grid_rc" = 2 ]; then  # the engine is missing (or the arguments are wrong): nothing ran
    die "the $executor executor could not start (see above); nothing was computed." 2
  elif [ "$grid_rc" != 0 ]; then
    die "the grid did not finish (see $shown/logs/grid.log); finished units are stored, so a rerun resumes."
  fi
  touch "$out/logs/grid.done"  # the notebooks should write no run record after this
fi

total=${#notebooks[@]} i=0 started=$SECONDS
for nb in "${notebooks[@]}"; do
  i=$((i + 1))
  name="$(basename "$nb" .ipynb)"
  stamp="$executed/$name.done" final="$executed/$name.ipynb" failed="$executed/$name.failed.ipynb"
  log="$out/logs/$name.log"
  if [ "$force" = 0 ] && [ -f "$stamp" ] && [ -f "$final" ] && [ "$(cat "$stamp")" = "${want[$nb]}" ]; then
    echo "[run_all] ($i/$total) $name: already finished, skipped (--force re-runs it)"
    continue
  fi
  echo "[run_all] ($i/$total) $name: running (log: $shown/logs/$name.log)"
  t0=$SECONDS
  tmp="$executed/.$name.running.$$.ipynb"
  "$py" -m papermill "$nb" "$tmp" -p profile "$profile" \
      --cwd "$root/notebooks" --log-output --no-progress-bar > "$log" 2>&1 &
  pm=$!
  if wait "$pm"; then rc=0; else rc=$?; fi
  pm=""
  if [ "$rc" = 0 ] && "$py" "$root/scripts/strip_notebook.py" "$tmp" >> "$log" 2>&1; then
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$final"
    tmp=""
    rm -f "$failed"
    echo $((SECONDS - t0)) >> "$executed/$name.seconds"  # one line per execution
    echo "${want[$nb]}" > "$stamp.$$.tmp"
    chmod "$mode" "$stamp.$$.tmp"
    mv -f "$stamp.$$.tmp" "$stamp"
    echo "[run_all] ($i/$total) $name: done in $((SECONDS - t0)) s"
    continue
  fi
  # Failure: the last executed notebook and its stamp stay; this attempt is kept as <name>.failed.ipynb.
  if [ -s "$tmp" ]; then
    "$py" "$root/scripts/strip_notebook.py" "$tmp" >/dev/null 2>&1 || true
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$failed"
  else
    rm -f "$tmp" "$failed"
  fi
  tmp=""
  echo "[run_all] FAILED: $name. Its error:" >&2
  "$py" "$root/scripts/notebook_error.py" "$log" | sed 's/^/    /' >&2 || tail -n 20 "$log" >&2
  echo "[run_all] Full log: $shown/logs/$name.log" >&2
  [ -f "$failed" ] && echo "[run_all] The failed notebook: $shown/executed/$name.failed.ipynb" >&2
  if [ -f "$final" ]; then
    echo "[run_all] $shown/executed/$name.ipynb (the last finished execution) is unchanged; nothing else was written." >&2
  fi
  exit 1
done
echo "[run_all] all $total notebooks finished for profile '$profile' in $((SECONDS - started)) s"
if [ -n "$executor" ]; then  # the grid computed the units: the notebooks should only have read them
  late="$(find "$out/runs" -newer "$out/logs/grid.done" \( -name '*-seed*.json' -o -name '*-selection.json' \) 2>/dev/null | wc -l)"
  echo "[run_all] run records the notebooks wrote after the grid: $late (0: they only aggregated)"
fi
# The report once every selected notebook finished; the README shows a complete local run only.
readme=""
if [ "$profile" = local ] && [ -z "$only" ] && [ "$results_root" = "$root/results" ]; then
  readme=--readme
elif [ "$profile" = local ]; then
  echo "[run_all] README.md not refreshed: it shows a complete 'local' run of every notebook into results/."
fi
# A preregistered profile (confirm): its claims are judged by the frozen rules, from the stored runs.
if [ -z "$only" ] && "$py" -c "import sys; from plugin_lib.harness.profile import load_profile
sys.exit(load_profile(sys.argv[1]).test_inputs is None)" "$profile"; then
  "$py" -m plugin_lib.commands.confirmation judge
fi
"$py" -m plugin_lib.report --profile "$profile" $readme

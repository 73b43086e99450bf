# Sourced by scripts/*: finds a Python >= 3.12 and keeps .venv up to date.

find_python() {
  local candidate
  for candidate in python3.13 python3.12 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 \
       && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  # pyenv's shims answer only for the selected version, so look at the
  # installed interpreters directly, newest first.
  local root
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for candidate in $(ls -d "$root"/versions/3.* 2>/dev/null | sort -t. -k2,2nr -k3,3nr); do
    if [ -x "$candidate/bin/python3" ] \
       && "$candidate/bin/python3" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$candidate/bin/python3"; return 0
    fi
  done
  echo "no Python >= 3.12 found on PATH or under pyenv's versions/" >&2
  return 1
}

# ensure_venv EXTRA: create .venv if missing; (re)install when pyproject.toml
# changed since the last install. Under a lock (.venv.lock, held for the whole
# check): scripts/serve and scripts/test started at once on a fresh clone would
# otherwise both make .venv and both run pip into it ("File exists: .venv").
# The second one waits, then finds the venv made and its stamp fresh.
VENV_LOCK_SECONDS=900  # a first install from an index can take minutes

ensure_venv() {
  local extra="$1" lock_fd status=0
  if command -v flock >/dev/null 2>&1; then
    exec {lock_fd}>>.venv.lock
    if ! flock -w "$VENV_LOCK_SECONDS" "$lock_fd"; then
      exec {lock_fd}>&-
      echo "another scripts/* has held .venv.lock for ${VENV_LOCK_SECONDS} s while setting up .venv;" \
           "if none runs, remove .venv and try again" >&2
      return 1
    fi
    _make_venv "$extra" || status=$?
    # Closed before the caller goes on: scripts/serve execs walqueued, which would
    # otherwise hold the lock (and block every other script) for as long as it runs.
    exec {lock_fd}>&-
    return "$status"
  fi
  # No flock(1) (macOS): a lock directory, made atomically by mkdir; one left
  # behind by a script that died (its pid gone) is taken over.
  local waited=0
  until mkdir .venv.lock.d 2>/dev/null; do
    if [ -f .venv.lock.d/pid ] && ! kill -0 "$(cat .venv.lock.d/pid 2>/dev/null)" 2>/dev/null; then
      rm -rf .venv.lock.d
      continue
    fi
    if [ "$waited" -ge "$VENV_LOCK_SECONDS" ]; then
      echo "another scripts/* has held .venv.lock.d for ${VENV_LOCK_SECONDS} s while setting up .venv;" \
           "if none runs, remove .venv.lock.d and .venv and try again" >&2
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  echo "$$" > .venv.lock.d/pid
  _make_venv "$extra" || status=$?
  rm -rf .venv.lock.d
  return "$status"
}

# _make_venv EXTRA: the work ensure_venv does under its lock. Called as `_make_venv || ...`,
# where `set -e` does not apply, so each step stops it by itself.
_make_venv() {
  local extra="$1" python
  if [ ! -x .venv/bin/python ]; then
    python=$(find_python) || return 1
    "$python" -m venv .venv || return 1
  fi
  local stamp=".venv/.installed-$extra"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip || return 1
    .venv/bin/python -m pip install --quiet -e ".[$extra]" || return 1
    touch "$stamp"
  fi
}

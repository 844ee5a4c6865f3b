"""utils.malloc: glibc's allocator settings, accepted by this machine's glibc."""
import glob
import os
import subprocess
import sys

import pytest

from plugin_lib.utils import malloc


def test_a_callers_own_malloc_tunables_are_kept_and_others_extended():
    assert malloc.tunables("") == malloc.TUNABLES
    assert malloc.tunables("glibc.cpu.x86_ibt=on") == f"glibc.cpu.x86_ibt=on:{malloc.TUNABLES}"
    assert malloc.tunables("glibc.malloc.arena_max=2") == "glibc.malloc.arena_max=2"


def test_glibc_takes_the_values_it_is_given():
    """The dynamic loader lists the tunables a process starts with: an out-of-range value would
    be dropped there silently."""
    loaders = sorted(glob.glob("/lib64/ld-linux-*.so.*") + glob.glob("/lib/*/ld-linux-*.so.*"))
    if not loaders:
        pytest.skip("no glibc dynamic loader here (GLIBC_TUNABLES is ignored outside glibc)")
    listed = subprocess.run([loaders[0], "--list-tunables"], env={**os.environ, "GLIBC_TUNABLES": malloc.TUNABLES},
                            capture_output=True, text=True, check=True).stdout
    values = dict(line.split(":")[0:2] for line in listed.splitlines() if line.startswith("glibc.malloc."))
    for setting in malloc.TUNABLES.split(":"):
        name, value = setting.split("=")
        assert int(values[name].split()[0], 16) == int(value), name


def test_a_process_started_without_them_restarts_itself_with_them():
    """What the grid's command does first: the same command line, now with the tunables."""
    show = "import os; print(b'GLIBC_TUNABLES=glibc.malloc.' in open('/proc/self/environ', 'rb').read())"
    restart = f"from plugin_lib.utils import malloc; malloc.restart_with_tunables([{sys.executable!r}, '-c', {show!r}])"
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if sys.platform != "linux":
        pytest.skip("restarts only on Linux")
    assert subprocess.run([sys.executable, "-c", restart], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "True"
    already = {**env, "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}  # set by the caller: runs on, no restart
    assert subprocess.run([sys.executable, "-c", restart + "; print('no restart')"], env=already,
                          capture_output=True, text=True, check=True).stdout.strip() == "no restart"


def test_release_hands_a_freed_heap_back_to_the_kernel():
    """With the tunables a freed 512 MiB block stays in the heap (that is the point: reuse);
    ``release`` returns it, as the grid does between units."""
    if sys.platform != "linux":
        pytest.skip("glibc's malloc_trim")
    probe = (
        "import os\n"
        "from plugin_lib.utils import malloc\n"
        "def rss(): return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') >> 20\n"
        "block = bytearray(512 << 20)\n"  # zero-filled: every page touched
        "del block\n"
        "kept = rss()\n"
        "released = malloc.release()\n"
        "print(kept - rss(), released)\n"
    )
    env = {**os.environ, "GLIBC_TUNABLES": malloc.TUNABLES}
    freed, released = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                     check=True).stdout.split()
    assert released == "True" and int(freed) > 400  # MiB

"""utils.malloc: glibc's allocator settings, accepted by this machine's glibc."""
import glob
import os
import subprocess

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

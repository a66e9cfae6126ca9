"""sparkgnn.heap: a process keeps freed memory for reuse (glibc), idempotently, and Arrow allocates
from the same heap."""

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_retain_freed_memory_keeps_a_freed_block_mapped_and_switches_arrow_to_the_system_pool():
    # In a fresh interpreter (the setting is process-wide): a 512 MiB block freed after the call is
    # not returned to the OS (RSS stays up), and Arrow's default pool is the system allocator.
    script = textwrap.dedent(
        """
        import numpy as np, psutil, pyarrow as pa
        from sparkgnn.heap import retain_freed_memory
        assert retain_freed_memory() and retain_freed_memory()  # idempotent
        rss = lambda: psutil.Process().memory_info().rss
        before = rss()
        block = np.ones(1 << 27, dtype=np.float32)  # 512 MiB, touched
        del block
        kept = rss() - before
        print(pa.default_memory_pool().backend_name, kept >= (1 << 28))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["system", "True"]


def test_without_the_call_a_freed_block_goes_back_to_the_os():
    # The control: the default allocator returns the block, which is why the call exists.
    script = textwrap.dedent(
        """
        import numpy as np, psutil
        rss = lambda: psutil.Process().memory_info().rss
        before = rss()
        block = np.ones(1 << 27, dtype=np.float32)
        del block
        print(rss() - before < (1 << 27))
        """
    )
    assert (
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
        == "True"
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim, /proc")
def test_release_retained_memory_trims_only_above_its_bound():
    # In a fresh interpreter that keeps freed memory: a freed 512 MiB block stays resident under a
    # bound above it and goes back to the OS once the bound is below what the process holds.
    script = textwrap.dedent(
        """
        import numpy as np
        from sparkgnn.heap import anonymous_resident_bytes, release_retained_memory, retain_freed_memory
        retain_freed_memory()
        block = np.ones(1 << 27, dtype=np.float32)
        del block
        held = anonymous_resident_bytes()
        kept = not release_retained_memory(held + (1 << 30)) and anonymous_resident_bytes() >= held - (1 << 20)
        trimmed = release_retained_memory(1 << 20) and anonymous_resident_bytes() < held - (1 << 28)
        print(kept, trimmed, release_retained_memory(None))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "False"]

"""Importing hydra-data costs nothing until a name is used; Warp's no-driver line is dropped on CPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, **kwargs
    )


def test_import_and_schema_load_no_torch_and_functions_keep_their_names():
    out = _run(
        """
        import sys
        import hydragnn.data as hd
        from hydragnn.data import Schema, SchemaError
        assert "torch" not in sys.modules and "torch_geometric" not in sys.modules, "heavy import"
        import hydragnn.data.prepare, hydragnn.data.io.download  # submodules named like their functions
        assert callable(hd.prepare) and callable(hd.download), (hd.prepare, hd.download)
        assert set(hd.__all__) <= set(dir(hd))
        print("ok")
        """
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_warp_cuda_notice_is_dropped_and_the_rest_of_stderr_kept(tmp_path):
    (tmp_path / "noisy_warp_init.py").write_text(
        "import os\n"
        "os.write(2, b'before\\nWarp CUDA warning: Could not find or load the NVIDIA CUDA driver. GPU execution will "
        "not be available.\\nafter\\n')\n"
    )
    out = _run(
        """
        import torch
        from hydragnn.data.neighbors.warp_import import import_without_cuda_notice
        assert not torch.cuda.is_available()
        import_without_cuda_notice("noisy_warp_init")
        """,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Warp CUDA warning" not in out.stderr
    assert "before\n" in out.stderr and "after\n" in out.stderr

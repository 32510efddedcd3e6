"""``import hydragnn.infer`` (and the layers below) loads no torch until a name is used."""

from __future__ import annotations

import subprocess
import sys


def test_import_loads_nothing_heavy_until_a_name_is_used():
    code = (
        "import sys\n"
        "import hydragnn.infer, hydragnn.models\n"
        "heavy = [m for m in ('torch', 'torch_geometric', 'warp', 'nvalchemiops') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from hydragnn.infer import HydraCalculator\n"
        "assert 'torch' in sys.modules and HydraCalculator.__name__ == 'HydraCalculator'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]

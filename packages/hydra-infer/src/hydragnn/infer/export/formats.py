"""The traced graph written as a file that runs without hydragnn: AOTInductor, TorchScript, metatomic.

Every format stores the same metadata (:func:`metadata`, JSON): the AOTInductor package in its
``aot_inductor.metadata`` (``loaded.get_metadata()["hydragnn"]``), TorchScript as the extra file
``hydragnn.json``, metatomic in the model's ``ModelMetadata.extra["hydragnn"]``. Loaders for each
format live in :mod:`.runtime` (one function per format, so a new format registers its writer
here and its loader there).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, BinaryIO

import torch

from hydragnn.data.pyg_compat import torchscript_quietly

from .graph import INPUT_NAMES

METADATA_KEY = "hydragnn"
"""Where each format keeps :func:`metadata`."""


def metadata(**facts: Any) -> dict[str, Any]:
    """The facts a user of the file needs, stored in every format (JSON-serialisable)."""
    return {
        "format_version": 1,
        "inputs": list(INPUT_NAMES),
        "neighbor_list": "full; edge_index = (i, j), vector = positions[j] - positions[i] + cell_shifts @ cell",
        "units": {
            "length": "Angstrom",
            "energy": "eV",
            "forces": "eV/Angstrom",
            "stress": "eV/Angstrom^3",
            "virial": "eV",
        },
        **facts,
    }


def write_aoti(
    gm: torch.fx.GraphModule, example: tuple[torch.Tensor, ...], path: Path | BinaryIO, meta: dict[str, Any]
) -> None:
    """``torch.export`` of ``gm`` with symbolic atom and edge counts, compiled by AOTInductor to ``path``
    (a ``.pt2`` file or a binary file object).

    On CPU the C++ code generator's vectorised scatter-add fails an assertion (torch 2.13), so the
    CPU build is scalar (``cpp.simdlen = 1``); CUDA builds keep the default.
    """
    from torch.export import Dim

    atoms, edges = Dim("atoms", min=2), Dim("edges", min=2)
    dynamic = ({0: atoms}, {0: atoms}, None, None, {1: edges}, {0: edges})
    configs: dict[str, Any] = {"aot_inductor.metadata": {METADATA_KEY: json.dumps(meta)}}
    if example[0].device.type == "cpu":
        configs["cpp.simdlen"] = 1
    with warnings.catch_warnings():  # torch 2.13 copies its own pytree specs with a deprecated check
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
        program = torch.export.export(gm, example, dynamic_shapes=dynamic, strict=False)
        target = str(path) if isinstance(path, Path) else path
        torch._inductor.aoti_compile_and_package(program, package_path=target, inductor_configs=configs)


def scriptable(gm: torch.fx.GraphModule) -> torch.jit.ScriptModule:
    """``torch.jit.script`` of a ``make_fx`` graph.

    TorchScript knows neither symbolic-size ops nor op overloads: ``sym_size`` / ``sym_numel`` /
    ``sym_stride`` become ``size`` / ``numel`` / ``stride`` and every ``aten.op.overload`` its
    packet ``aten.op``, which TorchScript resolves by schema; the computation is unchanged.
    """
    renamed = {
        torch.ops.aten.sym_size.int: torch.ops.aten.size.int,
        torch.ops.aten.sym_numel.default: torch.ops.aten.numel.default,
        torch.ops.aten.sym_stride.int: torch.ops.aten.stride.int,
    }
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        target = renamed.get(node.target, node.target)
        if isinstance(target, torch._ops.OpOverload):
            target = target.overloadpacket
        node.target = target
    gm.graph.lint()
    gm.recompile()
    with torchscript_quietly(), warnings.catch_warnings():
        # GraphModule's own attribute annotations, harmless to the script
        warnings.filterwarnings("ignore", message="The TorchScript type system doesn't support instance-level")
        return torch.jit.script(gm)


def write_torchscript(gm: torch.fx.GraphModule, path: Path | BinaryIO, meta: dict[str, Any]) -> None:
    """The scripted graph (:func:`scriptable`) to ``path`` (a file or a binary file object), metadata
    as the extra file ``hydragnn.json``."""
    script = scriptable(gm)
    with torchscript_quietly():
        target = str(path) if isinstance(path, Path) else path
        torch.jit.save(script, target, _extra_files={f"{METADATA_KEY}.json": json.dumps(meta)})


FORMATS: dict[str, dict[str, Any]] = {
    "aoti": {"suffix": ".pt2", "gradients": True, "extra": None},
    "torchscript": {"suffix": ".pt", "gradients": True, "extra": None},
    "metatomic": {"suffix": ".pt", "gradients": False, "extra": "metatomic"},
}
"""Format name -> ``suffix`` (the usual file suffix), ``gradients`` (forces and stress in the graph,
else taken by the engine's autograd) and ``extra`` (the hydra-infer extra it needs)."""

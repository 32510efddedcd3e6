"""The TorchScript module inside an exported metatomic file (imported only to export one).

No ``from __future__ import annotations`` here: metatomic checks ``forward``'s annotations as
types, and TorchScript compiles them.
"""

from typing import Dict, List, Optional  # noqa: UP035 (TorchScript reads these)

import torch

from .pyg_patch import pyg_index_select_restored

with pyg_index_select_restored():
    from metatensor.torch import Labels, TensorBlock, TensorMap  # pyright: ignore[reportAttributeAccessIssue]  # defined when the optional metatensor-torch library loads
    from metatomic.torch import ModelOutput, NeighborListOptions, System


class HydraGNNMetatomic(torch.nn.Module):
    """Energies of structures from an exported graph (:mod:`..graph`, ``gradients=False``) and the
    engine's full neighbour list; per atom when the model has per-atom energies.

    Args:
        graph: the scripted energy graph.
        cutoff: the model's cutoff (Å), the neighbour list requested from the engine.
        per_atom: the graph returns ``atomic_energy [N]`` (per-atom output and ``selected_atoms``).
    """

    def __init__(self, graph: torch.jit.ScriptModule, cutoff: float, per_atom: bool) -> None:
        super().__init__()
        self.graph = graph
        self.per_atom = per_atom
        self.neighbors = NeighborListOptions(cutoff=cutoff, full_list=True, strict=True, requestor="hydragnn")

    def requested_neighbor_lists(self) -> List[NeighborListOptions]:  # noqa: UP006
        return [self.neighbors]

    def forward(
        self,
        systems: List[System],  # noqa: UP006
        outputs: Dict[str, ModelOutput],  # noqa: UP006
        selected_atoms: Optional[Labels] = None,  # noqa: UP045
    ) -> Dict[str, TensorMap]:  # noqa: UP006
        if "energy" not in outputs:
            return {}
        atom_level = outputs["energy"].sample_kind == "atom"
        if (atom_level or selected_atoms is not None) and not self.per_atom:
            raise ValueError("hydragnn: this model has no per-atom energies (per-atom output or selected_atoms)")
        device = systems[0].positions.device if len(systems) > 0 else torch.device("cpu")
        values: List[torch.Tensor] = []  # noqa: UP006
        samples: List[torch.Tensor] = []  # noqa: UP006
        for index, system in enumerate(systems):
            pairs = system.get_neighbor_list(self.neighbors).samples.values
            out = self.graph(
                system.positions,
                system.types.to(torch.long),
                system.cell,
                system.pbc,
                pairs[:, 0:2].T.contiguous().to(torch.long),
                pairs[:, 2:5].to(system.positions.dtype),
            )
            n = system.positions.shape[0]
            atoms = torch.arange(n, device=device)
            if self.per_atom:
                atomic = out["atomic_energy"].reshape(n, 1)
                if selected_atoms is not None:
                    chosen = selected_atoms.values
                    atoms = chosen[chosen[:, 0] == index][:, 1].to(torch.long)
                    atomic = atomic.index_select(0, atoms)
                if atom_level:
                    values.append(atomic)
                    samples.append(torch.stack([torch.full_like(atoms, index), atoms], dim=1))
                else:
                    values.append(atomic.sum(0, keepdim=True))
                    samples.append(torch.tensor([[index]], device=device))
            else:
                values.append(out["energy"].reshape(1, 1))
                samples.append(torch.tensor([[index]], device=device))
        names = ["system", "atom"] if atom_level else ["system"]
        if len(values) > 0:
            energies = torch.cat(values)
            sample_values = torch.cat(samples).to(torch.int32)
        else:
            energies = torch.zeros(0, 1, device=device)
            sample_values = torch.zeros(0, len(names), dtype=torch.int32, device=device)
        block = TensorBlock(
            values=energies,
            samples=Labels(names, sample_values),
            components=[],
            properties=Labels(["energy"], torch.tensor([[0]], device=device)),
        )
        return {"energy": TensorMap(Labels(["_"], torch.tensor([[0]], device=device)), [block])}

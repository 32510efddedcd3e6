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


def _tensor_map(
    values: list[torch.Tensor], samples: list[torch.Tensor], names: list[str], name: str, device: torch.device
) -> TensorMap:  # noqa: UP006
    """One block of ``[rows, 1]`` values with their sample labels (``names``), property ``name``."""
    if len(values) > 0:
        stacked = torch.cat(values)
        sample_values = torch.cat(samples).to(torch.int32)
    else:
        stacked = torch.zeros(0, 1, device=device)
        sample_values = torch.zeros(0, len(names), dtype=torch.int32, device=device)
    block = TensorBlock(
        values=stacked,
        samples=Labels(names, sample_values),
        components=[],
        properties=Labels([name], torch.tensor([[0]], device=device)),
    )
    return TensorMap(Labels(["_"], torch.tensor([[0]], device=device)), [block])


class HydraGNNMetatomic(torch.nn.Module):
    """Energies of structures from an exported graph (:mod:`..graph`, ``gradients=False``) and the
    engine's full neighbour list; per atom when the model has per-atom energies. Exported from a
    committee with ``uncertainty``, also ``energy_uncertainty``: the members' standard deviation of
    each atom's energy (per atom) or of the structure's energy.

    Args:
        graph: the scripted energy graph.
        cutoff: the model's cutoff (Å), the neighbour list requested from the engine.
        per_atom: the graph returns ``atomic_energy [N]`` (per-atom output and ``selected_atoms``).
        uncertainty: the graph returns ``energy_uncertainty []`` (and, per atom,
            ``atomic_energy_uncertainty [N]``).
    """

    def __init__(self, graph: torch.jit.ScriptModule, cutoff: float, per_atom: bool, uncertainty: bool = False) -> None:
        super().__init__()
        self.graph = graph
        self.per_atom = per_atom
        self.uncertainty = uncertainty
        self.neighbors = NeighborListOptions(cutoff=cutoff, full_list=True, strict=True, requestor="hydragnn")

    def requested_neighbor_lists(self) -> List[NeighborListOptions]:  # noqa: UP006
        return [self.neighbors]

    def forward(
        self,
        systems: List[System],  # noqa: UP006
        outputs: Dict[str, ModelOutput],  # noqa: UP006
        selected_atoms: Optional[Labels] = None,  # noqa: UP045
    ) -> Dict[str, TensorMap]:  # noqa: UP006
        want: List[str] = []  # noqa: UP006
        for name in ["energy", "energy_uncertainty"]:
            if name in outputs:
                want.append(name)
        if "energy_uncertainty" in want and not self.uncertainty:
            raise ValueError("hydragnn: this file has no energy_uncertainty (export a committee with uncertainty)")
        if len(want) == 0:
            return {}
        atom_level: Dict[str, bool] = {}  # noqa: UP006
        for name in want:
            atom_level[name] = outputs[name].sample_kind == "atom"
            if (atom_level[name] or selected_atoms is not None) and not self.per_atom:
                raise ValueError("hydragnn: this model has no per-atom energies (per-atom output or selected_atoms)")
        device = systems[0].positions.device if len(systems) > 0 else torch.device("cpu")
        values: Dict[str, List[torch.Tensor]] = {}  # noqa: UP006
        samples: Dict[str, List[torch.Tensor]] = {}  # noqa: UP006
        for name in want:
            values[name] = []
            samples[name] = []
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
            if selected_atoms is not None:
                chosen = selected_atoms.values
                atoms = chosen[chosen[:, 0] == index][:, 1].to(torch.long)
            for name in want:
                if self.per_atom:
                    key = "atomic_energy" if name == "energy" else "atomic_energy_uncertainty"
                    atomic = out[key].reshape(n, 1).index_select(0, atoms)
                    if atom_level[name]:
                        values[name].append(atomic)
                        samples[name].append(torch.stack([torch.full_like(atoms, index), atoms], dim=1))
                        continue
                    if name == "energy":
                        values[name].append(atomic.sum(0, keepdim=True))
                        samples[name].append(torch.tensor([[index]], device=device))
                        continue
                values[name].append(out[name].reshape(1, 1))
                samples[name].append(torch.tensor([[index]], device=device))
        result: Dict[str, TensorMap] = {}  # noqa: UP006
        for name in want:
            names = ["system", "atom"] if atom_level[name] else ["system"]
            result[name] = _tensor_map(values[name], samples[name], names, name, device)
        return result

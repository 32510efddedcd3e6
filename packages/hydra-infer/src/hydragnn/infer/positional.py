"""Positional encodings of a calculator batch, computed per structure (models with ``pe_dim > 0``)."""

from __future__ import annotations

import torch


def positional_encodings(
    edge_index: torch.Tensor, node_batch: torch.Tensor, counts: torch.Tensor, pe_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``lap_pe``, ``rw_pe`` ``[N, pe_dim]`` of a batch, structure by structure (as hydra-data
    computes them for one prepared graph: the Laplacian of a batch is block-diagonal, and its
    eigenvectors would mix structures with equal spectra)."""
    import hydragnn.data.pyg_import  # noqa: F401 (PyG as HydraGNN needs it)

    from torch_geometric.data import Data

    from hydragnn.data.positional import add_positional_encodings

    device = edge_index.device
    ei, nb = edge_index.cpu(), node_batch.cpu()
    starts = torch.cumsum(counts.cpu(), 0) - counts.cpu()
    owner = nb[ei[0]]
    lap, rw = [], []
    for g, (start, n) in enumerate(zip(starts.tolist(), counts.cpu().tolist())):
        if n == 0:
            continue
        local = ei[:, owner == g] - start
        pe = add_positional_encodings(Data(edge_index=local, num_nodes=n), pe_dim)
        lap.append(pe.lap_pe)
        rw.append(pe.rw_pe)
    return torch.cat(lap).to(device), torch.cat(rw).to(device)

"""Positional encodings (hydragnn.data.positional): Laplacian eigenvectors against closed forms
for path and ring graphs, random-walk encodings against brute-force matrix powers, padding of
small graphs, isolated nodes, merged periodic images and input errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.data import Data

from hydragnn.data import DataError, add_positional_encodings
from hydragnn.data.positional import laplacian_pe, random_walk_pe


def _path(n: int) -> torch.Tensor:
    i = torch.arange(n - 1)
    return torch.stack([i, i + 1])  # one direction only: symmetrised inside


def _ring(n: int) -> torch.Tensor:
    i = torch.arange(n)
    j = (i + 1) % n
    return torch.cat([torch.stack([i, j]), torch.stack([j, i])], dim=1)


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm()


def test_path_graph_eigenvectors_match_closed_form():
    n, k = 7, 4
    pe = laplacian_pe(_path(n), n, k)
    # L_sym = D^-1/2 (D - A) D^-1/2 of a path: u_k = D^1/2 cos(pi k i / (n - 1)), eigenvalue 1 - cos(pi k / (n - 1))
    deg = torch.full((n,), 2.0, dtype=torch.float64)
    deg[0] = deg[-1] = 1.0
    i = torch.arange(n, dtype=torch.float64)
    for col in range(k):
        expected = _unit(deg.sqrt() * torch.cos(math.pi * (col + 1) * i / (n - 1)))
        got = pe[:, col]
        torch.testing.assert_close(got.abs(), expected.abs(), rtol=0, atol=1e-10)
        assert abs(float(got @ expected)) == pytest.approx(1.0, abs=1e-10)
        assert got.norm() == pytest.approx(1.0, abs=1e-12)


def test_ring_eigenvectors_span_the_known_eigenspaces_and_signs_are_deterministic():
    n = 8
    pe = laplacian_pe(_ring(n), n, n - 1)
    theta = 2 * math.pi * torch.arange(n, dtype=torch.float64) / n
    for col, freq in ((0, 1), (1, 1), (2, 2), (3, 2)):  # degenerate pairs cos / sin
        basis = torch.stack([_unit(torch.cos(freq * theta)), _unit(torch.sin(freq * theta))], dim=1)
        v = pe[:, col]
        assert (basis.T @ v).norm() == pytest.approx(1.0, abs=1e-9), f"column {col} leaves the frequency-{freq} space"
    # the highest frequency (eigenvalue 2) is simple: alternating signs, first entry positive by the convention
    expected = torch.tensor([(-1.0) ** j for j in range(n)], dtype=torch.float64) / math.sqrt(n)
    torch.testing.assert_close(pe[:, -1], expected, rtol=0, atol=1e-10)
    again = laplacian_pe(_ring(n).flip(1), n, n - 1)
    torch.testing.assert_close(again[:, -1], expected, rtol=0, atol=1e-10)


def test_sign_convention_largest_entry_positive():
    g = torch.Generator().manual_seed(0)
    n = 12
    edge_index = torch.randint(0, n, (2, 30), generator=g)
    pe = laplacian_pe(edge_index, n, 5)
    for col in range(5):
        v = pe[:, col]
        assert v[v.abs().argmax()] > 0


def test_random_walk_matches_brute_force_matrix_powers():
    g = torch.Generator().manual_seed(1)
    n, k = 9, 5
    edge_index = torch.randint(0, n - 1, (2, 20), generator=g)  # node n-1 stays isolated
    edge_index = torch.cat([edge_index, edge_index[:, :5]], dim=1)  # duplicates
    adj = torch.zeros(n, n, dtype=torch.float64)
    for s, d in edge_index.T.tolist():
        if s != d:
            adj[s, d] = adj[d, s] = 1.0
    deg = adj.sum(1)
    walk = torch.zeros_like(adj)
    nz = deg > 0
    walk[nz] = adj[nz] / deg[nz, None]
    expected = torch.stack([torch.diagonal(torch.linalg.matrix_power(walk, p)) for p in range(1, k + 1)], dim=1)
    got = random_walk_pe(edge_index, n, k)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert torch.all(got[n - 1] == 0), "an isolated node has no return probability"
    # a 2-step walk on an edge always returns when the nodes have degree 1: check on a path of 2
    torch.testing.assert_close(random_walk_pe(_path(2), 2, 2)[:, 1], torch.ones(2, dtype=torch.float64))


def test_small_graphs_are_zero_padded_and_isolated_nodes_are_finite():
    data = Data(x=torch.zeros(3, 1), edge_index=_path(3))
    out = add_positional_encodings(data, 5)
    assert out.lap_pe.shape == (3, 5) and out.rw_pe.shape == (3, 5)
    assert out.lap_pe.dtype == torch.float32 and out.rw_pe.dtype == torch.float32
    assert torch.all(out.lap_pe[:, 2:] == 0) and torch.all(out.lap_pe[:, :2].abs().sum(0) > 0)
    assert not hasattr(data, "lap_pe") or data.lap_pe is None, "the input must not be modified"
    lonely = add_positional_encodings(Data(x=torch.zeros(4, 1), edge_index=torch.zeros(2, 0, dtype=torch.long)), 3)
    assert torch.isfinite(lonely.lap_pe).all() and torch.all(lonely.rw_pe == 0)


def test_periodic_images_and_self_images_are_merged():
    ring = _ring(5)
    # the same pairs again (other periodic images) plus every atom's own image
    loops = torch.arange(5).repeat(2, 1)
    noisy = torch.cat([ring, ring.flip(0), loops], dim=1)
    a = add_positional_encodings(Data(x=torch.zeros(5, 1), edge_index=ring), 4)
    b = add_positional_encodings(Data(x=torch.zeros(5, 1), edge_index=noisy), 4)
    torch.testing.assert_close(b.rw_pe, a.rw_pe)
    torch.testing.assert_close(b.lap_pe.abs(), a.lap_pe.abs(), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("data", "pe_dim", "match"),
    [
        (Data(x=torch.zeros(3, 1)), 2, "no 'edge_index'"),
        (Data(x=torch.zeros(3, 1), edge_index=_path(3)), 0, "positive int"),
        (Data(x=torch.zeros(3, 1), edge_index=_path(3)), True, "positive int"),
        (Data(x=torch.zeros(3, 1), edge_index=torch.tensor([[0, 1], [1, 3]])), 2, r"outside \[0, 3\)"),
        (Data(x=torch.zeros(3, 1), edge_index=torch.zeros(3, 2, dtype=torch.long)), 2, r"\[2, E\]"),
        (Data(x=torch.zeros(3, 1), edge_index=_path(3).float()), 2, "integer"),
    ],
)
def test_bad_inputs_raise_clear_errors(data, pe_dim, match):
    with pytest.raises(DataError, match=match):
        add_positional_encodings(data, pe_dim)

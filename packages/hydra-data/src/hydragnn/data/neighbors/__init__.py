"""Neighbour lists: radius graphs, periodic and batched, and the edges of a sample.

``from hydragnn.data.neighbors import radius_graph, add_edges, add_edges_many,
brute_force_radius_graph``; each name loads its module on first use (PEP 562), so importing one
submodule does not load the others. The modules:

- :mod:`.search`: :func:`radius_graph`, :func:`add_edges`, :func:`add_edges_many` (nvalchemi's
  batched searches, or the brute force for small searches) and their tuning constants;
- :mod:`.inputs`: validation and normalisation of the arguments, shared by every backend;
- :mod:`.brute_force`: the one definition of an edge (``finalize_edges``) and the brute-force
  radius graph every backend is checked against;
- :mod:`.warp`: nvalchemi-toolkit-ops' searches through its core Warp launchers on torch buffers;
- :mod:`.warp_import`: importing nvalchemi-toolkit-ops (and Warp) lazily, without Warp's CUDA
  notice on CPU.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .brute_force import brute_force_radius_graph
    from .search import add_edges, add_edges_many, radius_graph

# public name -> submodule defining it
_LAZY: dict[str, str] = {
    "add_edges": "search",
    "add_edges_many": "search",
    "brute_force_radius_graph": "brute_force",
    "radius_graph": "search",
}

__all__ = ["add_edges", "add_edges_many", "brute_force_radius_graph", "radius_graph"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

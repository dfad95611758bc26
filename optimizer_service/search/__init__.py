"""The strategy space and its search.

    from optimizer_service.search import search
    result = search(graph, resources, time_budget_s=2.0, max_candidates=20000, top_k=5, seed=0)

`space_size(graph, resources)` reports how large the space is and what each knob adds. The search
always includes every pre-built strategy, never returns one predicted slower than the best of them,
and leaves lossy compression and asynchronous consistency out unless the caller allows them.
`docs/search.md` describes the space, the moves and the budgets.
"""

from optimizer_service.search.answer import SearchResult
from optimizer_service.search.driver import SearchCancelled, search
from optimizer_service.search.evaluate import SearchProgress
from optimizer_service.search.meshes import MeshChoice
from optimizer_service.search.space import SearchOptions, SpaceSize, space_size

__all__ = [
    "MeshChoice",
    "SearchCancelled",
    "SearchOptions",
    "SearchProgress",
    "SearchResult",
    "SpaceSize",
    "search",
    "space_size",
]

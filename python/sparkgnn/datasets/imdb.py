"""IMDB (the GTN/HAN movie graph) from the Parquet files bundled with graphdatascience 2.2.

Vertices (12772, ids 0..12771 as in the files): 2939 movies with a genre label (y = 0..2),
1722 movies without one, 2270 directors, 5841 actors (ids: movies < 4661, directors 4661..6930,
actors >= 6931). Every vertex has the 1256-d binary `plot_keywords` vector as x (float32).
Unlabelled vertices have y = -1 and are in no split.

Edges: the files hold director -> movie (directed_in, 4661) and actor -> movie (acted_in, 13983),
the direction that carries information INTO the labelled movies. With `reverse=True` (default)
movie -> director and movie -> actor are added too (37288 edges in all), so a 2-layer GNN sees
the movie-actor-movie and movie-director-movie paths (the metapaths GTN and HAN use on this
graph); a 1-layer model would otherwise never let directors or actors hear from movies.

Split (seeded): fractions of the 2939 labelled movies, 60% / 20% / 20% by default.

Typed (`load_imdb_typed`, `python -m sparkgnn.datasets imdb --typed`): the same files with their
real types, ids as in the files: `movie` (4661, labels and split as above: the same movies get
the same split for the same seed), `director` (2270) and `actor` (5841), all with the 1256-d
x; edge types (director, directed_in, movie) and (actor, acted_in, movie), and with
`reverse=True` (movie, rev_directed_in, director) and (movie, rev_acted_in, actor) (PyG's
ToUndirected names).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkgnn.datasets.bundled import resource_path
from sparkgnn.datasets.edges import with_reverse
from sparkgnn.datasets.splits import make_split
from sparkgnn.graph import GraphData
from sparkgnn.graph.checks import vector_column
from sparkgnn.graph.problems import raise_if_any
from sparkgnn.graph.typed import TypedEdges, TypedGraphData, node_table

# file stem -> whether its rows carry a `genre` label
NODE_FILES = {"movies_with_genre": True, "movies_without_genre": False, "directors": False, "actors": False}
EDGE_FILES = ("directed_in", "acted_in")


def _nodes(stem: str, labelled: bool) -> pa.Table:
    table = pq.read_table(resource_path("imdb", f"imdb_{stem}.parquet.gzip"))
    y = table.column("genre").cast(pa.int64()) if labelled else pa.array(np.full(table.num_rows, -1, np.int64))
    return pa.table({"id": table.column("nodeId"), "x": table.column("plot_keywords"), "y": y})


def load_imdb(
    seed: int = 0, reverse: bool = True, train: float = 0.6, val: float = 0.2, test: float = 0.2
) -> GraphData:
    nodes = pa.concat_tables([_nodes(stem, labelled) for stem, labelled in NODE_FILES.items()])
    ids = nodes.column("id").to_numpy()
    x, problems = vector_column(ids, nodes.column("x"))
    raise_if_any(problems, "imdb")
    y = nodes.column("y").to_numpy()
    rels = [
        pq.read_table(resource_path("imdb", f"imdb_{stem}.parquet.gzip"), columns=["sourceNodeId", "targetNodeId"])
        for stem in EDGE_FILES
    ]
    src = np.concatenate([r.column("sourceNodeId").to_numpy() for r in rels])
    dst = np.concatenate([r.column("targetNodeId").to_numpy() for r in rels])
    if reverse:
        src, dst = with_reverse(src, dst)
    split = make_split(y, seed=seed, train=train, val=val, test=test)
    return GraphData.from_edge_ids(ids, x, src, dst, y=y, split=split, name="imdb")


# node type -> file stems (in order) and edge file -> its edge type
TYPED_NODE_FILES = {
    "movie": ("movies_with_genre", "movies_without_genre"),
    "director": ("directors",),
    "actor": ("actors",),
}
TYPED_EDGE_FILES = {"directed_in": ("director", "directed_in", "movie"), "acted_in": ("actor", "acted_in", "movie")}


def load_imdb_typed(
    seed: int = 0, reverse: bool = True, train: float = 0.6, val: float = 0.2, test: float = 0.2
) -> TypedGraphData:
    """IMDB with its node types and relations (see module doc)."""
    nodes = {}
    for node_type, stems in TYPED_NODE_FILES.items():
        table = pa.concat_tables([_nodes(stem, NODE_FILES[stem]) for stem in stems])
        ids = table.column("id").to_numpy()
        x, problems = vector_column(ids, table.column("x"))
        raise_if_any(problems, f"imdb/{node_type}")
        if node_type == "movie":
            y = table.column("y").to_numpy()
            split = make_split(y, seed=seed, train=train, val=val, test=test)
            nodes[node_type] = node_table(ids, x, y=y, split=split, name=f"imdb/{node_type}")
        else:
            nodes[node_type] = node_table(ids, x, name=f"imdb/{node_type}")
    edges = {}
    for stem, edge_type in TYPED_EDGE_FILES.items():
        rels = pq.read_table(
            resource_path("imdb", f"imdb_{stem}.parquet.gzip"), columns=["sourceNodeId", "targetNodeId"]
        )
        src, dst = rels.column("sourceNodeId").to_numpy(), rels.column("targetNodeId").to_numpy()
        edges[edge_type] = TypedEdges(src, dst)
    if reverse:  # after the forward types, where PyG's ToUndirected puts them
        for (s, rel, d), e in list(edges.items()):
            edges[(d, f"rev_{rel}", s)] = TypedEdges(e.dst, e.src)
    return TypedGraphData(nodes, edges, name="imdb").validate()

"""LastFM (HetRec 2011) as a typed graph, from the Parquet files bundled with graphdatascience 2.2.

Node types (ids as in the files): `user` (1892, ids 2..2100) and `artist` (18022, ids 10001..28745);
neither carries features or labels (a typed graph's node types may have none). Edge types:
(user, is_friend, user) (12717 friendships, one row per pair as in the file), (user, listens_to,
artist) with the play count as a float32 weight (92834), and (user, tagged, artist) (186479 tag
assignments, several per pair: parallel edges). With `reverse=True` (default) (artist,
rev_listens_to, user) and (artist, rev_tagged, user) are added so messages also reach users.

The files hold no homogeneous form of this graph (no features), so it is a typed dataset only.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from sparkgnn.datasets.bundled import resource_path
from sparkgnn.graph.typed import TypedEdges, TypedGraphData, node_table

NODE_FILES = {"user": "user_nodes", "artist": "artist_nodes"}
# file stem -> (edge type, weight column or None)
EDGE_FILES = {
    "user_friend_df_directed": (("user", "is_friend", "user"), None),
    "user_listen_artist_rels": (("user", "listens_to", "artist"), "weight"),
    "user_tag_artist_rels": (("user", "tagged", "artist"), None),
}


def load_lastfm_typed(reverse: bool = True) -> TypedGraphData:
    """LastFM with its node types and relations (see module doc)."""
    nodes = {
        node_type: node_table(
            pq.read_table(resource_path("lastfm", f"{stem}.parquet.gzip"), columns=["nodeId"])
            .column("nodeId")
            .to_numpy(),
            name=f"lastfm/{node_type}",
        )
        for node_type, stem in NODE_FILES.items()
    }
    edges = {}
    for stem, (edge_type, weight_column) in EDGE_FILES.items():
        columns = ["sourceNodeId", "targetNodeId"] + ([weight_column] if weight_column else [])
        rels = pq.read_table(resource_path("lastfm", f"{stem}.parquet.gzip"), columns=columns)
        src, dst = rels.column("sourceNodeId").to_numpy(), rels.column("targetNodeId").to_numpy()
        weight = rels.column(weight_column).to_numpy().astype(np.float32) if weight_column else None
        edges[edge_type] = TypedEdges(src, dst, weight=weight)
    if reverse:  # after the forward types, where PyG's ToUndirected puts them
        for (s, rel, d), e in list(edges.items()):
            if s != d:
                edges[(d, f"rev_{rel}", s)] = TypedEdges(e.dst, e.src, weight=e.weight)
    return TypedGraphData(nodes, edges, name="lastfm").validate()

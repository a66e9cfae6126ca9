"""The product's DL worker executable (`sparkgnn-worker`): the messenger's worker loop serving
the GNN handler from sparkgnn.dl."""

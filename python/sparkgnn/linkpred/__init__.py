"""Link prediction over a model's node outputs: score given pairs (scoring.py), each source's top-k
candidates, exact (topk.py, tiles.py) or through a vector index (approx.py), and MRR / hits@K of
held-out edges (evaluate.py). The decoder is the model's own (sparkgnn.decoders), shipped to Spark
tasks as JSON + arrays (payload.py)."""
